"""How many collectives this worker's process groups have issued, read without blocking.

Each process group counts the collectives issued on it (its backend's sequence number,
advanced when a collective is issued, before it completes, asynchronous ones included).
Ranks whose counts differ cannot share a group safely; ranks that stop at the same
counts can. Counts are read per group by name, as every member names a group alike;
reading them is safe from any thread (a rank's main thread may be blocked inside a
collective meanwhile).
"""

from __future__ import annotations

import sys
from typing import Any

Counts = dict[str, int]  # group name -> collectives issued on it


def _groups() -> list[tuple[str, Any]]:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return []
    c10d = dist.distributed_c10d
    return [(c10d._world.pg_names.get(group, str(index)), group)
            for index, group in enumerate(list(c10d._world.pg_map))]


def _backend(group: Any) -> Any:
    """The group's backend (CPU's, else CUDA's), or None."""
    import torch

    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device))
        except RuntimeError:
            continue
    return None


def _backend_count(group: Any) -> int | None:
    backend = _backend(group)
    try:
        return None if backend is None else int(backend._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a backend that does not count
        return None


def group_counts() -> Counts | None:
    """Collectives issued per process group (None: a group that does not count them);
    empty when no group is up."""
    counts: Counts = {}
    for name, group in _groups():
        count = _backend_count(group)
        if count is None:
            return None
        counts[name] = count
    return counts


def default_count() -> int | None:
    """Collectives issued on the default group (None: no group; -1: a group that does not
    count them): what a warm pool's ``RunDone`` reports."""
    groups = _groups()
    if not groups:
        return None
    try:
        count = _backend_count(sys.modules["torch.distributed"].distributed_c10d._get_default_group())
    except Exception:  # noqa: BLE001 - unknown: the kernel then distrusts the group after a failure
        return -1
    return -1 if count is None else count


class Tally:
    """The collectives this rank has issued on some groups, summed: where it stands against a
    cut on those groups (the backends are looked up once, so counting is cheap enough to do
    at every point of the user's code while a stop is pending)."""

    def __init__(self, groups: tuple[str, ...]) -> None:
        backends = (_backend(group) for name, group in _groups() if name in groups)
        self._backends = [backend for backend in backends if backend is not None]

    def count(self) -> int:
        return sum(backend._get_sequence_number_for_group() for backend in self._backends)
