"""The one wire protocol between a worker and the kernel that launched it.

Besides its stdout and stderr (relayed as text), a worker sends *messages*, each of
one :class:`Kind`, over two private channels:

- the **control** channel (reliable, blocking): the outcome (:class:`Result` or
  :class:`FailureRecord`) and rank 0's rich displays (:class:`Display`); never
  dropped, delivered in order;
- the **events** channel (lossy, never blocks training): :class:`Progress`,
  :class:`Metrics`, :class:`Memory`, :class:`Dropped` and :class:`RichHidden`; small (one atomic pipe
  write each), coalesced or dropped and counted when the kernel lags.

A warm pool's worker (``launch/pool.py``) also reads a third, **commands** channel
from the kernel: :class:`Run` (run this payload); after each run's outcome it sends
:class:`RunDone` on its control channel (it stays up, idle, for the next run). The same
channel carries the stop button's :class:`StopAsk` / :class:`StopAt`, the live stacks'
:class:`StackAsk` and the debugger's :class:`InputLine` (answering its :class:`InputAsk`).

One framing for all (:func:`encode` and :func:`send` write it, :class:`FrameReader`
reads it): an 8-byte little-endian length, then a pickle of ``(kind value, timestamp,
field values)``. One clock:
every timestamp is ``time.time()`` of the process that made it (the sender for a
message, the kernel for an exit it observed), so ranks' times compare and a record
reads as a date; durations and deadlines use ``time.monotonic()`` locally and never
travel.

Adding a message kind: a member of :class:`Kind` (and, if reliable, of ``_RELIABLE``)
and a dataclass with ``kind`` set to it, registered with ``@_message`` (an event kind
also has ``fields_of``, from the plain dict ``events.emit`` takes); then its sender
(``events.emit(Kind.X, {...})`` or the worker's ``_send(pipes, X(...))``) and its one
consumer in the kernel (``LaunchRecord.apply`` for events, ``Supervisor._read_control``
for control messages).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pickle
import signal
import struct
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

HEADER = struct.Struct("<Q")
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_BIG = 1 << 16  # frames at least this long are decoded in place, not copied first


class Kind(str, enum.Enum):
    """Every kind of message a worker sends (a ``str``: ``Kind.METRICS == "metrics"``)."""

    PROGRESS = "progress"  # a progress bar's state (notebook_accel.tqdm)
    METRICS = "metrics"  # numeric values logged at a step (Accelerator.log)
    MEMORY = "memory"  # the worker's reserved GPU memory
    PHASE = "phase"  # the worker entered a phase ("compiling") or left it (None)
    DROPPED = "dropped"  # how many events the worker dropped because the kernel lagged
    RICH_HIDDEN = "rich_hidden"  # a non-main rank displayed rich output with no useful text form
    DISPLAY = "display"  # a rich display of rank 0 (display(), plt.show())
    RESULT = "result"  # the function returned; its pickled value
    ERROR = "error"  # the function raised (or could not send its value): a FailureRecord
    RUN = "run"  # kernel -> a pool worker: run this payload (the pool's commands channel)
    RUN_DONE = "run_done"  # a pool worker finished a run (after its result or failure)
    STOP_ASK = "stop_ask"  # kernel -> a pool worker: the stop button; say where you are
    STOP_COUNT = "stop_count"  # a pool worker's answer: its collective counts, its stack
    STOP_AT = "stop_at"  # kernel -> a pool worker: wait at this cut (None: stop now)
    STACK_ASK = "stack_ask"  # kernel -> a pool worker: send your main thread's stack now
    STACK = "stack"  # a pool worker's answer: its main thread's stack, its collective count
    INPUT_ASK = "input_ask"  # a pool worker's debugger waits for a line (its prompt)
    INPUT_LINE = "input_line"  # kernel -> a pool worker: the line typed at its debugger's prompt
    DEBUG_END = "debug_end"  # a pool worker's debugger session ended (continue, quit)

    @property
    def reliable(self) -> bool:
        """True: sent on the control channel (never dropped); False: on the events channel."""
        return self in _RELIABLE


_RELIABLE = frozenset({Kind.DISPLAY, Kind.RESULT, Kind.ERROR, Kind.RUN, Kind.RUN_DONE,
                       Kind.STOP_ASK, Kind.STOP_COUNT, Kind.STOP_AT, Kind.STACK_ASK, Kind.STACK,
                       Kind.INPUT_ASK, Kind.INPUT_LINE, Kind.DEBUG_END})

_TYPES: dict[str, type] = {}  # Kind value -> message class
_FIELDS: dict[type, tuple[str, ...]] = {}  # message class -> its fields in wire order


def _message(cls: type) -> type:
    """Register a message class under its ``kind``."""
    _TYPES[cls.kind.value] = cls
    _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.name != "timestamp")
    return cls


# ---- the messages ---------------------------------------------------------------------------

@_message
@dataclass(slots=True)
class Progress:
    """A progress bar's state (see ``EventTqdm.state``): id, n, total, desc, rate, closed..."""

    kind: ClassVar[Kind] = Kind.PROGRESS
    state: dict[str, Any]
    timestamp: float = field(default=0.0, kw_only=True)

    @staticmethod
    def fields_of(data: dict[str, Any]) -> tuple:
        return (data,)


