"""The background thread that writes snapshots: one write at a time per ``Accelerator``.

Training goes on while a snapshot is written; the next snapshot waits only if the previous write is
still going (said once). A failed write (a full disk) is said and training goes on: the previous
snapshot stays the newest complete one. A worker waits for the writes in flight before it exits
(``drain``: ``launch/worker`` calls it after the user's function; ``atexit`` for scripts run by
``torchrun``), so the last snapshot of a finished run is not cut off.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import weakref
from collections.abc import Callable

_writers: weakref.WeakSet[SnapshotWriter] = weakref.WeakSet()
_atexit_registered = False


class SnapshotWriter:
    """Runs one write job at a time on a daemon thread.

    Args:
        say: how a note reaches the user (the Accelerator's ``print``, main process only); a failed
            write is said on the rank where it failed.
    """

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self._thread: threading.Thread | None = None
        self._step = 0
        self._said_wait = False
        self.last_write_s: float | None = None  # seconds the last finished write took
        self.failed: list[tuple[int, BaseException]] = []  # (step, error) of the writes that failed
        self.abandoned = threading.Event()  # set: the write in flight is left (``abandon``)
        _remember(self)

    @property
    def busy(self) -> bool:
        """A write is still going."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, step: int, job: Callable[[], None]) -> float:
        """Start writing the snapshot of ``step`` with ``job()``; returns the seconds spent waiting for
        the previous write (0 unless it was still going)."""
        waited = 0.0
        if self.busy:
            if not self._said_wait:
                self._said_wait = True
                self.say(f"snapshot step {step:,} waits for the write of step {self._step:,}, which is still "
                         "going: snapshots come faster than the disk takes them (this is said once); "
                         "snapshot less often to keep training from waiting")
            start = time.perf_counter()
            self.wait()
            waited = time.perf_counter() - start
        self._step = step
        self._thread = threading.Thread(target=self._run, args=(step, job), name=f"snapshot-{step}", daemon=True)
        self._thread.start()
        return waited

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the write in flight; returns whether none is left."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.busy

    def abandon(self) -> None:
        """Leave the write in flight to itself (a warm pool's heal: it waits for a dead rank's part,
        which never comes): its job sees ``abandoned`` set and stops where it waits; nothing waits
        for it any more (``wait``, ``drain``)."""
        self.abandoned.set()
        _writers.discard(self)

    def _run(self, step: int, job: Callable[[], None]) -> None:
        start = time.perf_counter()
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - a failed snapshot never stops training
            self.failed.append((step, exc))
            print(f"snapshot step {step:,} was not written ({type(exc).__name__}: {exc}); "
                     "the previous snapshot stays the newest, and training goes on", file=sys.stderr, flush=True)
        else:
            self.last_write_s = time.perf_counter() - start


def drain(timeout: float | None = None) -> None:
    """Wait for every writer's write in flight (at most ``timeout`` seconds each)."""
    for writer in list(_writers):
        writer.wait(timeout)


def _remember(writer: SnapshotWriter) -> None:
    global _atexit_registered
    _writers.add(writer)
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(drain)
