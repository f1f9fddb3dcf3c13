"""A run on a detached pool, read from its keeper: :class:`DetachedRun` (a ``RunHandle``) and its
output read back from the keeper's rings (``output_ring.py``) from a number on: once, then live.

The pool is a :class:`~notebook_accel.launch.detached.attached.DetachedPool` (its ``_ask`` and
``_receive`` reach the keeper, by socket or Ray actor calls).
"""

from __future__ import annotations

import time
from typing import Any

from notebook_accel.launch.detached.client import KeeperGone
from notebook_accel.launch.detached.output_ring import KEEP_PER_RANK
from notebook_accel.launch.pools.run_handle import RunHandle

_POLL = 0.2  # seconds between two looks at a run's end


class _RemoteOutput:
    """A run's output in the keeper's rings, as a watcher reads a ``RunOutput``."""

    keep = KEEP_PER_RANK
    record = None

    def __init__(self, pool: Any, number: int, streaming: bool = False) -> None:
        self._pool, self._number = pool, number
        self._streaming = streaming  # its output comes on the pool's connection as it is kept
        self.ended = False
        self.count = 0
        self.dropped_lines = 0
        self.outcome: tuple[Any, BaseException | None] | None = None  # with the last read

    def leave_stream(self) -> None:
        """Stop reading the stream (its messages would be taken for answers): the connection
        is closed (the next request opens another), the rest read from the rings."""
        if self._streaming:
            self._streaming = False
            self._pool._connection.close()

    def since(self, number: int, timeout: float | None = None) -> tuple[list[tuple[str, Any]], int, int]:
        answer = None
        if self._streaming:
            try:
                answer = self._pool._receive()
            except KeeperGone:  # the keeper gave the stream up: the rest from the rings
                self._streaming = False
            except BaseException:  # (the stop button: the connection was closed)
                self._streaming = False
                raise
        if answer is None:
            answer = self._pool._ask("since", timeout=30.0, run=self._number, number=number,
                                     timeout_s=timeout)
        self.ended, self.count = answer["ended"], answer["count"]
        self.dropped_lines = answer["dropped_lines"]
        self.outcome = answer.get("outcome", self.outcome)
        if self.outcome is not None:
            self._streaming = False  # (the stream's last message: the connection is free)
        return answer["items"], answer["next"], answer["dropped"]


class DetachedRun(RunHandle):
    """A run on a detached pool, as a :class:`~notebook_accel.launch.pools.run_handle.RunHandle`:
    ``done()``, ``result()``, ``cancel()``, ``watch()`` (from its first line, once, then live;
    the stop button stops watching, not the run), ``logs(rank)``."""

    def __init__(self, pool: Any, info: dict[str, Any], streaming: bool = False) -> None:
        super().__init__(info["what"], info["advice"], _RemoteOutput(pool, info["number"],
                                                                     streaming))
        self._pool, self.number = pool, info["number"]
        self._info = info

    def _look(self) -> None:
        """Ask the keeper how the run stands; once it has ended, fetch its outcome."""
        if self._ended.is_set():
            return
        if self.output.outcome is not None:  # (it came with the output's last read)
            self._value, self._error = self.output.outcome
            self._ended.set()
            return
        info = self._pool._ask("run")
        if info is not None and info["number"] == self.number:
            self._info = info
            if not info["done"]:
                return
        value, error = self._pool._ask("outcome", run=self.number)
        self._value, self._error = value, error
        self._ended.set()

    def done(self) -> bool:
        self._look()
        return self._ended.is_set()

    def result(self, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.what} is still running after {timeout:g} s (it goes "
                                   "on); .watch() shows it live, .cancel() stops it")
            time.sleep(_POLL)
        return self._outcome()

    def cancel(self, timeout: float | None = None) -> bool:
        if self.done():
            return False
        self._pool._ask("cancel", run=self.number)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done() and (deadline is None or time.monotonic() < deadline):
            time.sleep(_POLL)
        return True

    def show(self) -> None:
        """Write the run's output in this cell from its first piece, then live, until it ends."""
        self._show_until_end()

    def _show_until_end(self) -> None:
        super()._show_until_end()
        self._look()

    def logs(self, rank: int, stream: str | None = None) -> str:
        return self._pool._ask("logs", run=self.number, rank=rank, stream=stream)

    def state(self) -> str:
        return super().state() if self.done() else self._info["state"]

    @property
    def step(self) -> int | None:
        return self._info.get("step")

    def unreported_failure(self) -> BaseException | None:
        return None  # the keeper's pool tells it (in the next call that touches the pool)
