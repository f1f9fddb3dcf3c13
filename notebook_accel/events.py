"""In a worker: a fast, bounded, private event channel to the kernel.

Workers call :func:`emit` (progress, metrics...) from the training loop. Each event
is one small message of the wire protocol (:mod:`notebook_accel.wire`: its kinds,
framing and clock) written without blocking to a pipe only this launch holds;
writes of at most ``PIPE_BUF`` bytes are atomic, so a full pipe never leaves half a
message. When the pipe is full, events wait in a bounded queue
(events with the same ``key`` replace each other: a progress bar only needs its
latest state) and beyond that are dropped and counted: training never blocks.
Outside a launched worker, :func:`emit` does nothing.
"""

from __future__ import annotations

import collections
import itertools
import os
import select
import threading
import time
from typing import Any

from notebook_accel.wire import Dropped, Kind, encode, encode_data

MAX_EVENT_BYTES = select.PIPE_BUF  # atomic pipe writes
MAX_QUEUED = 10_000


class EventChannel:
    """The worker's end: non-blocking, bounded, coalescing."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self.queue: collections.OrderedDict[Any, bytes] = collections.OrderedDict()
        self.dropped = 0
        self._unkeyed = itertools.count()
        self._lock = threading.Lock()  # the GPU-memory reporter thread emits too

    def emit(self, kind: Kind | str, data: dict[str, Any], key: Any = None) -> bool:
        """Send an event of ``kind`` (stamped now); returns False when it was dropped.

        Raises:
            ValueError: ``kind`` is not a kind of event.
        """
        message = encode_data(kind, data)
        with self._lock:
            if len(message) > MAX_EVENT_BYTES:
                self.dropped += 1
                return False
            if self.queue:
                self._flush()
            if not self.queue and self._write(message):
                return True
            slot = (kind, key) if key is not None else next(self._unkeyed)
            if slot in self.queue:
                self.queue[slot] = message  # coalesce: only the latest state matters
                return True
            if len(self.queue) >= MAX_QUEUED:
                self.dropped += 1
                return False
            self.queue[slot] = message
            return True

    def _write(self, message: bytes) -> bool:
        try:
            return os.write(self.fd, message) == len(message)
        except BlockingIOError:
            return False
        except OSError:  # the kernel is gone; the watchdog ends us
            self.queue.clear()
            return True

    def _flush(self) -> None:
        while self.queue:
            slot, message = next(iter(self.queue.items()))
            if not self._write(message):
                return
            self.queue.pop(slot, None)

    def close(self, timeout: float = 2.0) -> None:
        """Deliver what is queued (waiting at most ``timeout`` s), then report drops."""
        deadline = time.monotonic() + timeout
        while self.queue and time.monotonic() < deadline:
            self._flush()
            if self.queue:
                time.sleep(0.005)
        self.dropped += len(self.queue)
        self.queue.clear()
        if self.dropped:
            self._write(encode(Dropped(self.dropped)))
            self.dropped = 0  # a pool worker's next run counts afresh


_channel: EventChannel | None = None


def install(fd: int) -> None:
    """Called once in a launched worker: events go to ``fd``."""
    global _channel
    _channel = EventChannel(fd)


def close() -> None:
    """Called when the worker's function has returned."""
    if _channel is not None:
        _channel.close()


def active() -> bool:
    """True inside a worker started by ``notebook_launcher``."""
    return _channel is not None


def emit(kind: Kind | str, data: dict[str, Any], key: Any = None) -> bool:
    """Send an event to the kernel watching this worker (no-op elsewhere).

    Args:
        kind: a kind of event, e.g. ``Kind.PROGRESS`` or ``"metrics"`` (see
            :class:`~notebook_accel.wire.Kind`; ``data`` is the message's fields).
        data: small plain data (at most a few KB pickled; bigger events are dropped).
        key: events of one ``kind`` with the same key coalesce when the pipe is full.
    Returns:
        False when the event was dropped (or there is no launcher).
    Raises:
        ValueError: in a worker, ``kind`` is not a kind of event.
    """
    return _channel.emit(kind, data, key) if _channel is not None else False