@_message
@dataclass(slots=True)
class Metrics:
    """Numeric values logged at ``step`` (None: no step given)."""

    kind: ClassVar[Kind] = Kind.METRICS
    step: int | None
    values: dict[str, float]
    timestamp: float = field(default=0.0, kw_only=True)

    @staticmethod
    def fields_of(data: dict[str, Any]) -> tuple:
        return (data.get("step"), data.get("values") or {})


@_message
@dataclass(slots=True)
class Memory:
    """The worker's reserved GPU memory, in bytes."""

    kind: ClassVar[Kind] = Kind.MEMORY
    gpu: int | None
    timestamp: float = field(default=0.0, kw_only=True)

    @staticmethod
    def fields_of(data: dict[str, Any]) -> tuple:
        return (data.get("gpu"),)


@_message
@dataclass(slots=True)
class Phase:
    """The worker entered the phase ``name`` (``"compiling"``: torch.compile at work), or left it (None)."""

    kind: ClassVar[Kind] = Kind.PHASE
    name: str | None
    timestamp: float = field(default=0.0, kw_only=True)

    @staticmethod
    def fields_of(data: dict[str, Any]) -> tuple:
        return (data.get("name"),)


@_message
@dataclass(slots=True)
class Dropped:
    """``count`` events were dropped in the worker (sent once, when its function returns)."""

    kind: ClassVar[Kind] = Kind.DROPPED
    count: int
    timestamp: float = field(default=0.0, kw_only=True)

    @staticmethod
    def fields_of(data: dict[str, Any]) -> tuple:
        return (int(data.get("count", 0)),)


@_message
@dataclass(slots=True)
class RichHidden:
    """A non-main rank made ``count`` rich displays whose only text is a default repr
    (``<IPython.core.display.HTML object>``): counted, never printed."""

    kind: ClassVar[Kind] = Kind.RICH_HIDDEN
    count: int
    timestamp: float = field(default=0.0, kw_only=True)

    @staticmethod
    def fields_of(data: dict[str, Any]) -> tuple:
        return (int(data.get("count", 1)),)


