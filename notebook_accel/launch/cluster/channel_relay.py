"""The nodes' links through Ray, for a kernel the nodes cannot reach (a Ray Client address).

With ``cluster="ray://head:10001"`` the kernel talks to the cluster only through the Ray Client
server, so the nodes' hubs cannot connect back to it. A :class:`ChannelRelay` actor on the head
node stands in for it: it accepts the hubs' links exactly as the kernel's
:class:`~.channel_server.ChannelServer` does (it runs one), and :class:`RelayedChannels`, in the
kernel, gives it one socket per link (generic: per peer and channel), pumped to and from the
relay by Ray actor calls. The bytes are the link's, unchanged, so the kernel's side of the links
(``node_links.py``) and everything after it are the same; an end of file travels as one too (a
hub gone, the kernel's end of a launch).

Bounded: the relay reads a connection only while less than ``BUFFER_LIMIT`` bytes of it wait
for the kernel (the hub then blocks in its write, as on a local pipe). A session ends when
the kernel has closed every channel (or on failure), or when the kernel has said nothing for
``KERNEL_SILENCE`` seconds: it beats every ``BEAT_EVERY`` seconds, so a dead kernel's ranks end
within seconds (their connections close, as a dead kernel's own would), not when Ray ends the
client's job (30 s later by default). The actor ends with its placement, or with the kernel's
Ray job.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from notebook_accel.launch.cluster.channel_server import ChannelServer
from notebook_accel.launch.worker.hub.hub_link import LINK_CHANNELS

BUFFER_LIMIT = 1 << 20  # bytes of one connection held in the relay before it stops reading it
PULL_LIMIT = 4 << 20  # bytes one pull carries at most
PULL_WAIT = 0.5  # seconds a pull waits for data before returning empty
PUSHES_IN_FLIGHT = 64  # pushes the kernel sends before waiting for the oldest
ALIVE_GRACE = 0.5  # seconds a rank's end (its *alive* channel's) may wait for its other channels
BEAT_EVERY = 1.0  # seconds between the kernel's beats to the relay
KERNEL_SILENCE = 10.0  # seconds without a beat after which the relay takes the kernel for dead
_ALIVE = 0  # the index of a peer's first channel: its end is told after its other channels'
Chunk = tuple[int, int, bytes]  # rank, channel index, bytes (b"": end of file)


class _Session:
    """One launch's connections in the relay: accepted, read into bounded buffers, written."""

    def __init__(self, host: str, world_size: int, channels: tuple[str, ...],
                 silence: float = KERNEL_SILENCE) -> None:
        self.server = ChannelServer(host, world_size, channels,
                                    owner="the kernel's relay on the head node")
        self.channels = channels
        self.silence = silence
        self.last_beat = time.monotonic()
        self.socks: dict[tuple[int, int], socket.socket] = {}
        self.buffers: dict[tuple[int, int], bytearray] = {}
        self.ended: dict[tuple[int, int], float] = {}  # read to end of file, when
        self.told: set[tuple[int, int]] = set()  # ... and that end of file pulled
        self.closed = False
        self.pushed = 0  # pushes written: the next one's sequence number
        self.ready = threading.Condition()
        self._wake_r, self._wake_w = socket.socketpair()

    def accept(self, timeout: float) -> str | None:
        """Take every rank's connections; None, or what is missing after ``timeout`` seconds."""
        def check() -> None:
            if self.closed:
                raise ConnectionAbortedError("the launch was abandoned")
        try:
            got = self.server.accept(time.monotonic() + timeout, check)
        except TimeoutError as exc:
            return str(exc)
        finally:
            self.server.close()
        for rank, channels in got.items():
            for name, sock in channels.items():
                sock.setblocking(True)
                key = (rank, self.channels.index(name))
                self.socks[key], self.buffers[key] = sock, bytearray()
        self.last_beat = time.monotonic()  # the kernel beats once it has its ends
        threading.Thread(target=self._read, name="notebook-accel-relay", daemon=True).start()
        return None

    def beat(self) -> None:
        """The kernel is alive."""
        self.last_beat = time.monotonic()

    def _read(self) -> None:
        while not self.closed:
            if time.monotonic() - self.last_beat > self.silence:
                self.close()  # the kernel is gone: its ranks see their channels end
                return
            with self.ready:
                room = {self.socks[k]: (k, BUFFER_LIMIT - len(self.buffers[k])) for k in self.socks
                        if k not in self.ended and len(self.buffers[k]) < BUFFER_LIMIT}
            try:
                readable = wait([*room, self._wake_r], PULL_WAIT)  # poll: any fd number
            except (OSError, ValueError):  # closed under us: the session ended
                return
            for sock in readable:
                if sock is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                    continue
                key, free = room[sock]  # pulls only add room meanwhile
                try:
                    data = sock.recv(min(65536, free))
                except OSError:
                    data = b""
                with self.ready:
                    if data:
                        self.buffers[key] += data
                    else:
                        self.ended[key] = time.monotonic()
                    self.ready.notify_all()

    def pull(self, wait: float) -> list[Chunk] | None:
        """What the workers sent since the last pull (waits up to ``wait`` seconds for some);
        None once the session is closed."""
        with self.ready:
            self.ready.wait_for(lambda: self.closed or self._pending(), wait)
            if self.closed:
                return None
            chunks, size = [], 0
            for key, buffer in self.buffers.items():
                if buffer and size < PULL_LIMIT:
                    data = bytes(buffer[:PULL_LIMIT - size])
                    del buffer[:len(data)]
                    chunks.append((*key, data))
                    size += len(data)
            ends = sorted(self._ends(), key=lambda key: key[1] == _ALIVE)  # a rank's end last
            chunks += [(*key, b"") for key in ends]
            self.told.update(ends)
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")  # buffers drained: read on
            return chunks

    def _pending(self) -> bool:
        return any(self.buffers.values()) or bool(self._ends())

    def _ends(self) -> list[tuple[int, int]]:
        """The ends of file to tell now: after the data before them, and a rank's *alive* one
        (its end, for the supervisor) after its other channels' (its result, its last output),
        or ``ALIVE_GRACE`` seconds after it came (a child process may hold them open)."""
        ends = {k for k in self.ended if k not in self.told and not self.buffers[k]}
        done = ends | self.told
        now = time.monotonic()

        def rank_done(rank: int) -> bool:
            return all(k in done for k in self.buffers if k[0] == rank and k[1] != _ALIVE)

        return [k for k in ends if k[1] != _ALIVE or rank_done(k[0])
                or now - self.ended[k] >= ALIVE_GRACE]

    def push(self, seq: int, rank: int, index: int, data: bytes) -> None:
        """Write ``data`` to the worker's connection (b"": close its writing side), after the
        pushes numbered before ``seq`` (the kernel does not wait for each: calls may come out of
        order)."""
        with self.ready:
            self.ready.wait_for(lambda: self.pushed == seq or self.closed)
        sock = self.socks.get((rank, index))
        with contextlib.suppress(OSError):
            if sock is not None and data:
                sock.sendall(data)
            elif sock is not None:
                sock.shutdown(socket.SHUT_WR)
        with self.ready:
            self.pushed += 1
            self.ready.notify_all()

    def close(self) -> None:
        with self.ready:
            self.closed = True
            self.ready.notify_all()
        self.server.close()
        for sock in (*self.socks.values(), self._wake_r, self._wake_w):
            sock.close()


