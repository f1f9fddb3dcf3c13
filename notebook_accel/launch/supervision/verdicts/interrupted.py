"""What the stop button did to a launch, in the one line ``LaunchInterrupted`` says."""

from __future__ import annotations

from collections.abc import Sequence

from notebook_accel.launch.supervision.watched import Worker
from notebook_accel.launch.views.rank_ranges import ranks_text


def interrupted_line(workers: Sequence[Worker], stopped_at_once: str | None) -> str:
    """``stopped 4 workers`` (a one-off launch), or what a pool's run kept and lost
    (``stopped_at_once``: why its ranks could not stop at a common point)."""
    if not any(w.handle.persistent for w in workers):
        return f"stopped {len(workers)} workers"
    killed = [w.rank for w in workers if w.exited]
    at_once = f" ({stopped_at_once}, so every rank was stopped at once)" if stopped_at_once else ""
    if not killed:
        where = "" if stopped_at_once else " at the same point"
        return (f"interrupted the run on {len(workers)} ranks{where}{at_once}; "
                "the pool keeps its state")
    # why they had to be ended, and what it did then (healed, or replaced every rank), the
    # pool says once, above
    were = "was" if len(killed) == 1 else "were"
    return (f"interrupted the run{at_once}; {ranks_text(killed)} {were} ended; what the "
            "pool did then is said above")
