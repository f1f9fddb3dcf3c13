"""The kernel's side of detached pools: start one, list them, stop one, talk to one.

A :class:`Connection` to a keeper's Unix socket (``keeper.py``) presents the pool's token with
its first request and is kept for the next ones (one message each way: ``framing.py``);
:func:`request` is one request on a connection of its own. A socket whose keeper is gone (a
stale file) is removed when met.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from notebook_accel.launch.detached.framing import receive, send
from notebook_accel.launch.detached.keeper import IDLE_TIMEOUT
from notebook_accel.launch.detached.runtime_dir import PoolFiles, check_name, pool_files, pool_names
from notebook_accel.launch.planning.request import LaunchRequest

START_TIMEOUT = 300.0  # seconds a keeper (a process, or a Ray actor with its hubs) has to start its pool
ANSWER_TIMEOUT = 10.0  # seconds a keeper has to answer a question (not a run: those take long)


class KeeperGone(ConnectionError):
    """No keeper answers on the pool's socket (it ended, or never started)."""


class Connection:
    """A kernel's connection to one keeper, kept for its requests (one at a time): each is one
    message each way; the token is presented once, with the first. Any error closes it (the
    next request opens another), so a request cut short (the stop button) leaves nothing
    half-read."""

    streams = True  # a run shown now comes on the connection as it is kept (``receive``)

    def __init__(self, files: PoolFiles, token: bytes | None = None) -> None:
        self.files, self._token = files, token
        self._socket: socket.socket | None = None
        self._stream: Any = None
        self._lock = threading.Lock()  # one request at a time, whichever thread asks

    def request(self, op: str, *, body: bytes = b"", timeout: float = ANSWER_TIMEOUT,
                **fields: Any) -> Any:
        """Send ``op`` (with ``fields`` and ``body``); returns the keeper's value (an answer
        with a body: the body's bytes).

        Raises:
            KeeperGone: nobody answers on the socket.
            PermissionError: the keeper refused (another user, a wrong token), saying why.
        """
        with self._lock:
            return self._request(op, body, timeout, fields)

    def _request(self, op: str, body: bytes, timeout: float, fields: dict[str, Any]) -> Any:
        files = self.files
        try:
            head = {**fields, "op": op}
            if self._socket is None:
                token = files.read_token() if self._token is None else self._token
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._socket.connect(str(files.socket))
                self._stream = self._socket.makefile("rb")
                head["token"] = token.decode()
            self._socket.settimeout(timeout)
            send(self._socket, head, body)
            answer, data = receive(self._stream)
        except PermissionError as error:
            self.close()
            raise PermissionError(f"detached pool {files.name!r}: {error.strerror} "
                                  f"({error.filename}); only the user who started it can reach "
                                  "it") from None
        except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, BrokenPipeError,
                TimeoutError, ValueError) as error:
            self.close()
            raise KeeperGone(f"no keeper answers for detached pool {files.name!r} ({error})") from None
        except BaseException:
            self.close()
            raise
        if answer is None:
            self.close()
            raise KeeperGone(f"the keeper of detached pool {files.name!r} closed without an answer")
        if not answer["ok"]:
            self.close()
            raise PermissionError(answer["error"]) if answer["error"].startswith("refused") \
                else ValueError(answer["error"])
        return data if answer["size"] else answer["value"]

    def receive(self) -> Any:
        """The next message of a stream the last request began (a streamed run's output), as
        :meth:`request` returns an answer; waits as long as it takes.

        Raises:
            KeeperGone: the stream ended (the keeper gave it up, or ended).
        """
        with self._lock:
            if self._socket is None:
                raise KeeperGone(f"the stream of detached pool {self.files.name!r} was closed")
            try:
                self._socket.settimeout(None)
                answer, data = receive(self._stream)
            except BaseException:
                self.close()
                raise
            if answer is None:
                self.close()
                raise KeeperGone(f"the keeper of detached pool {self.files.name!r} ended the stream")
            return data if answer["size"] else answer["value"]

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = self._stream = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def request(files: PoolFiles, op: str, token: bytes | None = None, *, body: bytes = b"",
            timeout: float = ANSWER_TIMEOUT, **fields: Any) -> Any:
    """One request on a connection of its own: see :meth:`Connection.request`."""
    with Connection(files, token) as connection:
        return connection.request(op, body=body, timeout=timeout, **fields)


