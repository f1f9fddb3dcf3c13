"""The messages of the wire protocol (:mod:`notebook_accel.wire`), each declared once.

A message is a slotted dataclass declared with :func:`message` (reliable: the control or the
commands channel) or :func:`event` (lossy: the events channel, also made from the plain dict
``events.emit`` takes, field by field: ``data.get(name)`` unless the field says otherwise with
:func:`read`). The declaration gives it its :class:`Kind` (``kind``), a keyword-only
``timestamp`` and its place in the registry the framing encodes and decodes by.
"""

from __future__ import annotations

import dataclasses
import enum
import signal
import textwrap
from collections.abc import Callable
from dataclasses import field
from typing import Any, ClassVar, NamedTuple


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
        """True: sent on the control channel (never dropped); False: on the events channel
        (declared with :func:`event`)."""
        return self._value_ not in EVENT_FIELDS


class Message:
    """Any message on the wire (all from a worker, except :class:`Run`, :class:`StopAsk`,
    :class:`StopAt`, :class:`StackAsk` and :class:`InputLine`)."""

    __slots__ = ()
    kind: ClassVar[Kind]
    timestamp: float  # the sender's time.time() (0.0 until the framing stamps it)


TYPES: dict[str, type[Message]] = {}  # Kind value -> its message class
FIELDS: dict[type[Message], tuple[str, ...]] = {}  # message class -> its fields in wire order
EVENT_FIELDS: dict[str, tuple[str, Callable[[dict[str, Any]], tuple]]] = {}
"""A kind of event's value -> (that value, its fields in wire order from ``events.emit``'s dict)."""

_READ = "wire.read"  # a field's metadata key: how an event's dict gives it


def read(convert: Callable[[Any], Any] | None = None, *, missing: Any = None,
         whole: bool = False) -> Any:
    """An event's field that its plain dict gives otherwise than ``data.get(name)``:
    ``convert`` applied to it, ``missing`` when absent, or the ``whole`` dict."""
    return field(metadata={_READ: (convert, missing, whole)})


def message(kind: Kind, *, frozen: bool = False) -> Callable[[type], type]:
    """Declare the reliable message class of ``kind`` (a slotted dataclass, ``frozen`` or not)."""
    def declare(cls: type) -> type:
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        annotations["timestamp"] = "float"
        cls.__annotations__ = annotations
        cls.timestamp = field(default=0.0, kw_only=True)  # type: ignore[attr-defined]
        cls.kind = kind  # type: ignore[attr-defined]
        made = dataclasses.dataclass(frozen=frozen, slots=True)(cls)
        TYPES[kind.value] = made
        FIELDS[made] = tuple(f.name for f in dataclasses.fields(made) if f.name != "timestamp")
        return made
    return declare


def event(kind: Kind) -> Callable[[type], type]:
    """Declare the event class of ``kind`` (as :func:`message`, and made from a plain dict)."""
    def declare(cls: type) -> type:
        made = message(kind)(cls)
        rules = [(f.name, *f.metadata.get(_READ, (None, None, False)))
                 for f in dataclasses.fields(made) if f.name != "timestamp"]
        EVENT_FIELDS[kind.value] = (kind.value, _fields_reader(rules))
        return made
    return declare


def _fields_reader(rules: list[tuple[str, Any, Any, bool]]) -> Callable[[dict[str, Any]], tuple]:
    """An event's plain dict -> its fields in wire order, as :func:`read` says for each.

    Compiled once per event class (as ``dataclasses`` compiles ``__init__``), so the worker's
    hot path (``events.emit``) runs what a hand-written ``(data.get("step"), ...)`` would.
    """
    names: dict[str, Any] = {}
    parts = []
    for number, (name, convert, missing, whole) in enumerate(rules):
        if whole:
            parts.append("data")
            continue
        names[f"missing{number}"] = missing
        part = f"data.get({name!r}, missing{number})"
        if convert is not None:
            names[f"convert{number}"] = convert
            part = f"convert{number}({part})"
        parts.append(part)
    exec(f"def fields_of(data):\n    return ({', '.join(parts)},)", names)
    return names["fields_of"]


@event(Kind.PROGRESS)
class Progress(Message):
    """A progress bar's state (see ``EventTqdm.state``): id, n, total, desc, rate, closed..."""

    state: dict[str, Any] = read(whole=True)


@event(Kind.METRICS)
class Metrics(Message):
    """Numeric values logged at ``step`` (None: no step given)."""

    step: int | None
    values: dict[str, float] = read(lambda values: values or {})