@_message
@dataclass(slots=True)
class Display:
    """One display of rank 0, as IPython's ``DisplayPublisher.publish`` takes it."""

    kind: ClassVar[Kind] = Kind.DISPLAY
    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    transient: dict[str, Any] = field(default_factory=dict)
    update: bool = False
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(slots=True)
class Result:
    """The function returned: its value pickled (None when the kernel does not want it)."""

    kind: ClassVar[Kind] = Kind.RESULT
    value: bytes | None
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(frozen=True, slots=True)
class FailureRecord:
    """How one rank failed (as torch elastic's ``ProcessFailure``).

    A worker that raises sends one (``exitcode`` the code it exits with); the kernel
    makes one for a rank that died without reporting (a signal, ``os._exit``) and sets
    the exit code it observed. ``WorkerError`` carries the root cause's and the others'.

    Attributes:
        rank: the global rank.
        pid: its process id (None if it never started).
        exitcode: its exit status; negative: killed by that signal (see :attr:`signal`);
            None: it was still running (a timeout).
        exc_type: the exception's class name (``"ValueError"``), None when it died
            without a Python exception.
        headline: one line: ``"ValueError: bad shape"``, ``"was killed by SIGKILL"``.
        traceback: the worker's own traceback (or the last lines of its stderr).
        timestamp: ``time.time()`` when it failed (the worker's clock for a raised
            exception, the kernel's for an exit it observed).
        secondary: the error looks like a consequence of another rank's failure
            (a broken collective); such failures are not the root cause.
    """

    kind: ClassVar[Kind] = Kind.ERROR
    rank: int
    pid: int | None
    exitcode: int | None
    exc_type: str | None
    headline: str
    traceback: str = ""
    secondary: bool = False
    timestamp: float = field(default=0.0, kw_only=True)

    @property
    def signal(self) -> int | None:
        """The signal that killed the rank, if one did."""
        return -self.exitcode if self.exitcode is not None and self.exitcode < 0 else None

    @property
    def signal_name(self) -> str | None:
        """``"SIGKILL"`` and the like (None when no signal killed it)."""
        number = self.signal
        if number is None:
            return None
        try:
            return signal.Signals(number).name
        except ValueError:
            return f"signal {number}"

    def __str__(self) -> str:
        """One line: ``rank 1: RuntimeError: rank 1 gave up``."""
        first = self.headline.splitlines()[0] if self.headline else "failed"
        return f"rank {self.rank}: {textwrap.shorten(first, 300, placeholder=' …')}"


@_message
@dataclass(slots=True)
class Run:
    """Kernel -> a warm pool worker: run this payload (``serialise_payload``'s bytes) now.

    ``send_result``: this rank sends its return value back (rank 0, or all with ``return_all``).
    """

    kind: ClassVar[Kind] = Kind.RUN
    payload: bytes
    send_result: bool
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(slots=True)
class RunDone:
    """A pool worker ended a run (sent after its :class:`Result` or :class:`FailureRecord`);
    it is idle again, its Python state kept.

    Attributes:
        collectives: the collectives its default process group has issued so far (None: no
            group; -1: a group that does not count them); ranks that differ cannot share it.
        broke_group: the run ended inside a collective (an interrupt or a broken peer there):
            the group may pair later collectives wrongly and must not be used again.
        names: the names living in its namespace (what later runs see).
        copies: those still holding the copy the notebook sent (no run assigned them).
        imported: those holding no state of their own (modules, imported functions and
            classes): what a replacement loses is ``names`` without them.
    """

    kind: ClassVar[Kind] = Kind.RUN_DONE
    collectives: int | None
    broke_group: bool
    names: tuple[str, ...] = ()
    copies: tuple[str, ...] = ()
    imported: tuple[str, ...] = ()
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(slots=True)
class StopAsk:
    """Kernel -> a pool worker, during a run: the stop button was pressed; say where you are
    (answered by the worker's reader thread, even while its main thread is in a collective)."""

    kind: ClassVar[Kind] = Kind.STOP_ASK
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(slots=True)
class StopCount:
    """A pool worker's answer to :class:`StopAsk`.

    Attributes:
        counts: collectives issued per process group (group name -> count; None: a group
            that does not count them).
        where: its main thread's stack, ``(file, line, instruction)`` per frame.
        in_user_code: the innermost frame is the user's own code (not a library's, such as a
            collective's wait).
        seen: its collective count on the cut's groups at the last point of the user's code
            its main thread looked at, watching for the cut (None: not watching yet); a cut
            at or below it was crossed before this rank knew it.
        waiting_at: the cut (its total) at which its main thread waits for the word to stop
            (None: not waiting).
    """

    kind: ClassVar[Kind] = Kind.STOP_COUNT
    counts: dict[str, int] | None
    where: tuple[tuple[str, int, int], ...]
    in_user_code: bool = False
    seen: int | None = None
    waiting_at: int | None = None
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(slots=True)
class StopAt:
    """Kernel -> a pool worker: wait at the first point of the user's code once the
    collectives issued on ``groups`` add up to ``total`` (a later one moves the cut on);
    ``groups`` None: stop now (where it waits, if it waits at the cut)."""

    kind: ClassVar[Kind] = Kind.STOP_AT
    groups: tuple[str, ...] | None
    total: int = 0
    timestamp: float = field(default=0.0, kw_only=True)