def start_detached(name: str, idle_timeout: float = IDLE_TIMEOUT, **options: Any) -> dict[str, Any]:
    """Start the detached pool ``name``: a keeper process of its own session owning a
    ``WorkerPool(**options)``; it outlives this kernel and ends after ``idle_timeout`` seconds
    without a request (default 12 h), or :func:`stop_detached`.

    Returns:
        The pool's info (as :func:`detached_pools` lists it).
    Raises:
        TypeError, ValueError: a bad option or name, or a pool of that name is up, before any
            process starts.
        RuntimeError: the keeper ended before its pool was ready (its log's last lines said).
    """
    check_name(name)
    LaunchRequest.from_keywords("WorkerPool", options)  # a bad option: said here, not in a log
    if not (isinstance(idle_timeout, (int, float)) and idle_timeout > 0):
        raise ValueError(f"idle_timeout={idle_timeout!r}: give the seconds (> 0) a detached pool "
                         "waits without a request before it ends itself")
    try:
        encoded = json.dumps(options)
    except TypeError as error:
        raise TypeError(f"a detached pool's options must be plain values (numbers, strings, "
                        f"lists): {error}") from None
    files = pool_files(name)
    if files.socket.exists() or files.token.exists():
        try:
            info = request(files, "info")
        except KeeperGone:
            files.remove()  # a stale pool's files
        else:
            raise ValueError(f"a detached pool named {name!r} is up already (keeper pid "
                             f"{info['pid']}); stop it first, or choose another name")
    starter = subprocess.run(
        [sys.executable, "-m", "notebook_accel.launch.detached.keeper", name, encoded,
         repr(float(idle_timeout))], start_new_session=True, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60, check=False)
    if starter.returncode != 0 or not starter.stdout.strip().isdigit():
        raise RuntimeError(f"the keeper of detached pool {name!r} did not start: "
                           f"{starter.stderr.strip()[-2000:]}")
    pid = int(starter.stdout.split()[0])
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        try:
            return request(files, "info")
        except (KeeperGone, FileNotFoundError):
            if not _alive(pid):
                raise RuntimeError(f"the keeper of detached pool {name!r} ended before its pool "
                                   f"was ready; its log ({files.log}) says:\n{_tail(files)}") from None
            time.sleep(0.1)
    raise RuntimeError(f"the keeper of detached pool {name!r} (pid {pid}) was not ready in "
                       f"{START_TIMEOUT:g} s; its log: {files.log}")


def detached_pools() -> list[dict[str, Any]]:
    """The detached pools of this user on this machine, each as its keeper tells it (name,
    pid, ranks, alive, device, state, since, memory, idle_timeout); stale files removed."""
    pools = []
    for name in pool_names():
        files = pool_files(name)
        try:
            pools.append(request(files, "info"))
        except KeeperGone:
            files.remove()
    return pools


def stop_detached(name: str) -> None:
    """End the detached pool ``name`` (its keeper and workers); returns once its keeper is gone.

    Raises:
        ValueError: no detached pool of that name is up (the ones that are named).
    """
    files = pool_files(name)
    try:
        pid = request(files, "info")["pid"]
        request(files, "stop")
    except (KeeperGone, FileNotFoundError):
        files.remove()
        names = ", ".join(repr(p["name"]) for p in detached_pools()) or "none"
        raise ValueError(f"no detached pool named {name!r} is up (up: {names})") from None
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tail(files: PoolFiles, lines: int = 20) -> str:
    try:
        return "\n".join(files.log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
