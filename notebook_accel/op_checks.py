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

DEBUG_ENV = "NOTEBOOK_ACCEL_DEBUG_MODE"
PEER_DEBUG_ENV = "ACCELERATE_DEBUG_MODE"


class DistributedOperationException(Exception):
    """Processes called the same collective with tensors of incompatible shapes."""


def debug_enabled() -> bool:
    """Whether debug mode is on (our variable if set, else the peer's)."""
    raw = os.environ.get(DEBUG_ENV, os.environ.get(PEER_DEBUG_ENV, "0"))
    return raw.strip().lower() in ("1", "true", "yes", "on", "y", "t")


def set_debug(enabled: bool) -> None:
    """Switch debug mode for this process (and the processes it starts)."""
    os.environ[DEBUG_ENV] = "1" if enabled else "0"


def _shapes(data: Any, skip_dim: int | None) -> Any:
    from notebook_accel.ops import recursively_apply

    def one(tensor: Any) -> tuple:
        shape = list(tensor.shape)
        if skip_dim is not None and -len(shape) <= skip_dim < len(shape):
            shape[skip_dim] = "*"
        return (len(shape), tuple(shape))

    return recursively_apply(one, data)


def verify_operation(name: str, data: Any, skip_dim: int | None = None) -> None:
    """In debug mode, raise unless every process passes tensors of the same shapes (``skip_dim`` may differ).

    Raises:
        DistributedOperationException: naming the operation and each process's shapes.
    """
    if not debug_enabled() or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    if dist.get_backend() == "xla":  # torch_xla's group has no object collectives
        return
    mine = _shapes(data, skip_dim)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if any(other != mine for other in everyone):
        listing = "; ".join(f"process {r}: {s}" for r, s in enumerate(everyone))
        raise DistributedOperationException(
            f"{name}: the processes passed tensors of different shapes ({listing}); "
            "every process must call it with the same shapes"
        )
