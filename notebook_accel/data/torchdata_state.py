"""A torchdata ``StatefulDataLoader`` state, read without torchdata (the peer's ``dl_state_dict.bin``).

Our stateful loaders (``stateful``) write it, and keep our progress in it under ``PROGRESS_KEY``,
which torchdata and the peer ignore; a plain loader (``shard.DataLoaderShard``) given one takes
the batches its epoch had done.
"""

from __future__ import annotations

from typing import Any

PROGRESS_KEY = "_notebook_accel_progress"


def batches_done(state: dict[str, Any]) -> int:
    """The batches of its epoch a torchdata state had given out (one process or worker processes)."""
    if state.get("_iterator_finished", False):
        return 0
    if "_snapshot" in state:  # worker processes: the step of the last snapshot, and the steps since
        return int(state["_snapshot"]["_snapshot_step"]) + int(state.get("_steps_since_snapshot", 0))
    return int(state.get("_num_yielded", 0))


def is_torchdata_state(state: dict[str, Any]) -> bool:
    """``state`` is a torchdata loader's (not ``shard.LoaderProgress``'s)."""
    return "generator" not in state
