"""Launcher backends: how workers are started and reached (see :mod:`.base` for the interface).

:func:`backend_for` is the one place that chooses a backend for a plan; adding a
backend is a module here and a line there.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from notebook_accel.launch.backends.base import Backend, WorkerGroup, WorkerHandle
from notebook_accel.machine.launch_kinds import device_launch

if TYPE_CHECKING:
    from notebook_accel.launch.planning.plan import LaunchPlan

__all__ = ["Backend", "WorkerGroup", "WorkerHandle", "backend_class", "backend_for", "where_workers_run"]


def backend_for(plan: LaunchPlan) -> Backend:
    """The backend that runs ``plan`` (a new one: :func:`backend_class`'s)."""
    return backend_class(plan)()


def backend_class(plan: LaunchPlan) -> type[Backend]:
    """The class of the backend that runs ``plan``, whose attributes say what it can do (``local``):
    Ray actors for a cluster, else the one its device's kind names (``machine.launch_kinds``:
    torch_xla's launcher for "xla", local processes otherwise)."""
    if plan.cluster is not None:
        from notebook_accel.launch.backends.cluster import ClusterBackend

        return ClusterBackend
    module, _, name = device_launch(plan.device_type).backend.partition(":")
    return getattr(importlib.import_module(module), name)


def where_workers_run(plan: LaunchPlan) -> str:
    """Where the workers of ``plan`` run, in words, as its backend says (a pool's start line)."""
    return backend_class(plan).where(plan)