class ChannelRelay:
    """The in-cluster end (a Ray actor on the head node; the kernel wraps it in ``ray.remote``):
    one :class:`_Session` per launch, listening on ``host`` (default: its node's address)."""

    def __init__(self, host: str | None = None, silence: float = KERNEL_SILENCE) -> None:
        if host is None:
            import ray

            host = ray.util.get_node_ip_address()
        self._host, self._silence = host, silence
        self._sessions: dict[int, _Session] = {}
        self._ids = itertools.count()

    def open(self, world_size: int, channels: tuple[str, ...] = LINK_CHANNELS,
             ) -> tuple[int, tuple[str, int], bytes]:
        """A new session: its id, and the address and token its peers (a launch's hubs)
        connect with, each with ``channels``."""
        session = _Session(self._host, world_size, tuple(channels), self._silence)
        key = next(self._ids)
        self._sessions[key] = session
        return key, session.server.address, session.server.token

    def accept(self, key: int, timeout: float) -> str | None:
        return self._sessions[key].accept(timeout)

    def beat(self, key: int) -> None:
        session = self._sessions.get(key)
        if session is not None:
            session.beat()

    def pull(self, key: int, wait: float) -> list[Chunk] | None:
        session = self._sessions.get(key)
        return None if session is None else session.pull(wait)

    def push(self, key: int, seq: int, rank: int, index: int, data: bytes) -> None:
        session = self._sessions.get(key)
        if session is not None:
            session.push(seq, rank, index, data)

    def sessions(self) -> int:
        """How many launches (or pools) it relays now."""
        return len(self._sessions)

    def close(self, key: int) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            session.close()


