"""Launcher backends: how workers are started and reached (see :mod:`.base` for the interface).

:func:`backend_for` is the one place that chooses a backend for a plan; adding a
backend is a module here and a line there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from notebook_accel.launch.backends.base import Backend, WorkerGroup, WorkerHandle

if TYPE_CHECKING:
    from notebook_accel.launch.plan import LaunchPlan

__all__ = ["Backend", "WorkerGroup", "WorkerHandle", "backend_for"]


def backend_for(plan: LaunchPlan) -> Backend:
    """The backend that runs ``plan``: Ray actors for a cluster, torch_xla's launcher for device
    "xla", else local processes."""
    if plan.cluster is not None:
        from notebook_accel.launch.backends.cluster import ClusterBackend

        return ClusterBackend()
    if plan.device_type == "xla":
        from notebook_accel.launch.backends.xla import XlaBackend

        return XlaBackend()
    from notebook_accel.launch.backends.processes import ProcessBackend

    return ProcessBackend()
