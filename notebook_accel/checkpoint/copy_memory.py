"""Where a snapshot's host copy goes: into memory already faulted in, not fresh memory the kernel
must fault in and zero on the training path (a copy 3-4x faster on CPU here).

Each snapshot copies into the last written snapshot's copy (``spare_of``); the first, which has
none, into a copy made ahead without its values by a background thread after the first step
(``MadeAhead``). Either is kept only while it takes at most ``SPARE_SHARE`` of the host memory
still available (``fits``); else each copy is fresh.
"""

from __future__ import annotations

import threading
from typing import Any

import psutil

from notebook_accel.checkpoint import state_parts
from notebook_accel.checkpoint.host_copy import blank, host_copy
from notebook_accel.checkpoint.training_state import StateFile

# a host copy is kept for the next snapshot's copy while it takes at most this share of the host
# memory still available (the benchmark sets 0: every copy fresh)
SPARE_SHARE = 0.5


def host_copied(part: state_parts.Part, spare: dict[str, Any] | None) -> state_parts.Part:
    """``part`` with its state copied to host memory (into the same part's copy in ``spare``, a written
    snapshot's, where it matches; a staged folder is there already)."""
    if isinstance(part, StateFile):
        return StateFile(part.name, host_copy(part.obj, into=(spare or {}).get(part.name)), part.safetensors)
    if isinstance(part, state_parts.ShardedState):
        return state_parts.ShardedState(part.name, host_copy(part.state, into=(spare or {}).get(part.name)))
    return part


def spare_of(parts: list[state_parts.Part], copied_bytes: int) -> dict[str, Any] | None:
    """A written snapshot's host copy by part name, kept for the next copy where it takes at most
    ``SPARE_SHARE`` of the host memory available now (else ``None``: freed, the next copy is fresh)."""
    return _by_name(parts) if fits(copied_bytes) else None


def fits(copied_bytes: int) -> bool:
    """A host copy of ``copied_bytes`` may be kept: at most ``SPARE_SHARE`` of the memory available now."""
    return copied_bytes <= SPARE_SHARE * psutil.virtual_memory().available


def _by_name(parts: list[state_parts.Part]) -> dict[str, Any]:
    """The states of the parts held in memory, by part name (what ``host_copied``'s ``spare`` is)."""
    return {part.name: part.obj if isinstance(part, StateFile) else part.state
            for part in parts if isinstance(part, (StateFile, state_parts.ShardedState))}


class MadeAhead:
    """The first snapshot's host copy, made ahead without its values by a background thread
    (``Snapshots._blank_ahead``); ``NONE``: none (taken already, or not made here)."""

    NONE: MadeAhead

    def __init__(self, parts: list[state_parts.Part] | None) -> None:
        self._made: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None
        if parts:
            self._thread = threading.Thread(target=self._make, args=(_by_name(parts),),
                                            name="notebook_accel snapshot memory", daemon=True)
            self._thread.start()

    def _make(self, states: dict[str, Any]) -> None:
        try:
            self._made = {name: blank(state) for name, state in states.items()}
        except Exception:  # noqa: BLE001 - then the first copy goes into fresh memory, as without it
            self._made = None

    def ready(self) -> dict[str, Any] | None:
        """The copy made ahead, if it is done (not waited for: else the first copy is fresh)."""
        if self._thread is None or self._thread.is_alive():
            return None
        return self._made


MadeAhead.NONE = MadeAhead(None)