class RelayedChannels:
    """The kernel's end of one session: a socket per rank and channel for the supervisor, the
    surface of :class:`~.channel_server.ChannelServer` (``address``, ``token``, ``accept``,
    ``close``)."""

    def __init__(self, ray: Any, relay: Any, world_size: int,
                 channels: tuple[str, ...] = LINK_CHANNELS) -> None:
        self._ray, self._relay = ray, relay
        self.world_size = world_size
        self.channels = tuple(channels)
        self.key, self.address, self.token = ray.get(relay.open.remote(world_size, self.channels))
        self._pumps: dict[socket.socket, tuple[int, int]] = {}  # our end -> (rank, channel index)
        self._done = threading.Event()
        self._pumping = 2  # threads still using our ends; the last one out closes them
        self._lock = threading.Lock()

    def accept(self, deadline: float, check: Callable[[], None]) -> dict[int, dict[str, socket.socket]]:
        """Every rank's channels (the kernel's ends), once the relay has all their connections.

        Raises:
            TimeoutError: not all arrived by ``deadline``, naming the ranks missing.
        """
        try:
            pending = self._relay.accept.remote(self.key, max(0.0, deadline - time.monotonic()))
            while not self._ray.wait([pending], timeout=0.1)[0]:
                check()
            missing = self._ray.get(pending)
            if missing:
                raise TimeoutError(missing)
        except BaseException:
            self._end()
            raise
        channels: dict[int, dict[str, socket.socket]] = {}
        for rank in range(self.world_size):
            for index, name in enumerate(self.channels):
                ours, theirs = socket.socketpair()
                theirs.setblocking(True)
                channels.setdefault(rank, {})[name] = theirs
                self._pumps[ours] = (rank, index)
        threading.Thread(target=self._down, name="notebook-accel-relay-down", daemon=True).start()
        threading.Thread(target=self._up, name="notebook-accel-relay-up", daemon=True).start()
        threading.Thread(target=self._beat, name="notebook-accel-relay-beat", daemon=True).start()
        return channels

    def close(self) -> None:
        """Nothing to do: the relay stops listening once every rank has connected, and the
        session ends when every channel is closed here."""

    def _beat(self) -> None:
        """Tell the relay this kernel is alive, until the session ends (fire and forget: a
        beat's own delay is not waited for)."""
        while not self._done.wait(BEAT_EVERY):
            try:
                self._relay.beat.remote(self.key)
            except Exception:  # noqa: BLE001 - the relay is gone: _down ends every channel
                return

    def _down(self) -> None:
        """Workers -> kernel: write what the relay pulled into our ends."""
        ends = {key: sock for sock, key in self._pumps.items()}
        try:
            self._pull_into(ends)
        finally:
            self._leave()

    def _pull_into(self, ends: dict[tuple[int, int], socket.socket]) -> None:
        while not self._done.is_set():
            try:
                chunks = self._ray.get(self._relay.pull.remote(self.key, PULL_WAIT))
            except Exception:  # noqa: BLE001 - the relay (its node) is gone: every channel ends
                chunks = [(*key, b"") for key in ends]
                self._done.set()
            if chunks is None:
                return
            for rank, index, data in chunks:
                with contextlib.suppress(OSError):
                    if data:
                        ends[(rank, index)].sendall(data)
                    else:
                        ends[(rank, index)].shutdown(socket.SHUT_WR)

    def _up(self) -> None:
        """Kernel -> workers: what the supervisor writes (a pool's runs) or closes (a kill, the
        end of a pool's commands, the end of the job), in order; the session ends when every
        channel is closed here."""
        open_ = dict(self._pumps)
        numbers = itertools.count()
        in_flight: collections.deque = collections.deque()
        try:
            while open_ and not self._done.is_set():
                readable = wait(list(open_), PULL_WAIT)
                for sock in readable:
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        del open_[sock]
                    in_flight.append(self._relay.push.remote(self.key, next(numbers),
                                                             *self._pumps[sock], data))
                    if len(in_flight) > PUSHES_IN_FLIGHT:
                        self._ray.get(in_flight.popleft())
            self._ray.get(list(in_flight))
        except Exception:  # noqa: BLE001, S110 - the relay is gone: _down ends every channel
            pass
        self._end()
        self._leave()

    def _leave(self) -> None:
        with self._lock:
            self._pumping -= 1
            last = self._pumping == 0
        if last:
            for sock in self._pumps:
                sock.close()

    def _end(self) -> None:
        self._done.set()
        with contextlib.suppress(Exception):
            self._relay.close.remote(self.key)
