"""A run on some ranks of a pool: a rank that entered a collective of the whole process group,
which the other ranks never join, fails with the cause named (the run then stops at once)."""

from __future__ import annotations

import time
from collections.abc import Collection

from notebook_accel.launch.supervision.stack_groups import headline, stacks_text, users_part
from notebook_accel.launch.supervision.watched import Worker
from notebook_accel.launch.views.rank_ranges import ranks_text
from notebook_accel.wire import FailureRecord, Stack

AT_ONCE = "a rank waits in a collective the other ranks never join"  # why the stop cannot wait


def lone_collective(worker: Worker, stack: Stack, before: int | None, here: Collection[int],
                    world_size: int) -> FailureRecord | None:
    """``worker``'s failure when its answer ``stack`` counts more collectives of the default
    group than ``before`` the run (one it entered alone: the ranks not ``here`` never join);
    None when it did not, or it failed or ended already."""
    if (before is None or stack.collectives is None or stack.collectives <= before
            or worker.error is not None or worker.finished):
        return None
    others = [r for r in range(world_size) if r not in here]
    frames = users_part(stack.frames)
    return FailureRecord(
        rank=worker.rank, pid=worker.pid, exitcode=None, exc_type=None,
        headline=(f"entered a collective of the whole process group ({headline(frames)}), "
                  f"which {ranks_text(others)} never {'joins' if len(others) == 1 else 'join'} "
                  f"in a run on {ranks_text(here)}; "
                  "it was stopped (run collectives in a cell on every rank)"),
        traceback=stacks_text({worker.rank: stack.frames}), timestamp=time.time())
