"""The one wire protocol between a worker and the kernel that launched it.

Besides its stdout and stderr (relayed as text), a worker sends *messages*, each of
one :class:`Kind`, over two private channels:

- the **control** channel (reliable, blocking): the outcome (:class:`Result` or
  :class:`FailureRecord`) and rank 0's rich displays (:class:`Display`); never
  dropped, delivered in order;
- the **events** channel (lossy, never blocks training): :class:`Progress`,
  :class:`Metrics`, :class:`Memory`, :class:`Dropped` and :class:`RichHidden`; small (one atomic pipe
  write each), coalesced or dropped and counted when the kernel lags.

A warm pool's worker (``launch/pools/pool.py``) also reads a third, **commands** channel
from the kernel: :class:`Run` (run this payload); after each run's outcome it sends
:class:`RunDone` on its control channel (it stays up, idle, for the next run). The same
channel carries the stop button's :class:`StopAsk` / :class:`StopAt`, the live stacks'
:class:`StackAsk` and the debugger's :class:`InputLine` (answering its :class:`InputAsk`).

One framing for all (``framing.py``: :func:`encode` and :func:`send` write it,
:class:`FrameReader` reads it): an 8-byte little-endian length, then a pickle of
``(kind value, timestamp, field values)``. One clock: every timestamp is ``time.time()``
of the process that made it (the sender for a message, the kernel for an exit it
observed), so ranks' times compare and a record reads as a date; durations and
deadlines use ``time.monotonic()`` locally and never travel.

Adding a message kind: a member of :class:`Kind` and its class in ``messages.py``, declared
with ``@message(Kind.X)`` (reliable) or ``@event(Kind.X)`` (lossy; a field the plain dict
of ``events.emit`` gives otherwise than by its name says how with ``read``); then its sender
(``events.emit(Kind.X, {...})`` or the worker's ``_send(pipes, X(...))``) and its one
consumer in the kernel (``LaunchRecord.apply`` for events, ``Supervisor._read_control``
for control messages).
"""

from notebook_accel.wire.framing import (
    HEADER,
    FrameReader,
    decode,
    encode,
    encode_data,
    receive,
    send,
    send_encoded,
)
from notebook_accel.wire.messages import (
    Collective,
    DebugEnd,
    Display,
    Dropped,
    FailureRecord,
    InputAsk,
    InputLine,
    Kind,
    Memory,
    Message,
    Metrics,
    Phase,
    Progress,
    Result,
    RichHidden,
    Run,
    RunDone,
    Stack,
    StackAsk,
    StopAsk,
    StopAt,
    StopCount,
)

__all__ = [
    "HEADER", "Collective", "DebugEnd", "Display", "Dropped", "FailureRecord", "FrameReader",
    "InputAsk", "InputLine", "Kind", "Memory", "Message", "Metrics", "Phase", "Progress", "Result",
    "RichHidden", "Run", "RunDone", "Stack", "StackAsk", "StopAsk", "StopAt", "StopCount",
    "decode", "encode", "encode_data", "receive", "send", "send_encoded",
]
