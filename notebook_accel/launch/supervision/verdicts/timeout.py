"""The timeout verdict: the error of a launch that ran past ``timeout``, with where each rank
was (its main thread's stack, from the dump it wrote when the timeout hit), ranks at the same
place grouped, the biggest group first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.launch.supervision.tracebacks import main_thread_stack
from notebook_accel.launch.supervision.watched import Worker
from notebook_accel.launch.views.rank_ranges import ranks_text
from notebook_accel.launch.views.text import format_duration
from notebook_accel.wire import FailureRecord

STACKS_SHOWN = 2  # distinct stacks a timeout's error shows (the rest are counted)


def timeout_error(running: Sequence[Worker], first: Worker, dumps: Mapping[int, str],
                  elapsed: float, timeout: float, at: float) -> WorkerError:
    """The error: ``running`` were stopped ``elapsed`` seconds in (``at``: a ``time.time()``);
    ``dumps``: each running rank's stderr since its stack dump was asked; ``first``: the rank
    the error is about (the first running one)."""
    stacks: dict[str, list[int]] = {}
    for w in running:
        stacks.setdefault(main_thread_stack(dumps[w.rank]), []).append(w.rank)
    message = (f"timed out after {format_duration(elapsed)} (timeout={timeout:g} s): "
               f"{ranks_text(w.rank for w in running)} stopped while still running")
    groups = sorted(stacks.items(), key=lambda item: -len(item[1]))
    texts = [f"{ranks_text(group)} {'was' if len(group) == 1 else 'were'} here when stopped:\n"
             f"{stack}" for stack, group in groups]
    where = "\n\n".join(texts)  # every stack: kept on the error's failure record
    shown = "\n\n".join(texts[:STACKS_SHOWN])
    if len(groups) > STACKS_SHOWN:
        rest = [rank for _, group in groups[STACKS_SHOWN:] for rank in group]
        shown += (f"\n\n{ranks_text(rest)}: {len(groups) - STACKS_SHOWN} other stacks "
                  "(all in .failure.traceback)")
    failure = FailureRecord(rank=first.rank, pid=first.pid, exitcode=None, exc_type=None,
                            headline=message, traceback=where, timestamp=at)
    return WorkerError(message, rank=first.rank, remote_traceback=shown, failure=failure)