class Collective(NamedTuple):
    """One collective a rank issued, as its flight recorder holds it
    (``launch/worker/flight_recorder.py``).

    Attributes:
        number: its group's sequence number (the backend's count, the stop cut's).
        group: the group's name (``default``, a sub-group's description or number).
        op: ``all_reduce``, ``broadcast``...
        tensors: each input tensor as ``float32[1024]``.
        where: the first frame of the user's code that called it (file, line, function).
        started: when it was issued (``time.time()``).
        ended: when it was seen to end (None: not known, or not ended).
        done: it ended (False: the rank still waits in it).
    """

    number: int
    group: str
    op: str
    tensors: tuple[str, ...]
    where: tuple[str, int, str] | None
    started: float
    ended: float | None
    done: bool


@_message
@dataclass(slots=True)
class StackAsk:
    """Kernel -> a pool worker, at any time: send your main thread's stack (answered by the
    worker's reader thread, whatever the main thread does). ``ask``: the kernel's number for
    this request, echoed in the answer (an answer that arrives after its asker stopped
    reading must not pass for the answer to a later request). ``recorder``: send the last
    collectives too (at most that many per group; 0: none), with the user's line each was
    called from when ``recorder_lines`` (a process's first such read takes about a second)."""

    kind: ClassVar[Kind] = Kind.STACK_ASK
    ask: int = 0
    recorder: int = 0
    recorder_lines: bool = True
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(slots=True)
class Stack:
    """A pool worker's answer to :class:`StackAsk`.

    Attributes:
        frames: its main thread's stack, ``(file, line, function)`` per frame, innermost last.
        collectives: the collectives its default process group has issued (as
            :attr:`RunDone.collectives`).
        ask: the :attr:`StackAsk.ask` it answers.
        recorder: its last collectives, oldest first (None: not asked for, by
            :attr:`StackAsk.recorder`).
    """

    kind: ClassVar[Kind] = Kind.STACK
    frames: tuple[tuple[str, int, str], ...]
    collectives: int | None = None
    ask: int = 0
    recorder: tuple[Collective, ...] | None = None
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(slots=True)
class InputAsk:
    """A pool worker's debugger (``breakpoint()``, a post-mortem) waits for one line, showing
    ``prompt``; its output so far is in its stdout pipe."""

    kind: ClassVar[Kind] = Kind.INPUT_ASK
    prompt: str
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(slots=True)
class InputLine:
    """Kernel -> a pool worker: the line typed at its debugger's prompt (None: no more input,
    as at the end of a file)."""

    kind: ClassVar[Kind] = Kind.INPUT_LINE
    text: str | None
    timestamp: float = field(default=0.0, kw_only=True)


@_message
@dataclass(slots=True)
class DebugEnd:
    """A pool worker's debugger session ended (``c``, ``q``): its rank runs on."""

    kind: ClassVar[Kind] = Kind.DEBUG_END
    timestamp: float = field(default=0.0, kw_only=True)


Message = (Progress | Metrics | Memory | Dropped | RichHidden | Display | Result | FailureRecord
           | Run | RunDone | StopAsk | StopCount | StopAt | StackAsk | Stack | InputAsk
           | InputLine | DebugEnd)
"""Any message on the wire (all from a worker, except :class:`Run`, :class:`StopAsk`,
:class:`StopAt`, :class:`StackAsk` and :class:`InputLine`)."""


# ---- the framing -------------------------------------------------------------------------------