@event(Kind.MEMORY)
class Memory(Message):
    """The worker's reserved GPU memory, in bytes."""

    gpu: int | None


@event(Kind.PHASE)
class Phase(Message):
    """The worker entered the phase ``name`` (``"compiling"``: torch.compile at work), or left it (None)."""

    name: str | None


@event(Kind.DROPPED)
class Dropped(Message):
    """``count`` events were dropped in the worker (sent once, when its function returns)."""

    count: int = read(int, missing=0)


@event(Kind.RICH_HIDDEN)
class RichHidden(Message):
    """A non-main rank made ``count`` rich displays whose only text is a default repr
    (``<IPython.core.display.HTML object>``): counted, never printed."""

    count: int = read(int, missing=1)


@message(Kind.DISPLAY)
class Display(Message):
    """One display of rank 0, as IPython's ``DisplayPublisher.publish`` takes it."""

    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    transient: dict[str, Any] = field(default_factory=dict)
    update: bool = False


@message(Kind.RESULT)
class Result(Message):
    """The function returned: its value pickled (None when the kernel does not want it)."""

    value: bytes | None


@message(Kind.ERROR, frozen=True)
class FailureRecord(Message):
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

    rank: int
    pid: int | None
    exitcode: int | None
    exc_type: str | None
    headline: str
    traceback: str = ""
    secondary: bool = False

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


@message(Kind.RUN)
class Run(Message):
    """Kernel -> a warm pool worker: run this payload (``serialise_payload``'s bytes) now.

    ``send_result``: this rank sends its return value back (rank 0, or all with ``return_all``).
    """

    payload: bytes
    send_result: bool


@message(Kind.RUN_DONE)
class RunDone(Message):
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

    collectives: int | None
    broke_group: bool
    names: tuple[str, ...] = ()
    copies: tuple[str, ...] = ()
    imported: tuple[str, ...] = ()


@message(Kind.STOP_ASK)
class StopAsk(Message):
    """Kernel -> a pool worker, during a run: the stop button was pressed; say where you are
    (answered by the worker's reader thread, even while its main thread is in a collective)."""



@message(Kind.STOP_COUNT)
class StopCount(Message):
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

    counts: dict[str, int] | None
    where: tuple[tuple[str, int, int], ...]
    in_user_code: bool = False
    seen: int | None = None
    waiting_at: int | None = None


@message(Kind.STOP_AT)
class StopAt(Message):
    """Kernel -> a pool worker: wait at the first point of the user's code once the
    collectives issued on ``groups`` add up to ``total`` (a later one moves the cut on);
    ``groups`` None: stop now (where it waits, if it waits at the cut)."""

    groups: tuple[str, ...] | None
    total: int = 0


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


Collective.__module__ = __package__  # pickled inside a Stack by its public name (notebook_accel.wire)


@message(Kind.STACK_ASK)
class StackAsk(Message):
    """Kernel -> a pool worker, at any time: send your main thread's stack (answered by the
    worker's main thread between runs, by its reader thread during one, whatever the main thread
    does). ``ask``: the kernel's number for
    this request, echoed in the answer (an answer that arrives after its asker stopped
    reading must not pass for the answer to a later request). ``recorder``: send the last
    collectives too (at most that many per group; 0: none), with the user's line each was
    called from when ``recorder_lines`` (a process's first such read takes about a second)."""

    ask: int = 0
    recorder: int = 0
    recorder_lines: bool = True


@message(Kind.STACK)
class Stack(Message):
    """A pool worker's answer to :class:`StackAsk`.

    Attributes:
        frames: its main thread's stack, ``(file, line, function)`` per frame, innermost last.
        collectives: the collectives its default process group has issued (as
            :attr:`RunDone.collectives`).
        ask: the :attr:`StackAsk.ask` it answers.
        recorder: its last collectives, oldest first (None: not asked for, by
            :attr:`StackAsk.recorder`).
    """

    frames: tuple[tuple[str, int, str], ...]
    collectives: int | None = None
    ask: int = 0
    recorder: tuple[Collective, ...] | None = None


@message(Kind.INPUT_ASK)
class InputAsk(Message):
    """A pool worker's debugger (``breakpoint()``, a post-mortem) waits for one line, showing
    ``prompt``; its output so far is in its stdout pipe."""

    prompt: str


@message(Kind.INPUT_LINE)
class InputLine(Message):
    """Kernel -> a pool worker: the line typed at its debugger's prompt (None: no more input,
    as at the end of a file)."""

    text: str | None


@message(Kind.DEBUG_END)
class DebugEnd(Message):
    """A pool worker's debugger session ended (``c``, ``q``): its rank runs on."""
