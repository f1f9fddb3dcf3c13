"""The kernel's end of the node links: every node's one connection, taken apart into each rank's
channels as the supervisor knows them, with no descriptor per rank.

One thread per launch reads every node's link and keeps each frame's bytes in memory under its
rank and channel (stdout, stderr, control, events), in the link's order; the supervisor waits on
one descriptor for them all (:meth:`NodeLinks.fileno`, readable when there is news) and takes
the news (:meth:`NodeLinks.take`: which channels have bytes, which ranks ended) and the bytes.
A rank's ``END`` comes after the last of its bytes, so the kernel never waits for a rank's last
line. A link whose ranks hold more than ``BACKLOG_LIMIT`` bytes not yet taken is not read until
they are. The thread beats on every link each ``BEAT_EVERY`` seconds; a link that ends, or says
nothing for ``SILENCE`` seconds, is a lost node: its ranks end without an exit status, naming
why. So the kernel holds one socket per node and a few descriptors per launch, whatever the
number of ranks.

The other way (commands, a pool run once per node, signals once per node for every rank they
concern) is written on the link by the caller, one writer at a time. A pool's heal asks a hub
a question and waits for its answer (:meth:`NodeLinks.free_port`, :meth:`NodeLinks.fork`: a
dead rank forked again, its channels started afresh under the same rank).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import selectors
import signal
import socket
import struct
import threading
import time
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from notebook_accel import wire
from notebook_accel.launch.worker.hub.hub_link import (
    ANSWERED,
    BEAT_EVERY,
    EVERY_RANK,
    EXIT,
    PORT_NUMBER,
    RSS,
    SIGNAL,
    SILENCE,
    STOP_GRACE,
    Frame,
    FrameParser,
    frame,
    run_frame,
)

ANSWER_TIMEOUT = 30.0  # seconds a hub may take to answer a heal's question (a fork: a few ms)
BACKLOG_LIMIT = 32 << 20  # bytes of a node's ranks held here before its link is left unread
NAMES = {Frame.STDOUT: "stdout", Frame.STDERR: "stderr", Frame.CONTROL: "control",
         Frame.EVENTS: "events"}
KINDS = {name: kind for kind, name in NAMES.items()}
DIED_WITH_NODE = 2.0  # seconds: a rank SIGKILLed this long before its node's link ended died with it
SIGNALS = {  # a handle's method -> (signal, to its process group, SIGKILL after, on the hub)
    "terminate": (signal.SIGTERM, True, STOP_GRACE),
    "kill": (signal.SIGKILL, True, 0.0),
    "interrupt": (signal.SIGINT, False, 0.0),  # a KeyboardInterrupt in the rank only
    "dump_stacks": (signal.SIGUSR1, False, 0.0),
}


@dataclass
class RankChannels:
    """One rank's channels: what its node's link brought that the supervisor has not taken."""

    rank: int
    node: int
    held: dict[Frame, bytearray] = field(default_factory=dict)
    exitcode: int | None = None  # once ended: its exit code (None: lost, no exit status)
    lost: str | None = None  # why its node's link ended, when the rank ended with it
    ended_at: float | None = None  # when its exit status came (the monotonic clock)
    rss: int | None = None  # its resident memory, as its hub measured it last (bytes)
    ended: threading.Event = field(default_factory=threading.Event)


class LinkFrames(wire.FrameReader):
    """A rank's control or events channel, read from what its node's link brought."""

    def __init__(self, links: NodeLinks, rank: int, name: str) -> None:
        super().__init__(-1)
        self.links, self.rank, self.kind = links, rank, KINDS[name]

    def _fill(self) -> None:
        data = self.links.take_bytes(self.rank, self.kind)
        if data:
            self.buffer += data
        elif data is not None:
            self.open = False


class NodeLinks:
    """One launch's node links (``links``: node -> its connection; ``ranks``: node -> its
    global ranks); the ``Inbox`` and the ``Together`` of its ranks' handles
    (``launch/backends/base.py``)."""

    def __init__(self, links: dict[int, socket.socket], ranks: dict[int, list[int]]) -> None:
        self.links = links
        self.ends = {rank: RankChannels(rank, node) for node, its in ranks.items() for rank in its}
        self.ranks = ranks
        self._locks = {node: threading.Lock() for node in links}
        self._lock = threading.Lock()  # the held bytes and the news
        self._news: dict[tuple[int, str], None] = {}  # in arrival order, once each
        self._kept: dict[tuple[int, str], None] = {}  # taken news of ranks outside that run
        self._held = dict.fromkeys(links, 0)  # bytes held per node
        self._news_r, self._news_w = os.pipe()  # readable while there is news
        os.set_blocking(self._news_r, False)
        self._open = set(links)
        self._broken: set[int] = set()  # links a send could not use: lost at the next look
        self._heard = dict.fromkeys(links, time.monotonic())
        self._paused: set[int] = set()
        self._answers: dict[tuple[int, Frame], bytes] = {}  # (node, question) -> its hub's answer
        self._answered = threading.Condition()  # an answer came, or a link was lost
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._parsers = {node: FrameParser() for node in links}
        for node, link in links.items():
            link.setblocking(True)
            link.settimeout(SILENCE)  # a send that cannot go for this long: the node is lost
            self._selector.register(link, selectors.EVENT_READ, node)
        self._thread = threading.Thread(target=self._run, name="notebook-accel-node-links",
                                        daemon=True)
        self._thread.start()

    # -- the supervisor's side (Inbox) ---------------------------------------------------------

    def fileno(self) -> int:
        return self._news_r

    def take(self, ranks: Container[int], most: int | None = None) -> list[tuple[int, str]]:
        with self._lock:
            if most is None or len(self._news) <= most:
                news, self._news = list(self._news), {}
            else:  # the oldest; the rest stay news, and the pipe keeps its byte
                news = list(itertools.islice(self._news, most))
                for item in news:
                    del self._news[item]
            if not self._news:  # (the pipe holds a byte only while there is news)
                with contextlib.suppress(OSError):
                    while os.read(self._news_r, 4096):
                        pass
            news, self._kept = [*self._kept, *news], {}
            for item in news:
                if item[0] not in ranks:
                    self._kept[item] = None
        return [item for item in news if item[0] in ranks]

    def take_bytes(self, rank: int, kind: Frame) -> bytes | None:
        """What ``rank``'s channel holds now: b"" once it ended with nothing left, None when
        nothing is there yet."""
        ends = self.ends[rank]
        with self._lock:
            held = ends.held.pop(kind, None)
            if held:
                self._held[ends.node] -= len(held)
                return bytes(held)
            return b"" if ends.ended.is_set() else None

    def _tell(self, rank: int, name: str) -> None:
        """News of ``rank``'s channel ``name`` (the caller holds the lock)."""
        if not self._news:
            with contextlib.suppress(OSError):
                os.write(self._news_w, b"\0")
        self._news[(rank, name)] = None

    # -- the kernel -> the hubs ----------------------------------------------------------------

    def send(self, node: int, *parts: bytes) -> bool:
        """Write frames on ``node``'s link (``parts``: their bytes, in order, written together
        without joining them); False when it is gone."""
        if node not in self._open or node in self._broken:
            return False
        try:
            with self._locks[node]:
                _send_parts(self.links[node], parts)
        except OSError:
            self._broken.add(node)
            self._wake()
            return False
        return True

    def command(self, rank: int, data: bytes) -> bool:
        """Bytes for a pool worker's commands channel (b"": close it)."""
        return self.send(self.ends[rank].node, frame(Frame.COMMAND, rank, data))

    def signal(self, ranks: Sequence[int], what: str) -> None:
        """Do ``what`` to ``ranks``: one frame per node that has some (the hub kills a rank
        that ignores its ``terminate`` ``STOP_GRACE`` seconds later, on its own clock)."""
        sig, group, after = SIGNALS[what]
        head = SIGNAL.pack(int(sig), int(group), after)
        by_node: dict[int, list[int]] = {}
        for rank in ranks:
            by_node.setdefault(self.ends[rank].node, []).append(rank)
        for node, its in by_node.items():
            listed = b"" if len(its) == len(self.ranks[node]) else struct.pack(f"!{len(its)}I", *its)
            self.send(node, frame(Frame.SIGNAL, EVERY_RANK, head + listed))

    def run(self, payload: bytes, with_result: set[int], chosen: set[int]) -> None:
        """A pool run on the ranks ``chosen``: its payload once per node that has some (the
        same bytes written to every link, not copied per node); ``with_result``: the ranks
        sending values."""
        for node, ranks in self.ranks.items():
            targets = chosen & set(ranks)
            if targets:
                self.send(node, *run_frame(node, payload, with_result & targets, targets))

    def free_port(self, node: int, host: str) -> int:
        """A port free now at ``host`` on ``node`` (its hub looks): a fresh rendezvous store's.

        Raises:
            ConnectionError: the node's link was lost, its hub did not answer in time, or it
                could bind no port there.
        """
        (port,) = PORT_NUMBER.unpack(self._ask(node, Frame.PORT, host.encode()))
        if not port:
            raise ConnectionError(f"node {node}'s hub could bind no port at {host}")
        return port

    def fork(self, node: int, specs: Sequence[Any]) -> list[int]:
        """Have ``node``'s hub fork pool workers again for ``specs`` (``WorkerSpec``s of ranks
        whose workers ended): the ranks' channels start afresh here; returns their pids.

        Raises:
            RuntimeError: the hub could not fork them (it says why).
            ConnectionError: the node's link was lost, or its hub did not answer in time.
        """
        for spec in specs:
            self._renew(spec.rank)
        answer = pickle.loads(self._ask(node, Frame.FORK, pickle.dumps(list(specs))))
        if isinstance(answer, str):
            raise RuntimeError(f"node {node}'s hub could not fork "
                               f"{', '.join(f'rank {s.rank}' for s in specs)} again: {answer}")
        return answer

    def _renew(self, rank: int) -> None:
        """Fresh channels for ``rank`` (its worker ended): what its last one left untaken, and
        news of it, are dropped, as a local pool closes a dead worker's pipes."""
        with self._lock:
            old = self.ends[rank]
            self._held[old.node] -= sum(len(held) for held in old.held.values())
            self.ends[rank] = RankChannels(rank, old.node)
            for news in (self._news, self._kept):
                for item in [item for item in news if item[0] == rank]:
                    del news[item]

    def _ask(self, node: int, question: Frame, data: bytes) -> bytes:
        """Send ``question`` to ``node``'s hub and wait for its answer (one at a time per node
        and question: a pool's heal asks, and it is one)."""
        with self._answered:
            self._answers.pop((node, question), None)
        if not self.send(node, frame(question, 0, data)):
            raise ConnectionError(f"node {node}'s link to the kernel is gone")
        with self._answered:
            self._answered.wait_for(lambda: (node, question) in self._answers
                                    or node not in self._open, ANSWER_TIMEOUT)
            answer = self._answers.pop((node, question), None)
        if answer is None:
            why = "was lost" if node not in self._open else f"did not answer in {ANSWER_TIMEOUT:g} s"
            raise ConnectionError(f"node {node}'s hub {why} (asked for {question.name})")
        return answer

    def close(self) -> None:
        """End every link (the hubs then kill what is left of their ranks) and the thread."""
        self._closing = True
        self._wake()
        self._thread.join(timeout=5.0)
        for fd in (self._news_r, self._news_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the hubs -> the ranks' channels (the links' thread) ------------------------------------

    def _run(self) -> None:
        beat = time.monotonic() - BEAT_EVERY  # a first beat at once: the hubs hear the kernel
        try:
            while not self._closing and self._open:
                for key, _ in self._selector.select(self._until_due(beat)):
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._read_link(key.data)
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

    def _until_due(self, beat: float) -> float:
        """Seconds the thread may wait: 0.25 at most, less to the next beat or to a node's
        loss (so a silent node is lost on time, not up to a wait later)."""
        now = time.monotonic()
        due = [beat + BEAT_EVERY, *(self._heard[node] + SILENCE for node in self._open - self._paused)]
        return max(0.0, min(0.25, min(due) - now + 0.005))

    def _read_link(self, node: int) -> None:
        try:
            data = self.links[node].recv(1 << 20)
        except (OSError, TimeoutError):
            data = b""
        if not data:
            self._lose(node, "its node's link ended")
            return
        self._heard[node] = time.monotonic()
        frames = self._parsers[node].feed(data)  # (outside the lock: the supervisor takes)
        with self._lock:
            for kind, rank, body in frames:
                if kind in ANSWERED:
                    with self._answered:
                        self._answers[(node, kind)] = body
                        self._answered.notify_all()
                    continue
                ends = self.ends.get(rank)
                if ends is None or ends.ended.is_set():
                    continue
                if kind is Frame.END:
                    (ends.exitcode,) = EXIT.unpack(body)
                    ends.ended_at = time.monotonic()
                    ends.ended.set()  # after its bytes: they are all held already
                    self._tell(rank, "exit")
                elif kind is Frame.MEMORY:  # (sent when it moved)
                    (ends.rss,) = RSS.unpack(body)
                    self._tell(rank, "memory")
                elif kind in NAMES:
                    ends.held.setdefault(kind, bytearray()).extend(body)
                    self._held[node] += len(body)
                    self._tell(rank, NAMES[kind])
            if self._held[node] > BACKLOG_LIMIT:
                self._paused.add(node)
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(self.links[node])

    def _resume(self) -> None:
        for node in list(self._paused):
            if self._held[node] <= BACKLOG_LIMIT // 2:
                self._paused.discard(node)
                self._heard[node] = time.monotonic()
                if node in self._open:
                    self._selector.register(self.links[node], selectors.EVENT_READ, node)

    def _lose(self, node: int, why: str, lost: bool = True) -> None:
        """``node``'s link is gone: its ranks that had not ended end without an exit status
        (what they sent before stays to be read). Where the node was ``lost`` (not closed by
        the launch's end), a rank killed by SIGKILL just before (:data:`DIED_WITH_NODE`) died
        with it (its hub reported a kill that its node's end caused): it is lost too."""
        if node not in self._open:
            return
        self._open.discard(node)
        self._paused.discard(node)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self.links[node])
        with contextlib.suppress(OSError):
            self.links[node].close()
        with self._lock:
            for rank in self.ranks[node]:
                ends = self.ends[rank]
                if not ends.ended.is_set():
                    ends.lost = why
                    ends.ended.set()
                    self._tell(rank, "exit")
                elif (lost and ends.exitcode == -signal.SIGKILL and ends.ended_at is not None
                      and time.monotonic() - ends.ended_at <= DIED_WITH_NODE):
                    ends.lost = why
        with self._answered:
            self._answered.notify_all()  # a question to its hub waits no longer

    def _shut(self) -> None:
        for node in list(self._open):
            self._lose(node, "the launch ended", lost=False)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


def _send_parts(link: socket.socket, parts: Sequence[bytes]) -> None:
    """Write ``parts`` on a blocking ``link`` in as few calls as the socket takes (``sendall``
    of each gathered, without joining them into one copy)."""
    views = [memoryview(part) for part in parts if part]
    while views:
        sent = link.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views.pop(0))
        if views:
            views[0] = views[0][sent:]
