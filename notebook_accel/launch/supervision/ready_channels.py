"""Which of a launch's channels are ready, taken a bounded number at a time.

Every rank's output pipes, control pipe and exit sentinel (or, for a cluster's ranks, their
group's one inbox) are registered once; a warm pool keeps one set for its workers' lifetime
(:meth:`ReadyChannels.kept`), registering again only the ranks whose handle changed (a heal).
Events are read when the loop wakes anyway, not woken
per event (a pipe holds ~10k), so they have a selector of their own that tells which ranks have
some. A select takes at most ``MOST_READY`` channels from the kernel; what a wakeup's budget
leaves is kept, in order, and taken first by the next wakeup (before the pipes are asked
again). The supervisor reads what this says is ready.
"""

from __future__ import annotations

import contextlib
import selectors
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from notebook_accel.launch.backends.base import ChannelKeeper, WorkerHandle
from notebook_accel.launch.supervision.bounded_selector import BoundedSelector
from notebook_accel.launch.supervision.watched import Worker
from notebook_accel.launch.tuning import MOST_READY
from notebook_accel.launch.views.record import LaunchRecord

_ORDER = {"stdout": 0, "stderr": 0, "events": 0, "control": 1, "exit": 2}  # within one select


class ReadyChannels:
    """One launch's channels, for its supervisor's loop."""

    def __init__(self, by_rank: Mapping[int, Worker], record: LaunchRecord) -> None:
        self.by_rank = by_rank
        self.record = record  # a moved memory figure an inbox tells goes in at once
        self.selector = BoundedSelector()
        self.event_selector = BoundedSelector()
        self.inboxes: list[Any] = []  # the groups' inboxes (handles without descriptors)
        self.left: deque[tuple[int, str]] = deque()  # (rank, channel) a wakeup's budget left
        self.events_left: deque[int] = deque()  # the ranks whose events are left
        # rank -> (the handle its channels are of, their descriptors, its events')
        self._registered: dict[int, tuple[WorkerHandle, tuple[int, ...], int | None]] = {}
        self._keeper: ChannelKeeper | None = None  # who keeps these channels between runs

    @classmethod
    def kept(cls, keeper: ChannelKeeper | None, by_rank: Mapping[int, Worker],
             record: LaunchRecord) -> ReadyChannels:
        """The channels ``keeper`` holds from the last run on the same workers (made on the
        first), for this run's workers and record; :meth:`register` then registers only the
        ranks whose handle changed. No keeper: channels of this run only."""
        if keeper is None:
            return cls(by_rank, record)
        channels = keeper.channels
        if channels is None:
            channels = keeper.channels = cls(by_rank, record)
            channels._keeper = keeper
        channels.by_rank, channels.record = by_rank, record
        channels.left.clear()  # (what is still ready, the selectors tell again)
        channels.events_left.clear()
        return channels

    def register(self, workers: Sequence[Worker]) -> None:
        """Register every channel of ``workers`` (a group's inbox once, for all its ranks)
        that is not registered yet: a rank's channels once per handle (a replaced handle's
        are unregistered first; the kernel may have given its closed descriptors' numbers to
        the new one)."""
        for w in workers:
            kept = self._registered.get(w.rank)
            if kept is not None and kept[0] is not w.handle:  # replaced: its channels ended
                for fd in kept[1]:
                    self.unregister(fd)
                self.unregister_events(kept[2])
                del self._registered[w.rank]
        for w in workers:
            if w.rank in self._registered:
                continue
            inbox = w.handle.inbox
            self._registered[w.rank] = (w.handle, () if inbox is not None else (
                w.handle.stdout_fd, w.handle.stderr_fd, w.handle.control_fd, w.handle.sentinel),
                None if inbox is not None else w.handle.events_fd)
            if inbox is not None:  # one descriptor for the group's every channel
                if inbox not in self.selector:
                    self.selector.register(inbox, (None, "inbox"))
                    self.inboxes.append(inbox)
                continue
            self.selector.register(w.handle.stdout_fd, (w.rank, "stdout"))
            self.selector.register(w.handle.stderr_fd, (w.rank, "stderr"))
            self.selector.register(w.handle.control_fd, (w.rank, "control"))
            self.selector.register(w.handle.sentinel, (w.rank, "exit"))
            self.event_selector.register(w.handle.events_fd, w.rank)

    def unregister(self, fd: int | None) -> None:
        """Stop watching ``fd`` (a channel that ended)."""
        with contextlib.suppress(KeyError):
            self.selector.unregister(fd)

    def unregister_events(self, fd: int | None) -> None:
        with contextlib.suppress(KeyError):
            self.event_selector.unregister(fd)

    def __contains__(self, fd: int | None) -> bool:
        return fd in self.selector

    def news(self, most: int | None = MOST_READY) -> list[tuple[int, str]]:
        """The (rank, channel) pairs the inboxes have news of, at most ``most`` of each (a
        moved memory figure is taken in at once)."""
        news = []
        for inbox in self.inboxes:
            for rank, kind in inbox.take(self.by_rank, most):
                if kind == "memory":
                    self.record.ranks[rank].rss = self.by_rank[rank].handle.rss()
                else:
                    news.append((rank, kind))
        return news

    def ready(self, timeout: float) -> deque[tuple[int, str]]:
        """The (rank, channel) pairs to read, in order: what the last wakeup left first (then
        no pipe is asked), else what is ready within ``timeout`` seconds (output, then control,
        then ends). The caller pops what it reads; what it leaves is the next wakeup's."""
        fresh = [] if self.left else self.selector.select(timeout, MOST_READY)
        if self.inboxes and any(rank is None for rank, _ in fresh):  # an inbox has news
            fresh = [item for item in fresh if item[0] is not None] + self.news()
        self.left.extend(sorted(fresh, key=lambda item: _ORDER[item[1]]))
        return self.left  # (an item twice, left and news again, finds nothing the second time)

    def ready_events(self) -> deque[int]:
        """The ranks whose events are ready (those the last wakeup left first); a cluster's
        come through its inbox, with the other channels. The caller pops what it reads."""
        if self.event_selector and not self.events_left:
            self.events_left.extend(self.event_selector.select(0, MOST_READY))
        return self.events_left

    def until_ended(self, worker: Worker) -> Iterator[str]:
        """The names of an ended ``worker``'s channels (``stdout``, ``stderr``, ``control``)
        as they are ready, each until the reader unregisters it (its end), for at most its
        handle's ``end_grace`` seconds: over a network its last lines and its result may
        arrive after its end, which came on another connection."""
        handle = worker.handle
        deadline = time.monotonic() + handle.end_grace
        names = {handle.stdout_fd: "stdout", handle.stderr_fd: "stderr", handle.control_fd: "control"}
        with selectors.DefaultSelector() as ends:  # never select.select: fds may pass 1023
            for fd, name in names.items():
                if fd in self.selector:
                    ends.register(fd, selectors.EVENT_READ, name)
            while ends.get_map() and (left := deadline - time.monotonic()) > 0:
                for key, _ in ends.select(left):
                    yield key.data
                    if key.fd not in self.selector:
                        ends.unregister(key.fd)

    @property
    def busy(self) -> bool:
        """The last wakeup's budget left something ready: the next wakeup must not wait."""
        return bool(self.left or self.events_left)

    def release(self) -> None:
        """The run is over: close the channels, unless a keeper keeps them for the next."""
        if self._keeper is None:
            self.close()

    def close(self) -> None:
        self.selector.close()
        self.event_selector.close()
