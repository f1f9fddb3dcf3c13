"""The exception raised in the kernel when a worker fails."""

from __future__ import annotations

import time

from notebook_accel.wire import FailureRecord


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
            line, e.g. ``rank 0: stopped``.
    """

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
        self.rank = rank
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback
        self.other_failures = list(other_failures or [])
        self.failure = failure if failure is not None else FailureRecord(
            rank=rank, pid=None, exitcode=exitcode, exc_type=None, headline=message,
            traceback=remote_traceback, timestamp=time.time())

    def __str__(self) -> str:
        text = super().__str__()
        if self.remote_traceback:
            text += "\n\n" + self.remote_traceback.rstrip()
        if self.other_failures:
            text += "\n\nOther ranks:\n" + "\n".join(f"  {line}" for line in self.other_failures)
        return text

    def __reduce__(self):
        return (_rebuild, (self.args[0], self.rank, self.exitcode, self.remote_traceback,
                           self.other_failures, self.failure))

    def _render_traceback_(self) -> list[str]:
        """IPython hook: show the worker's own frames, not the launcher's internals."""
        from notebook_accel.launch.tracebacks import with_cell_labels

        red, reset = "\x1b[31m", "\x1b[0m"
        lines = [f"{red}WorkerError{reset}: {self.args[0]}"]
        if self.remote_traceback:
            lines += ["", f"{red}[rank {self.rank}]{reset}",
                      *with_cell_labels(self.remote_traceback.rstrip()).splitlines()]
        if self.other_failures:
            lines += ["", "Other ranks:", *(f"  {line}" for line in self.other_failures)]
        return lines


def _rebuild(message, rank, exitcode, remote_traceback, other_failures, failure=None):
    return WorkerError(message, rank=rank, exitcode=exitcode, remote_traceback=remote_traceback,
                       other_failures=other_failures, failure=failure)
