"""The framing of the wire protocol: an 8-byte little-endian length, then a pickle of
``(kind value, timestamp, field values)``; :func:`encode` and :func:`send` write it,
:class:`FrameReader`, :func:`decode` and :func:`receive` read it."""

from __future__ import annotations

import os
import pickle
import struct
import time
from typing import Any

from notebook_accel.wire.messages import EVENT_FIELDS, FIELDS, TYPES, Kind, Message

HEADER = struct.Struct("<Q")
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_BIG = 1 << 16  # frames at least this long are decoded in place, not copied first

def _body(message: Message) -> bytes:
    values = tuple(getattr(message, name) for name in FIELDS[type(message)])
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
        value, fields_of = EVENT_FIELDS[kind._value_ if type(kind) is Kind else kind]
    except (KeyError, TypeError):
        raise ValueError(f"{kind!r} is not a kind of event; choose from "
                         f"{[k.value for k in Kind if not k.reliable]}") from None
    body = _dumps((value, _now(), fields_of(data)), _PROTOCOL)
    return _pack(len(body)) + body


_dumps, _now, _pack = pickle.dumps, time.time, HEADER.pack  # bound once: the hot path


def _decode(body: bytes | memoryview) -> Message | None:
    kind, timestamp, values = pickle.loads(body)
    cls = TYPES.get(kind)
    return None if cls is None else cls(*values, timestamp=timestamp)


def decode(frame: bytes) -> Message:
    """The message in one frame (as made by :func:`encode`)."""
    (size,) = HEADER.unpack_from(frame)
    message = _decode(frame[HEADER.size:HEADER.size + size])
    if message is None:
        raise ValueError("a frame of an unknown message kind")
    return message


_READ = 1 << 20  # bytes a read of a channel asks for


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
        """Append what the channel holds now to ``buffer``; ``open`` False at its end (seen by
        the read after a short one: a short read took all there was, and what comes later, or
        the end, makes the channel ready again)."""
        while self.open:
            try:
                chunk = os.read(self.fd, _READ)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.open = False
                break
            self.buffer += chunk
            if len(chunk) < _READ:
                break


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


def send_encoded(fd: int, frame: bytes) -> None:
    """Write a frame :func:`encode` made to a blocking ``fd`` (one message encoded once for
    several receivers: a pool run's ``Run``)."""
    _write_all(fd, frame)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