def _body(message: Message) -> bytes:
    values = tuple(getattr(message, name) for name in _FIELDS[type(message)])
    return pickle.dumps((message.kind.value, message.timestamp or time.time(), values),
                        protocol=_PROTOCOL)


def encode(message: Message) -> bytes:
    """One framed message; stamped with ``time.time()`` now unless it has a timestamp."""
    body = _body(message)
    return HEADER.pack(len(body)) + body


def encode_data(kind: Kind | str, data: dict[str, Any]) -> bytes:
    """One framed event message of ``kind`` from its plain-dict form (``events.emit``'s),
    without building the message object (the worker's hot path); stamped now.

    Raises:
        ValueError: ``kind`` is not a kind of event (an unknown or a control kind).
    """
    try:
        value, fields_of = _EVENT_FIELDS[kind._value_ if type(kind) is Kind else kind]
    except (KeyError, TypeError):
        raise ValueError(f"{kind!r} is not a kind of event; choose from "
                         f"{[k.value for k in Kind if not k.reliable]}") from None
    body = _dumps((value, _now(), fields_of(data)), _PROTOCOL)
    return _pack(len(body)) + body


_dumps, _now, _pack = pickle.dumps, time.time, HEADER.pack  # bound once: the hot path


_EVENT_FIELDS = {  # the value of a kind of event -> (that value, its fields from a plain dict)
    cls.kind.value: (cls.kind.value, cls.fields_of)
    for cls in _TYPES.values() if not cls.kind.reliable
}


def _decode(body: bytes | memoryview) -> Message | None:
    kind, timestamp, values = pickle.loads(body)
    cls = _TYPES.get(kind)
    return None if cls is None else cls(*values, timestamp=timestamp)


def decode(frame: bytes) -> Message:
    """The message in one frame (as made by :func:`encode`)."""
    (size,) = HEADER.unpack_from(frame)
    message = _decode(frame[HEADER.size:HEADER.size + size])
    if message is None:
        raise ValueError("a frame of an unknown message kind")
    return message


class FrameReader:
    """The kernel's end of a channel: reassembles messages from non-blocking reads.

    Frames of kinds this version does not know are skipped.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.open = True

    def read(self) -> tuple[list[Message], bool]:
        """Returns (the messages complete now, the channel is still open)."""
        self._fill()
        messages = []
        buffer, start, end = self.buffer, 0, len(self.buffer)
        while end - start >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, start)
            stop = start + HEADER.size + size
            if stop > end:
                break
            if size < _BIG:
                message = _decode(buffer[start + HEADER.size:stop])
            else:  # a large result or display: no copy of it before unpickling
                with memoryview(buffer) as whole, whole[start + HEADER.size:stop] as body:
                    message = _decode(body)
            if message is not None:
                messages.append(message)
            start = stop
        if start:
            del buffer[:start]
        return messages, self.open

    def _fill(self) -> None:
        """Append what the channel holds now to ``buffer``; ``open`` False at its end."""
        while self.open:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.open = False
                break
            self.buffer += chunk


def send(fd: int, *messages: Message) -> None:
    """Write messages to a blocking ``fd`` (the control channel), each stamped now unless it
    has a timestamp; the caller keeps other writers of ``fd`` out meanwhile. Small ones
    go in one write (one wake-up of the reader)."""
    pending = bytearray()
    for message in messages:
        body = _body(message)
        pending += HEADER.pack(len(body))
        if len(body) < _BIG:
            pending += body
            continue
        _write_all(fd, pending)
        pending = bytearray()
        _write_all(fd, body)  # not joined to its header: a large result is not copied again
    if pending:
        _write_all(fd, pending)


def receive(fd: int) -> Message | None:
    """Read one message from a blocking ``fd`` (a pool worker's commands channel); None once
    the other end is closed (or a frame of an unknown kind arrived)."""
    header = _read_exactly(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    body = _read_exactly(fd, size)
    return None if body is None else _decode(body)


def _read_exactly(fd: int, size: int) -> bytearray | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
