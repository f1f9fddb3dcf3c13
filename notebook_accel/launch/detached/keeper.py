"""The keeper of a detached pool: a process of its own session that owns the pool's workers.

Started by :func:`~notebook_accel.launch.detached.client.start_detached` as
``python -m notebook_accel.launch.detached.keeper NAME OPTIONS_JSON IDLE_TIMEOUT``: it leaves
the starter (a fork, so that the kernel is not its parent and never has to reap it), starts the
:class:`~notebook_accel.WorkerPool` (whose workers end with the keeper, as they would with a
kernel), then answers requests on its Unix socket (``framing.py``: one message each way, a
kernel's connection kept for its next requests), each connection on a thread of its own: ``info``, ``stop``, and the pool's runs and questions
(``pool_service.py``: a kernel's runs go through here, their output into rings on disk). A
connection is answered only if it comes from this user (``SO_PEERCRED``) and presents the
pool's token with its first request. It ends on ``stop``, on SIGTERM, or after
``idle_timeout`` seconds with no run and no connection (no kernel attached), writing why to its
log (its stdout).
"""

from __future__ import annotations

import hmac
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

from notebook_accel.contract import OPTIONS
from notebook_accel.launch.detached.framing import receive, send
from notebook_accel.launch.detached.pool_service import OPS, PoolService
from notebook_accel.launch.detached.runtime_dir import PoolFiles, pool_files

IDLE_TIMEOUT: float = OPTIONS["idle_timeout"].default  # seconds idle after which a keeper ends
_READ_TIMEOUT = 5.0  # seconds a connection has to send its request
_TICK = 0.5  # seconds between two looks at the stop and the idle time


class _Stopped(Exception):
    """SIGTERM: end as on ``stop``."""


def peer_uid(connection: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


class Keeper:
    """Serves one detached pool's socket (a thread per connection) until it is told to stop
    or stays idle too long: no run running and no connection open."""

    def __init__(self, files: PoolFiles, token: bytes, pool: Any, idle_timeout: float) -> None:
        self.files, self.token, self.pool = files, token, pool
        self.idle_timeout = idle_timeout
        self.since = time.time()
        self.service = PoolService(pool, files.output)
        self._stopping = threading.Event()
        self._open = 0  # connections being answered
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        """Name, pid, ranks, device, state, since, memory (``PoolService.describe``)."""
        return self.service.describe(self.files.name, self.since, self.idle_timeout)

    def serve(self, server: socket.socket) -> str:
        """Answer requests; returns why it stopped."""
        server.settimeout(_TICK)
        while not self._stopping.is_set():
            with self._lock:
                if self._open or self.service.running():
                    self._last = time.monotonic()
                idle = time.monotonic() - self._last
            if idle >= self.idle_timeout:
                return f"no run and no request for {self.idle_timeout:g} s (idle_timeout)"
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with self._lock:
                self._open += 1
            threading.Thread(target=self._connection, args=(connection,), daemon=True,
                             name="notebook_accel: keeper connection").start()
        return "stopped on request"

    def _connection(self, connection: socket.socket) -> None:
        try:
            with connection:
                self._answer(connection)
        finally:
            with self._lock:
                self._open -= 1
                self._last = time.monotonic()

    def _answer(self, connection: socket.socket) -> None:
        """Answer a connection's requests, one at a time, if it is this user's and its first
        request presents the pool's token."""
        uid = peer_uid(connection)
        if uid != os.getuid():
            _reply(connection, error=f"refused: detached pool {self.files.name!r} belongs to uid "
                                     f"{os.getuid()}, and this connection comes from uid {uid}")
            _log(f"refused a connection from uid {uid}")
            return
        stream = connection.makefile("rb")
        try:
            connection.settimeout(_READ_TIMEOUT)
            head, body = receive(stream)
            token, _ = str(head["token"]).encode(), head["op"]
        except (OSError, ValueError, KeyError, TypeError):
            _reply(connection, error="refused: not a request (a JSON line with token and op)")
            return
        if not hmac.compare_digest(token, self.token):
            _reply(connection, error=f"refused: wrong token for detached pool {self.files.name!r} "
                                     f"(the token is in {self.files.token})")
            _log("refused a connection with a wrong token")
            return
        connection.settimeout(None)  # (a kernel attached may ask nothing for hours)
        while head is not None and self._one(connection, head, body):
            try:
                head, body = receive(stream)
            except (OSError, ValueError):
                return

    def _one(self, connection: socket.socket, head: dict[str, Any], body: bytes) -> bool:
        """Answer one request; returns whether the connection goes on."""
        op = head.get("op")
        with self._lock:
            self._last = time.monotonic()
        if op == "info":
            return _reply(connection, value=self.info())
        if op == "stop":
            _reply(connection, value="stopping")
            self._stopping.set()
            return False
        if op in OPS:
            answer = self.service.answer(op, head, body)
            streamed = self.service.streamed()
            try:
                send(connection, {"ok": True}, answer)
            except OSError:
                if streamed is None:
                    return False  # the kernel left (a watch stopped, a kernel killed)
            if streamed is not None:  # a run the kernel shows now: this thread pumps it
                return self.service.stream(connection, streamed)
            return True
        _reply(connection, error=f"unknown op {op!r}; valid: 'info', 'stop', "
                                 f"{', '.join(repr(o) for o in OPS)}")
        return False


def _reply(connection: socket.socket, value: Any = None, error: str | None = None) -> bool:
    """Answer with a JSON value or an error; returns whether it was sent."""
    answer = {"ok": False, "error": error} if error is not None else {"ok": True, "value": value}
    try:
        send(connection, answer)
        return True
    except OSError:
        return False  # the client left


def _log(text: str) -> None:
    print(f"[notebook_accel] {time.strftime('%Y-%m-%d %H:%M:%S')} {text}", flush=True)


def _leave_the_starter(files: PoolFiles) -> None:
    """Fork: the starter prints the keeper's pid and exits, the keeper goes on with its output
    in the log (so the kernel is not the keeper's parent)."""
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        os._exit(0)
    log = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def main(argv: list[str] | None = None) -> None:
    name, options, idle = argv if argv is not None else sys.argv[1:]
    files = pool_files(name)
    _leave_the_starter(files)

    def stop(signum: int, frame: object) -> None:
        raise _Stopped

    signal.signal(signal.SIGTERM, stop)
    why = "failed to start"
    server = pool = None
    try:
        token = files.write_token()
        from notebook_accel.launch.pools.pool import WorkerPool

        _log(f"keeper of detached pool {name!r}, pid {os.getpid()}: starting the pool")
        pool = WorkerPool(**json.loads(options))
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        previous = os.umask(0o177)  # the socket file: this user's only
        try:
            server.bind(str(files.socket))
        finally:
            os.umask(previous)
        server.listen(16)
        _log(f"ready: {pool.plan.world_size} ranks on {pool.plan.device_type}, socket {files.socket}")
        why = Keeper(files, token, pool, float(idle)).serve(server)
    except _Stopped:
        why = "SIGTERM"
    except BaseException as error:
        why = f"failed: {type(error).__name__}: {error}"
        raise
    finally:
        if server is not None:
            server.close()
        files.remove()
        if pool is not None:
            pool.close()
        _log(f"detached pool {name!r} ended: {why}")


if __name__ == "__main__":
    main()
