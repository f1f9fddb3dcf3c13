"""The exception raised in the kernel when a worker fails.

Its text stays short at any scale: the root cause first, then the other ranks' failures
grouped by their headline with rank ranges (``ranks 0-511, 513-1023: stopped``), at most
``GROUPS_SHOWN`` groups; every rank's own record stays on the exception (``other_failures``).

It is also torch elastic's ``ChildFailedError`` (what the peer's ``notebook_launcher`` raises), so
``except ChildFailedError:`` around a launch keeps working. That class's module imports torch, which
``from notebook_accel import WorkerError`` must not (the kernel stays torch-free until a launch):
``WorkerError(...)`` therefore makes an instance of a subclass of both, built on the first failure
(``_with_child_failed``); a launch has imported torch by then.
"""

from __future__ import annotations

import functools
import textwrap
import time
from typing import Any

from notebook_accel.launch.views.rank_ranges import ranks_text
from notebook_accel.wire import FailureRecord

GROUPS_SHOWN = 8  # lines of "Other ranks:" before the rest is counted


def other_ranks_lines(failures: list[FailureRecord], limit: int = GROUPS_SHOWN) -> list[str]:
    """The other ranks' failures, one line per headline, most ranks first:
    ``["ranks 0-511, 513-1023: stopped", "rank 512: RuntimeError: boom"]``; past ``limit``
    groups, one line counts the rest."""
    groups: dict[str, list[int]] = {}
    for failure in failures:
        first = failure.headline.splitlines()[0] if failure.headline else "failed"
        groups.setdefault(textwrap.shorten(first, 300, placeholder=" …"), []).append(failure.rank)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), min(item[1])))
    lines = [f"{ranks_text(ranks)}: {headline}" for headline, ranks in ordered[:limit]]
    if len(ordered) > limit:
        rest = [rank for _, ranks in ordered[limit:] for rank in ranks]
        lines.append(f"{ranks_text(rest)}: {len(ordered) - limit} other kinds of failure "
                     "(each rank's record: .other_failures)")
    return lines


class WorkerError(RuntimeError):
    """A worker failed: it raised, exited without a result, was killed, or timed out.

    Attributes:
        rank: the global rank of the root-cause worker.
        exitcode: its exit status (negative: killed by that signal), or None if it
            was still running (a timeout) or was stopped by us.
        remote_traceback: the worker's own traceback text (or its stack dump on a
            timeout); empty when the worker died without one (e.g. SIGKILL).
        failure: the root cause's :class:`~notebook_accel.wire.FailureRecord` (rank,
            pid, exit code or signal, exception type, traceback, time).
        other_failures: a :class:`~notebook_accel.wire.FailureRecord` per other rank
            that failed as a consequence (or was stopped); ``str()`` of one is a short
            line, e.g. ``rank 0: stopped``. The error's own text groups them by headline.
        failures: (as torch elastic's ``ChildFailedError``, which the error also is) global
            rank -> ``ProcessFailure`` for the root cause and each other rank: its pid, exit
            code (None: stopped while still running), no error file, and as ``message`` the
            rank's traceback (else its headline); ``local_rank`` holds the global rank.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> WorkerError:
        return super().__new__(_with_child_failed() if cls is WorkerError else cls, *args, **kwargs)

    def __init__(
        self,
        message: str,
        *,
        rank: int,
        exitcode: int | None = None,
        remote_traceback: str = "",
        other_failures: list[FailureRecord] | None = None,
        failure: FailureRecord | None = None,
    ) -> None:
        super().__init__(message)
        self.recovery = ""  # what a warm pool did after the failure (healed, replaced), in words
        self.rank = rank
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback
        self.other_failures = list(other_failures or [])
        self.failure = failure if failure is not None else FailureRecord(
            rank=rank, pid=None, exitcode=exitcode, exc_type=None, headline=message,
            traceback=remote_traceback, timestamp=time.time())

    def __str__(self) -> str:
        text = super().__str__()
        if self.recovery:
            text += "\n" + self.recovery
        if self.remote_traceback:
            text += "\n\n" + self.remote_traceback.rstrip()
        if self.other_failures:
            text += "\n\nOther ranks:\n" + "\n".join(
                f"  {line}" for line in other_ranks_lines(self.other_failures))
        return text

    def __reduce__(self):
        return (_rebuild, (self.args[0], self.rank, self.exitcode, self.remote_traceback,
                           self.other_failures, self.failure), {"recovery": self.recovery})

    def _render_traceback_(self) -> list[str]:
        """IPython hook: show the worker's own frames, not the launcher's internals."""
        from notebook_accel.launch.supervision.tracebacks import with_cell_labels

        red, reset = "\x1b[31m", "\x1b[0m"
        lines = [f"{red}WorkerError{reset}: {self.args[0]}", *self.recovery.splitlines()]
        if self.remote_traceback:
            lines += ["", f"{red}[rank {self.rank}]{reset}",
                      *with_cell_labels(self.remote_traceback.rstrip()).splitlines()]
        if self.other_failures:
            lines += ["", "Other ranks:",
                      *(f"  {line}" for line in other_ranks_lines(self.other_failures))]
        notes = getattr(self, "__notes__", ())  # what a front end adds (add_note): its next step
        return lines + (["", *notes] if notes else [])


@functools.cache
def _with_child_failed() -> type[WorkerError]:
    """``WorkerError`` that is also torch elastic's ``ChildFailedError`` (plain ``WorkerError``
    where torch has no ``torch.distributed``); the name users see stays ``WorkerError``."""
    try:
        from torch.distributed.elastic.multiprocessing.errors import (
            ChildFailedError,
            ProcessFailure,
        )
    except ImportError:
        return WorkerError

    class RankFailure(ProcessFailure):
        """torch elastic's record of a failed process, made from ours: no error file, the
        rank's traceback (else its headline) as ``message``; ``exitcode`` None where the rank
        was stopped while still running."""

        @classmethod
        def of(cls, record: FailureRecord) -> RankFailure:
            failure = cls(local_rank=record.rank, pid=record.pid or 0, exitcode=record.exitcode or 0,
                          error_file="")
            failure.pid, failure.exitcode = record.pid, record.exitcode  # as observed
            failure.message = record.traceback.rstrip() or record.headline
            if record.timestamp:
                failure.timestamp = int(record.timestamp)
            return failure

        def signal_name(self) -> str:
            return "<N/A>" if self.exitcode is None else super().signal_name()

    class _ChildFailedWorkerError(WorkerError, ChildFailedError):
        name = "notebook_accel launch"  # ChildFailedError's title: "<name> FAILED"

        @property
        def failures(self) -> dict[int, RankFailure]:
            failures: dict[int, RankFailure] = {}
            for record in (self.failure, *self.other_failures):  # the root cause first
                failures.setdefault(record.rank, RankFailure.of(record))
            return failures

        def get_first_failure(self) -> tuple[int, RankFailure]:
            return self.rank, self.failures[self.rank]  # our root cause, not the earliest stamp

    _ChildFailedWorkerError.__name__ = _ChildFailedWorkerError.__qualname__ = "WorkerError"
    return _ChildFailedWorkerError


def _rebuild(message, rank, exitcode, remote_traceback, other_failures, failure=None):
    return WorkerError(message, rank=rank, exitcode=exitcode, remote_traceback=remote_traceback,
                       other_failures=other_failures, failure=failure)
