"""The node link: one ordered TCP connection between a node's hub and the kernel, every rank of
the node multiplexed onto it.

A frame is a 9-byte header (its kind, the rank it is about, the length of its data) and the
data. A hub sends each rank's output and framed channels as they come, and the rank's end
(``END``: its exit code) after everything the rank wrote, on that same stream, so the kernel
never waits for a rank's last line. The kernel sends commands for one rank (a pool worker's
``Run``, ``StopAsk``, ``StopAt``; empty data: close its commands), signals, and a pool run's
payload once per node (``RUN``); a stop, an interrupt or a stack dump goes once per node,
listing its ranks. A pool's heal asks two questions, each answered by a frame of the same kind:
node 0's hub for a free port (``PORT``: the fresh rendezvous store's), and the hub of a dead
rank's node to fork it again (``FORK``). Both sides send ``BEAT`` every ``BEAT_EVERY`` seconds;
a side that hears nothing for ``SILENCE`` seconds takes the other for lost.

The connection opens with :data:`HELLO` (the launch's secret token, the node's index), as every
connection to the kernel's :class:`~notebook_accel.launch.cluster.channel_server.ChannelServer`.
"""

from __future__ import annotations

import enum
import pickle
import struct

HELLO = struct.Struct("!32sIB")  # token, global rank (a link: its node), channel index
LINK_CHANNELS = ("link",)  # what a hub's connection is, for the channel server
HEADER = struct.Struct("!BII")  # kind, rank, length of the data
EXIT = struct.Struct("!i")  # an END's data: the exit code (negative: the signal)
RSS = struct.Struct("!Q")  # a MEMORY's data: bytes
RUN_HEAD = struct.Struct("!I")  # a RUN's data starts with the length of its pickled rank sets
PORT_NUMBER = struct.Struct("!H")  # a PORT's answer: the port
SIGNAL = struct.Struct("!iBd")  # a SIGNAL's data: the signal, to its group, kill after (s; 0: no)
EVERY_RANK = 0xFFFFFFFF  # a SIGNAL's rank for the ranks listed after its data (none: all)
BEAT_EVERY = 1.0  # seconds between two beats of each side
SILENCE = 4.0  # seconds without a frame after which a side takes the other for lost
STOP_GRACE = 2.0  # seconds between a rank's SIGTERM and its SIGKILL, on the hub's own clock
MEMORY_MOVED = 0.01  # a memory figure is news when it moved by more than this fraction


class Frame(enum.IntEnum):
    """What a frame carries."""

    STDOUT = 0  # hub -> kernel: a rank's bytes, as written
    STDERR = 1
    CONTROL = 2  # framed messages (wire/), as written
    EVENTS = 3
    END = 4  # hub -> kernel: the rank ended (EXIT), after everything it wrote
    BEAT = 5  # both ways: alive
    COMMAND = 6  # kernel -> hub: bytes for a rank's commands channel (b"": close it)
    SIGNAL = 7  # kernel -> hub: signal a rank, or EVERY_RANK: those listed (SIGNAL, then "!I"s)
    RUN = 8  # kernel -> hub: a pool run for the node (``RUN_HEAD``, the pickled (ranks sending
    # results, ranks running it), then the payload's own bytes: never copied per node)
    MEMORY = 9  # hub -> kernel: a rank's resident memory (RSS), looked at once a second, sent
    # when it moved (``memory_moved``)
    PORT = 10  # kernel -> hub: a port free on this node at the address given (utf-8); the
    # answer, hub -> kernel: ``PORT_NUMBER``
    FORK = 11  # kernel -> hub: fork pool workers again (the pickled list of their ``WorkerSpec``s,
    # the ranks of dead ones); the answer, hub -> kernel: the pickled list of their pids, or
    # a str saying why they could not be forked


ANSWERED = (Frame.PORT, Frame.FORK)  # the questions, whose answers come back in the same kind


OUTPUTS = (Frame.STDOUT, Frame.STDERR, Frame.CONTROL, Frame.EVENTS)  # a rank's channels, in order


def hello(token: bytes, index: int, channel: int = 0) -> bytes:
    """The first bytes on a connection to the kernel (or its relay)."""
    return HELLO.pack(token, index, channel)


def memory_moved(before: int | None, now: int | None) -> bool:
    """Whether a rank's memory figure ``now`` is news after ``before`` (a few pages more or less
    are not: a hub would send it, the kernel's views would redraw, for nothing). The kernel
    applies the same rule to the figures it samples itself (a local launch's)."""
    return bool(now) and (before is None or abs(now - before) > before * MEMORY_MOVED)


def frame(kind: Frame, rank: int, data: bytes = b"") -> bytes:
    """One frame."""
    return HEADER.pack(kind, rank, len(data)) + data


def run_frame(node: int, payload: bytes, with_result: set[int],
              targets: set[int]) -> tuple[bytes, ...]:
    """A ``RUN`` frame for ``node``'s ``targets`` as parts to write in order: the payload is
    one of them, as it is (every node's frame holds the same bytes, not a copy)."""
    sets = pickle.dumps((with_result, targets))
    head = HEADER.pack(Frame.RUN, node, RUN_HEAD.size + len(sets) + len(payload))
    return head, RUN_HEAD.pack(len(sets)), sets, payload


def read_run(body: bytes) -> tuple[bytes, set[int], set[int]]:
    """A ``RUN`` frame's data: (the payload, the ranks sending results, the ranks running it)."""
    (size,) = RUN_HEAD.unpack_from(body)
    with_result, targets = pickle.loads(body[RUN_HEAD.size:RUN_HEAD.size + size])
    return body[RUN_HEAD.size + size:], with_result, targets


class FrameParser:
    """Reassembles frames from what a connection delivers, in order."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Frame, int, bytes]]:
        """The frames complete now: (kind, rank, data)."""
        self.buffer += data
        buffer, start, end, frames = self.buffer, 0, len(self.buffer), []
        while end - start >= HEADER.size:
            kind, rank, size = HEADER.unpack_from(buffer, start)
            stop = start + HEADER.size + size
            if stop > end:
                break
            frames.append((Frame(kind), rank, bytes(buffer[start + HEADER.size:stop])))
            start = stop
        if start:
            del buffer[:start]
        return frames
