"""The hub's loop for one launch: its ranks' pipes and exits onto the node link, the kernel's
commands and signals onto its ranks (one thread per launch on each node).

Each live rank's resident memory goes once a second (``MEMORY``). A rank's end goes after
everything it wrote: when its process has exited, the loop reads its
pipes to their ends (all of it is there by then), sends that, then ``END`` with the exit code.
A ``SIGTERM`` from the kernel is followed by a ``SIGKILL`` ``STOP_GRACE`` seconds later on the
hub's own clock. A pool's heal asks the hub for a free port (``PORT``) and to fork dead ranks
again (``FORK``: the new ranks join this loop as the others are in it). When the link ends, goes
silent for ``SILENCE`` seconds, or cannot take a frame for as long, the kernel is lost: the ranks
are killed (their watchdog pipes close too).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import signal
import socket
import struct
import time

import psutil

from notebook_accel import wire
from notebook_accel.launch.handoff.ports import free_port
from notebook_accel.launch.worker.hub.hub_link import (
    BEAT_EVERY,
    EVERY_RANK,
    EXIT,
    PORT_NUMBER,
    RSS,
    SIGNAL,
    SILENCE,
    Frame,
    FrameParser,
    frame,
    memory_moved,
    read_run,
)
from notebook_accel.launch.worker.hub.rank_fork import ForkedRank, fork_ranks
from notebook_accel.launch.worker.main import WorkerSpec

_READ = 1 << 16
FIRST_WORD = 60.0  # seconds the kernel may take to speak first (it links every node first)


class HubPump:
    """Multiplexes ``ranks`` onto ``link`` until the kernel closes it (or is lost)."""

    def __init__(self, link: socket.socket, ranks: list[ForkedRank], alive_w: int) -> None:
        self.link = link
        self.alive_ws = [alive_w]  # the ranks' watchdog pipes: the launch's, then each re-fork's
        self.ranks: dict[int, ForkedRank] = {}
        self.live: set[int] = set()
        self.outbox = bytearray()
        self.kill_at: dict[int, float] = {}
        self.parser = FrameParser()
        self.selector = selectors.DefaultSelector()
        link.settimeout(SILENCE)  # a send that cannot go for this long: the kernel is lost
        self.selector.register(link, selectors.EVENT_READ, None)
        self.pidfds: dict[int, int] = {}
        self.processes: dict[int, psutil.Process] = {}  # the live ranks' (their memory)
        self.told: dict[int, int] = {}  # each rank's memory figure as last sent
        for r in ranks:
            self._adopt(r)

    def _adopt(self, forked: ForkedRank) -> None:
        """Watch ``forked``'s pipes and exit from now on (in place of an ended rank of its number)."""
        self.ranks[forked.rank] = forked
        self.live.add(forked.rank)
        for kind, fd in forked.outputs.items():
            self.selector.register(fd, selectors.EVENT_READ, (forked.rank, kind))
        self.pidfds[forked.rank] = os.pidfd_open(forked.pid)
        self.selector.register(self.pidfds[forked.rank], selectors.EVENT_READ, (forked.rank, Frame.END))

    def run(self) -> None:
        """The loop (the thread's body)."""
        heard = sent = time.monotonic()
        measured = heard - BEAT_EVERY  # the ranks' memory: at once, then with every beat
        silence = FIRST_WORD  # until the kernel has taken every node's link and spoken
        try:
            while True:
                for key, _ in self.selector.select(0.25):
                    if key.data is None:
                        if not self._from_kernel():
                            return
                        heard, silence = time.monotonic(), SILENCE
                    elif key.data[1] is Frame.END:
                        self._ended(key.data[0])
                    else:
                        self._read(key.data[0], key.data[1], key.fd)
                now = time.monotonic()
                for rank, at in list(self.kill_at.items()):
                    if now >= at:
                        self._signal(rank, signal.SIGKILL, True)
                if now - measured >= BEAT_EVERY:
                    measured = now
                    self._measure()
                if now - sent >= BEAT_EVERY:
                    self.outbox += frame(Frame.BEAT, 0)
                if self.outbox:
                    self.link.sendall(self.outbox)
                    self.outbox.clear()
                    sent = now
                if now - heard > silence:
                    return  # the kernel (or the way to it) is lost
        except OSError:
            return  # the link broke, or a send waited SILENCE seconds
        finally:
            self._end()

    # -- the ranks -> the kernel ---------------------------------------------------------------

    def _read(self, rank: int, kind: Frame, fd: int) -> bool:
        """Forward one read of a pipe; False when it held nothing now, or is at its end."""
        try:
            data = os.read(fd, _READ)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(fd)
            return False
        self.outbox += frame(kind, rank, data)
        return True

    def _ended(self, rank: int) -> None:
        """The rank's process exited: its pipes hold the rest of what it wrote (a child of it
        may still hold them open: what is there now); that goes first, then its END."""
        forked = self.ranks[rank]
        for kind, fd in forked.outputs.items():
            while fd in self.selector.get_map() and self._read(rank, kind, fd):
                if len(self.outbox) > 64 * _READ:
                    self.link.sendall(self.outbox)
                    self.outbox.clear()
        try:
            code = os.waitstatus_to_exitcode(os.waitpid(forked.pid, 0)[1])
        except ChildProcessError:  # reaped by someone else (SIGCHLD ignored): no status to tell
            code = 1
        self.outbox += frame(Frame.END, rank, EXIT.pack(code))
        self._forget(rank)

    def _measure(self) -> None:
        """Each live rank's resident memory, for the kernel's view (as a local launch shows it):
        sent when it moved (``memory_moved``), so a steady job's figures cost the kernel nothing."""
        for rank in self.live:
            with contextlib.suppress(psutil.Error):
                process = self.processes.get(rank)
                if process is None:
                    process = self.processes[rank] = psutil.Process(self.ranks[rank].pid)
                rss = process.memory_info().rss
                if memory_moved(self.told.get(rank), rss):
                    self.told[rank] = rss
                    self.outbox += frame(Frame.MEMORY, rank, RSS.pack(rss))

    def _forget(self, rank: int) -> None:
        forked = self.ranks[rank]
        self.live.discard(rank)
        self.kill_at.pop(rank, None)
        self.processes.pop(rank, None)
        self.told.pop(rank, None)
        for fd in (*forked.outputs.values(), self.pidfds.pop(rank)):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        self._close_commands(forked)

    # -- the kernel -> the ranks ---------------------------------------------------------------

    def _from_kernel(self) -> bool:
        """Act on what the kernel sent; False once the link has ended."""
        data = self.link.recv(1 << 20)
        if not data:
            return False
        for kind, rank, body in self.parser.feed(data):
            if kind is Frame.COMMAND:
                self._command(rank, body)
            elif kind is Frame.SIGNAL:
                sig, group, after = SIGNAL.unpack_from(body)
                at = time.monotonic() + after  # the stop's grace runs on this hub's clock
                for target in sorted(_targets(rank, body, self.live)):
                    self._signal(target, sig, bool(group))
                    if after:
                        self.kill_at.setdefault(target, at)
            elif kind is Frame.RUN:
                payload, with_result, targets = read_run(body)
                runs = {}  # a Run encoded once per kind (with a result, without): not per rank
                for target in sorted(self.live & targets):
                    returns = target in with_result
                    if returns not in runs:
                        runs[returns] = wire.encode(wire.Run(payload, returns))
                    self._command(target, runs[returns])
            elif kind is Frame.PORT:
                self.outbox += frame(Frame.PORT, 0, PORT_NUMBER.pack(_free_port(body.decode())))
            elif kind is Frame.FORK:
                self.outbox += frame(Frame.FORK, 0, pickle.dumps(self._fork_again(pickle.loads(body))))
        return True

    def _fork_again(self, specs: list[WorkerSpec]) -> list[int] | str:
        """Fork pool workers for ``specs`` (ranks whose workers ended) and watch them with the
        others; returns their pids, or why they could not be forked."""
        running = sorted(self.live & {spec.rank for spec in specs})
        if running:
            return f"ranks {running} are still running here"
        try:
            forked, alive_w = fork_ranks(specs, None, serve=True)
        except Exception as error:  # noqa: BLE001 - said to the kernel, which replaces every rank
            return f"{type(error).__name__}: {error}"
        self.alive_ws.append(alive_w)
        for rank in forked:
            self._adopt(rank)
        return [rank.pid for rank in forked]

    def _command(self, rank: int, data: bytes) -> None:
        forked = self.ranks.get(rank)
        if forked is None or forked.commands is None:
            return
        if not data:
            self._close_commands(forked)
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(forked.commands, view):]
        except OSError:  # it is gone: its END tells the kernel
            self._close_commands(forked)

    @staticmethod
    def _close_commands(forked: ForkedRank) -> None:
        if forked.commands is not None:
            with contextlib.suppress(OSError):
                os.close(forked.commands)
            forked.commands = None

    def _signal(self, rank: int, sig: int, group: bool) -> None:
        if rank not in self.live:
            return
        pid = self.ranks[rank].pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                try:
                    os.killpg(pid, sig)  # the worker leads its own session
                    return
                except ProcessLookupError:
                    pass
            os.kill(pid, sig)
        if sig == signal.SIGKILL:
            self.kill_at.pop(rank, None)

    def _end(self) -> None:
        """The launch is over (or the kernel lost): nothing of it outlives the loop."""
        for alive_w in self.alive_ws:
            with contextlib.suppress(OSError):
                os.close(alive_w)  # every rank's watchdog ends it
        for rank in list(self.live):
            self._signal(rank, signal.SIGKILL, True)
        for rank in list(self.live):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.ranks[rank].pid, 0)
            self._forget(rank)
        self.selector.close()
        self.link.close()


def _free_port(host: str) -> int:
    """A port free now at ``host`` on this node (0: none could be bound there)."""
    try:
        return free_port(host)
    except OSError:
        return 0


def _targets(rank: int, body: bytes, live: set[int]) -> set[int]:
    """The live ranks a SIGNAL frame is for: ``rank``, or (``EVERY_RANK``) those listed after
    its SIGNAL data, every live rank of the node when none are."""
    if rank != EVERY_RANK:
        return {rank} & live
    listed = body[SIGNAL.size:]
    if not listed:
        return set(live)
    return set(struct.unpack(f"!{len(listed) // 4}I", listed)) & live
