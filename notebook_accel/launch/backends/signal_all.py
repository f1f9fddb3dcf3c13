"""Signal many workers at once: one message per node where their handles share a way there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def signal_all(handles: Sequence[Any], what: str) -> None:
    """Call ``what`` (``terminate``, ``kill``, ``interrupt``, ``dump_stacks``) on every handle:
    once per node where the handles share a way (``together``: a cluster's node links, see
    :class:`~notebook_accel.launch.backends.base.Together`), else one by one."""
    shared: dict[int, tuple[Any, list[int]]] = {}
    for handle in handles:
        if handle.together is None:
            getattr(handle, what)()
        else:
            shared.setdefault(id(handle.together), (handle.together, []))[1].append(handle.rank)
    for together, ranks in shared.values():
        together.signal(ranks, what)
