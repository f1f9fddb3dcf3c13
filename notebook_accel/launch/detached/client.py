"""The kernel's side of detached pools: start one, list them, stop one.

Each call connects to a keeper's Unix socket (``keeper.py``), presents the pool's token and
reads one JSON answer. A socket whose keeper is gone (a stale file) is removed when met.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

from notebook_accel.launch.detached.framing import receive, send
from notebook_accel.launch.detached.keeper import IDLE_TIMEOUT
from notebook_accel.launch.detached.runtime_dir import PoolFiles, check_name, pool_files, pool_names
from notebook_accel.launch.request import LaunchRequest

START_TIMEOUT = 300.0  # seconds a keeper has to start its pool
_ANSWER_TIMEOUT = 10.0


class KeeperGone(ConnectionError):
    """No keeper answers on the pool's socket (it ended, or never started)."""


def request(files: PoolFiles, op: str, token: bytes | None = None, *, body: bytes = b"",
            timeout: float = _ANSWER_TIMEOUT, **fields: Any) -> Any:
    """Send ``op`` (with ``fields`` and ``body``) to the keeper of ``files`` with its token (or
    ``token``); returns its value (an answer with a body: the body's bytes).

    Raises:
        KeeperGone: nobody answers on the socket.
        PermissionError: the keeper refused (another user, a wrong token), saying why.
    """
    try:
        token = files.read_token() if token is None else token
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            connection.connect(str(files.socket))
            send(connection, {**fields, "token": token.decode(), "op": op}, body)
            answer, data = receive(connection.makefile("rb"))
    except PermissionError as error:
        raise PermissionError(f"detached pool {files.name!r}: {error.strerror} ({error.filename}); "
                              "only the user who started it can reach it") from None
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, BrokenPipeError,
            TimeoutError, ValueError) as error:
        raise KeeperGone(f"no keeper answers for detached pool {files.name!r} ({error})") from None
    if answer is None:
        raise KeeperGone(f"the keeper of detached pool {files.name!r} closed without an answer")
    if not answer["ok"]:
        raise PermissionError(answer["error"]) if answer["error"].startswith("refused") \
            else ValueError(answer["error"])
    return data if answer["size"] else answer["value"]


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
