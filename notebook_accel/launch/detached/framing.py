"""One message on a detached pool's socket, either way: a JSON line, then its body's bytes.

The line says what the message is (a request's ``token`` and ``op``; an answer's ``ok`` and
``value`` or ``error``) and ``size``, the length of the bytes that follow (0: none). A run's
payload travels as the body, as the pool would send it to its workers (cloudpickled once, in
the kernel); a keeper's answer that holds Python objects (a value, a raised error, output)
travels as a cloudpickled body.
"""

from __future__ import annotations

import json
import socket
from typing import Any, BinaryIO

LINE_BYTES = 1 << 16  # a message's JSON line, at most


def send(connection: socket.socket, head: dict[str, Any], body: bytes = b"") -> None:
    """Send one message: ``head`` (``size`` added) as a JSON line, then ``body``."""
    connection.sendall(json.dumps({**head, "size": len(body)}).encode() + b"\n" + body)


def receive(stream: BinaryIO) -> tuple[dict[str, Any] | None, bytes]:
    """Read one message from ``stream`` (a socket's ``makefile("rb")``).

    Returns:
        Its head (None: the other side closed first) and its body.
    Raises:
        ValueError: not a message (not a JSON object, or a body cut short).
    """
    line = stream.readline(LINE_BYTES)
    if not line:
        return None, b""
    head = json.loads(line)
    if not isinstance(head, dict):
        raise ValueError("not a message: a JSON object was expected")
    size = int(head.get("size") or 0)
    body = stream.read(size) if size else b""
    if len(body) != size:
        raise ValueError(f"a message cut short: {len(body)} of {size} bytes")
    return head, body
