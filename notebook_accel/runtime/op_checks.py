"""Debug mode: check that every process calls a collective with matching tensor shapes.

A collective called with mismatched shapes hangs or fails deep inside the backend.
With debug mode on (``NOTEBOOK_ACCEL_DEBUG_MODE=1``, or the peer's
``ACCELERATE_DEBUG_MODE=1``, or ``state.debug = True``), ``gather``, ``reduce``,
``broadcast`` and ``pad_across_processes`` first exchange the shapes and raise
``DistributedOperationException`` naming every process's shapes. It costs one
extra object collective per call, so it is off by default.
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from notebook_accel.flags import env_flag
from notebook_accel.runtime.device import group_kind

DEBUG_ENV = "NOTEBOOK_ACCEL_DEBUG_MODE"
PEER_DEBUG_ENV = "ACCELERATE_DEBUG_MODE"


class DistributedOperationException(Exception):
    """Processes called the same collective with tensors of incompatible shapes."""


def debug_enabled() -> bool:
    """Whether debug mode is on (our variable if set, else the peer's)."""
    return env_flag(DEBUG_ENV, PEER_DEBUG_ENV)


def set_debug(enabled: bool) -> None:
    """Switch debug mode for this process (and the processes it starts)."""
    os.environ[DEBUG_ENV] = "1" if enabled else "0"


def shape_of(tensor: Any, skip_dim: int | None = None) -> tuple:
    """What must match across processes: the rank and the shape (``"*"`` at ``skip_dim``)."""
    shape = list(tensor.shape)
    if skip_dim is not None and -len(shape) <= skip_dim < len(shape):
        shape[skip_dim] = "*"
    return (len(shape), tuple(shape))


def verify_shapes(name: str, shapes: Any) -> None:
    """Raise unless every process passes the same ``shapes`` (``shape_of`` over its tensors).

    ``ops`` calls it in debug mode only, with ``shapes`` built over its nested structure.

    Raises:
        DistributedOperationException: naming the operation and each process's shapes.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    if not group_kind().checks_shapes():  # a group without torch's object collectives
        return
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, shapes)
    if any(other != shapes for other in everyone):
        listing = "; ".join(f"process {r}: {s}" for r, s in enumerate(everyone))
        raise DistributedOperationException(
            f"{name}: the processes passed tensors of different shapes ({listing}); "
            "every process must call it with the same shapes"
        )
