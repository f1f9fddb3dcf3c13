"""The root-cause verdict: which rank's failure ended the job, and the one error that says so.

A rank's own report comes first (the earliest), then a rank that ended without one (killed,
exited early, a lost node), then reports marked secondary (a peer's collective broke because
of it); ranks we stopped are listed after, not headlined.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable, Sequence

from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.launch.supervision.tracebacks import death_text
from notebook_accel.launch.supervision.watched import Worker
from notebook_accel.launch.tuning import INTERRUPT_GRACE
from notebook_accel.launch.views.record import LaunchRecord, RankState
from notebook_accel.wire import FailureRecord

ENDED_BY_US = "stopped: killed"  # the headline of a rank the stop had to end (not an outside kill)
Tail = Callable[[int], str]  # rank -> the last lines of its stderr
# the candidates' tiers, the cause from the first: a rank's own report, an end without one, a
# report marked secondary (a consequence of another's failure), a rank only marked failed
_OWN, _ENDED, _SECONDARY, _MARKED = range(4)


def root_cause(workers: Sequence[Worker], record: LaunchRecord, tail: Tail) -> WorkerError:
    """The error of a failed launch, naming the rank whose failure is the cause (also set as
    ``record.root_cause``); the others' failures, and the ranks stopped, are listed on it."""
    candidates = []
    for w in workers:
        if w.error is not None and not w.interrupted:
            tier = _SECONDARY if w.error.secondary else _OWN
            candidates.append((tier, w.error.timestamp, w))
        elif (w.exited and not (w.stopped and w.handle.describe_end() is None)
              and not (w.returned and w.exitcode == 0)):  # (a lost node's rank, even stopped)
            candidates.append((_ENDED, w.exit_time, w))
    if not candidates:  # a rank marked failed for exiting (code 0) before its result arrived
        failed = [w for w in workers if record.ranks[w.rank].state == RankState.FAILED]
        candidates = [(_MARKED, 0.0, w) for w in failed or workers]
    candidates.sort(key=lambda c: (c[0], c[1] or 0.0, c[2].rank))
    cause = candidates[0][2]
    record.root_cause = cause.rank
    failure = failure_of(cause, tail)
    others = [failure_of(w, tail) for _, _, w in candidates[1:]]
    others += [failure_of(w, tail, headline="stopped") for w in workers
               if w.interrupted and w is not cause and w.handle.describe_end() is None]
    headline = f"failed: {failure.headline}" if cause.error is not None else failure.headline
    return WorkerError(
        f"{cause.handle.label} {headline}", rank=cause.rank, exitcode=cause.exitcode,
        remote_traceback=failure.traceback, other_failures=others, failure=failure,
    )


def failure_of(worker: Worker, tail: Tail, headline: str | None = None) -> FailureRecord:
    """How ``worker`` failed: the record it sent (with the exit code seen here), else one
    made here from its exit (its traceback: the last lines of its stderr, ``tail``)."""
    if worker.error is not None and headline is None:
        if worker.exitcode is None:
            return worker.error
        return dataclasses.replace(worker.error, exitcode=worker.exitcode)
    if headline and worker.handle.persistent and worker.exited:
        headline = (f"{ENDED_BY_US}, as it did not answer the interrupt within "
                    f"{INTERRUPT_GRACE:g} s (blocked in C++ code, e.g. a collective)")
    return FailureRecord(
        rank=worker.rank, pid=worker.pid, exitcode=worker.exitcode, exc_type=None,
        headline=headline or worker.handle.describe_end() or describe_exit(worker.exitcode),
        traceback="" if headline else death_text(tail(worker.rank).splitlines()),
        timestamp=worker.exit_time or time.time(),
    )


def describe_exit(code: int | None) -> str:
    """A rank's end without a report of its own, in words (``was killed by SIGKILL``)."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    if code == 0:
        return "exited (code 0) before its function returned (os._exit() or a killed interpreter)"
    return f"exited with code {code} without reporting an error"
