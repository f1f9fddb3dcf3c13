"""The kernel's end of the node links: every node's one connection, taken apart into each rank's
channels as the supervisor knows them.

Each rank gets local pipes (stdout, stderr, control, events, and a sentinel that reaches its end
of file when the rank has ended), so the supervisor, the output relay, the views and the failure
records are those of a local launch. One thread per launch reads every node's link and writes
each frame into its rank's pipe, in the link's order: a rank's ``END`` closes its channels after
the last of its bytes, then its sentinel, so the kernel never waits for a rank's last line. It
never blocks on a pipe (bytes the supervisor has not taken wait in memory; a link whose ranks
hold more than ``BACKLOG_LIMIT`` bytes is not read until they are taken). It beats on every link
each ``BEAT_EVERY`` seconds; a link that ends, or says nothing for ``SILENCE`` seconds, is a lost
node: its ranks end without an exit status, naming why.

The other way (commands, signals, a pool run once per node) is written on the link by the caller,
one writer at a time.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from notebook_accel.launch.worker.hub_link import (
    BEAT_EVERY,
    EVERY_RANK,
    EXIT,
    OUTPUTS,
    SIGNAL,
    SILENCE,
    Frame,
    FrameParser,
    frame,
)

BACKLOG_LIMIT = 32 << 20  # bytes of a node's ranks held here before its link is left unread


@dataclass
class RankEnds:
    """One rank's channels: the supervisor reads ``read``, the links' thread writes ``write``."""

    rank: int
    node: int
    read: dict[Frame, int] = field(default_factory=dict)  # OUTPUTS and END (the sentinel)
    write: dict[Frame, int] = field(default_factory=dict)
    pending: dict[Frame, bytearray] = field(default_factory=dict)  # not yet taken by a pipe
    exitcode: int | None = None  # once ended: its exit code (None: lost, no exit status)
    ending: int | None = None  # the END's exit code, until its bytes are all in its pipes
    lost: str | None = None  # why it ended without an exit status (its node's link ended)
    ended: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        for kind in (*OUTPUTS, Frame.END):
            self.read[kind], self.write[kind] = os.pipe()
            os.set_blocking(self.read[kind], False)
            os.set_blocking(self.write[kind], False)

    def close(self) -> None:
        """Close the supervisor's ends (the links' thread closes its own)."""
        for fd in self.read.values():
            with contextlib.suppress(OSError):
                os.close(fd)


class NodeLinks:
    """One launch's node links (``links``: node -> its connection; ``ranks``: node -> its
    global ranks)."""

    def __init__(self, links: dict[int, socket.socket], ranks: dict[int, list[int]]) -> None:
        self.links = links
        self.ends = {rank: RankEnds(rank, node) for node, its in ranks.items() for rank in its}
        self.ranks = ranks
        self._locks = {node: threading.Lock() for node in links}
        self._open = set(links)
        self._broken: set[int] = set()  # links a send could not use: lost at the next look
        self._heard = dict.fromkeys(links, time.monotonic())
        self._paused: set[int] = set()
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._parsers = {node: FrameParser() for node in links}
        for node, link in links.items():
            link.setblocking(True)
            link.settimeout(SILENCE)  # a send that cannot go for this long: the node is lost
            self._selector.register(link, selectors.EVENT_READ, ("link", node))
        self._thread = threading.Thread(target=self._run, name="notebook-accel-node-links",
                                        daemon=True)
        self._thread.start()

    # -- the kernel -> the hubs ----------------------------------------------------------------

    def send(self, node: int, data: bytes) -> bool:
        """Write frames on ``node``'s link; False when it is gone."""
        if node not in self._open or node in self._broken:
            return False
        try:
            with self._locks[node]:
                self.links[node].sendall(data)
        except OSError:
            self._broken.add(node)
            self._wake()
            return False
        return True

    def command(self, rank: int, data: bytes) -> bool:
        """Bytes for a pool worker's commands channel (b"": close it)."""
        return self.send(self.ends[rank].node, frame(Frame.COMMAND, rank, data))

    def signal(self, rank: int, sig: int, group: bool, kill_after: float = 0.0) -> bool:
        """Have the hub signal ``rank`` (``kill_after``: and SIGKILL it that many seconds later)."""
        body = SIGNAL.pack(int(sig), int(group), kill_after)
        return self.send(self.ends[rank].node, frame(Frame.SIGNAL, rank, body))

    def signal_all(self, sig: int, group: bool) -> None:
        """Signal every rank, one frame per node."""
        for node in list(self._open):
            self.send(node, frame(Frame.SIGNAL, EVERY_RANK, SIGNAL.pack(int(sig), int(group), 0.0)))

    def run(self, payload: bytes, with_result: set[int], chosen: set[int]) -> None:
        """A pool run on the ranks ``chosen``: its payload once per node that has some;
        ``with_result``: the ranks sending values."""
        for node, ranks in self.ranks.items():
            targets = chosen & set(ranks)
            if targets:
                body = pickle.dumps((payload, with_result & targets, targets), protocol=5)
                self.send(node, frame(Frame.RUN, node, body))

    def close(self) -> None:
        """End every link (the hubs then kill what is left of their ranks) and the thread."""
        self._closing = True
        self._wake()
        self._thread.join(timeout=5.0)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the hubs -> the ranks' pipes (the links' thread) ---------------------------------------

    def _run(self) -> None:
        beat = time.monotonic()
        try:
            while not self._closing and (self._open or self._any_pending()):
                for key, _ in self._selector.select(0.25):
                    what, arg = key.data
                    if what == "link":
                        self._read_link(arg)
                    elif what == "pipe":
                        self._flush(*arg)
                    else:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                now = time.monotonic()
                if now - beat >= BEAT_EVERY:
                    beat = now
                    for node in list(self._open):
                        self.send(node, frame(Frame.BEAT, node))
                for node in list(self._broken & self._open):
                    self._lose(node, "its link to the kernel broke")
                for node in list(self._open - self._paused):
                    if now - self._heard[node] > SILENCE:
                        self._lose(node, f"its node went silent (nothing heard for {SILENCE:g} s)")
                self._resume()
        finally:
            self._shut()

    def _read_link(self, node: int) -> None:
        try:
            data = self.links[node].recv(1 << 20)
        except (OSError, TimeoutError):
            data = b""
        if not data:
            self._lose(node, "its node's link ended")
            return
        self._heard[node] = time.monotonic()
        for kind, rank, body in self._parsers[node].feed(data):
            ends = self.ends.get(rank)
            if ends is None or ends.ended.is_set():
                continue
            if kind is Frame.END:
                (ends.ending,) = EXIT.unpack(body)
                self._settle(ends)
            elif kind in OUTPUTS and ends.ending is None:
                self._write(ends, kind, body)
        if sum(self._backlog(rank) for rank in self.ranks[node]) > BACKLOG_LIMIT:
            self._paused.add(node)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self.links[node])

    def _resume(self) -> None:
        for node in list(self._paused):
            if sum(self._backlog(rank) for rank in self.ranks[node]) <= BACKLOG_LIMIT // 2:
                self._paused.discard(node)
                self._heard[node] = time.monotonic()
                if node in self._open:
                    self._selector.register(self.links[node], selectors.EVENT_READ, ("link", node))

    def _backlog(self, rank: int) -> int:
        return sum(len(buffer) for buffer in self.ends[rank].pending.values())

    def _any_pending(self) -> bool:
        return any(ends.pending for ends in self.ends.values())

    def _write(self, ends: RankEnds, kind: Frame, data: bytes) -> None:
        pending = ends.pending.get(kind)
        if pending is not None:
            pending += data
            return
        try:
            written = os.write(ends.write[kind], data)
        except BlockingIOError:
            written = 0
        except OSError:  # the supervisor has closed its end: nobody reads this any more
            return
        if written < len(data):
            ends.pending[kind] = bytearray(data[written:])
            self._selector.register(ends.write[kind], selectors.EVENT_WRITE,
                                    ("pipe", (ends.rank, kind)))

    def _flush(self, rank: int, kind: Frame) -> None:
        ends = self.ends[rank]
        pending = ends.pending[kind]
        try:
            del pending[:os.write(ends.write[kind], pending)]
        except BlockingIOError:
            return
        except OSError:
            pending.clear()
        if not pending:
            del ends.pending[kind]
            self._selector.unregister(ends.write[kind])
            self._settle(ends)

    def _settle(self, ends: RankEnds) -> None:
        """An ending rank whose bytes are all in its pipes: close them, then its sentinel."""
        if ends.ended.is_set() or (ends.ending is None and ends.lost is None) or ends.pending:
            return
        ends.exitcode = ends.ending
        for fd in ends.write.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # the sentinel last: its pipes are at their ends first
        ends.ended.set()

    def _lose(self, node: int, why: str) -> None:
        """``node``'s link is gone: its ranks that had not ended end without an exit status."""
        if node not in self._open:
            return
        self._open.discard(node)
        self._paused.discard(node)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self.links[node])
        with contextlib.suppress(OSError):
            self.links[node].close()
        for rank in self.ranks[node]:
            ends = self.ends[rank]
            if ends.ended.is_set():
                continue
            ends.lost = why if ends.ending is None else None
            for kind in list(ends.pending):  # what the pipe takes now; the rest is dropped
                with contextlib.suppress(OSError):
                    os.write(ends.write[kind], ends.pending[kind])
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(ends.write[kind])
                del ends.pending[kind]
            self._settle(ends)

    def _shut(self) -> None:
        for node in list(self._open):
            self._lose(node, "the launch ended")
        for ends in self.ends.values():
            ends.pending.clear()
            self._settle(ends)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
