"""Where the nodes connect back to the kernel: one TCP connection per node (its hub's link).

The kernel listens on its own node address (as Ray sees it) on a free port, for one launch.
Every connection must open with the launch's 32-byte secret token (sent to the hubs through
Ray, never on this socket first): the links carry pickles, so a connection that cannot show
the token is closed unread. Generic in what it accepts: ``count`` peers, each with the
connections named by ``channels`` (a hub: its one link).
"""

from __future__ import annotations

import hmac
import secrets
import selectors
import socket
import time
from collections.abc import Callable

from notebook_accel.launch.worker.hub.hub_link import HELLO, LINK_CHANNELS

_HELLO_TIMEOUT = 5.0  # seconds a fresh connection has to say which node it is
CHECK_EVERY = 0.25  # seconds between two calls of ``check`` while connections arrive


class ChannelServer:
    """Accepts the ``channels`` of ``world_size`` peers (a launch's nodes) on ``host`` for
    ``owner`` (named when peers do not come)."""

    def __init__(self, host: str, world_size: int, channels: tuple[str, ...] = LINK_CHANNELS,
                 owner: str = "the kernel") -> None:
        self.token = secrets.token_bytes(32)
        self.owner = owner
        self.world_size = world_size
        self.channels = channels
        self._listener = socket.create_server((host, 0), backlog=5 * world_size + 8)
        self.address = (host, self._listener.getsockname()[1])

    def accept(self, deadline: float, check: Callable[[], None]) -> dict[int, dict[str, socket.socket]]:
        """Every rank's connections by channel name, once all arrived.

        Args:
            deadline: ``time.monotonic()`` by which all must have arrived.
            check: called at most every ``CHECK_EVERY`` seconds while connections arrive (not
                once per connection: thousands arrive); raises when a rank can no longer
                connect.
        Raises:
            TimeoutError: not all arrived by ``deadline``, naming the ranks missing.
        """
        got: dict[int, dict[str, socket.socket]] = {}
        expected = self.world_size * len(self.channels)
        count, checked = 0, float("-inf")
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            try:
                while count < expected:
                    if time.monotonic() - checked >= CHECK_EVERY:
                        check()
                        checked = time.monotonic()
                    if time.monotonic() > deadline:
                        missing = sorted(r for r in range(self.world_size)
                                         if len(got.get(r, {})) < len(self.channels))
                        raise TimeoutError(f"nodes {missing} did not connect back to {self.owner} "
                                           f"at {self.address[0]}:{self.address[1]}")
                    if not selector.select(0.1):
                        continue
                    conn, _ = self._listener.accept()
                    data = _read_hello(conn)
                    hello = self._check_hello(data) if data is not None else None
                    if hello is None:
                        conn.close()
                        continue
                    rank, channel = hello
                    conn.setblocking(True)
                    got.setdefault(rank, {})[channel] = conn
                    count += 1
            except BaseException:
                for channels in got.values():
                    for conn in channels.values():
                        conn.close()
                raise
        return got

    def _check_hello(self, data: bytes) -> tuple[int, str] | None:
        token, rank, index = HELLO.unpack(data)
        if not hmac.compare_digest(token, self.token) or rank >= self.world_size:
            return None
        if index >= len(self.channels):
            return None
        return rank, self.channels[index]

    def close(self) -> None:
        """Stop listening (accepted connections live on in their handles)."""
        self._listener.close()


def _read_hello(conn: socket.socket) -> bytes | None:
    conn.settimeout(_HELLO_TIMEOUT)
    data = b""
    try:
        while len(data) < HELLO.size:
            chunk = conn.recv(HELLO.size - len(data))
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    conn.settimeout(None)
    return data
