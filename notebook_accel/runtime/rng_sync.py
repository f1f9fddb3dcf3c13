"""Making random number generators equal on every process (rank 0's state wins)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

import torch

from notebook_accel.runtime.device import device_kind, group_kind
from notebook_accel.runtime.ops import broadcast_object_list, world_size


class RNGType(str, Enum):
    """Generators ``synchronize_rng_states`` knows (the peer's names)."""

    TORCH = "torch"
    CUDA = "cuda"
    XLA = "xla"
    GENERATOR = "generator"


def broadcast_rng_state(state: torch.Tensor) -> torch.Tensor:
    """Rank 0's copy of a generator state tensor (``uint8``), on the CPU."""
    if world_size() == 1:
        return state
    return group_kind().broadcast_rng_state(state)


def synchronize_rng_state(rng_type: str | RNGType, generator: torch.Generator | None = None) -> None:
    """Give this process rank 0's state of one generator.

    Raises:
        ValueError: an unknown ``rng_type``, or ``"generator"`` without ``generator``.
    """
    try:
        kind = RNGType(rng_type)
    except ValueError:
        raise ValueError(
            f"rng_type={rng_type!r} is not valid; choose from {[t.value for t in RNGType]}"
        ) from None
    if kind is RNGType.TORCH:
        torch.set_rng_state(broadcast_rng_state(torch.get_rng_state()))
    elif kind is RNGType.CUDA:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(broadcast_rng_state(torch.cuda.get_rng_state()))
    elif kind is RNGType.GENERATOR:
        if generator is None:
            raise ValueError("rng_type='generator' needs the generator to synchronise (generator=...)")
        generator.set_state(broadcast_rng_state(generator.get_state()))
    else:  # a device kind's own generator (XLA's)
        device_kind(kind.value).synchronize_rng(broadcast_object_list)


def synchronize_rng_states(rng_types: Iterable[str | RNGType], generator: torch.Generator | None = None) -> None:
    """Give this process rank 0's state of each generator in ``rng_types``.

    Args:
        rng_types: any of ``"torch"``, ``"cuda"``, ``"xla"``, ``"generator"``.
        generator: the ``torch.Generator`` that ``"generator"`` stands for.

    Example:
        >>> synchronize_rng_states(["torch"])  # same torch.rand() on every process after this
    """
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator)
