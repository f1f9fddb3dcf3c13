"""Where detached pools live: a directory of this user's only, and one pool's files in it.

``$XDG_RUNTIME_DIR/notebook_accel`` (the login session's private directory), else
``/tmp/notebook_accel-UID``. It is made mode 0700 and refused unless it is this user's, not a
link, and closed to everyone else (someone else's directory at that path could hand us their
sockets). Each pool has ``NAME.sock`` (the keeper's socket), ``NAME.token`` (0600: what a
connection presents), ``NAME.log`` (the keeper's own output, with why it ended) and
``NAME.out/`` (its latest run's output, a ring per rank: ``output_ring.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SOCKET_PATH_MAX = 100  # bytes: AF_UNIX paths end at 108


def check_name(name: object) -> str:
    """``name`` if it can name a detached pool (a file name: letters, digits, ``_.-``).

    Raises:
        ValueError: it cannot, naming it and what is allowed.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"name={name!r}: a detached pool's name is 1 to 64 letters, digits, "
                         "'_', '.' or '-', starting with a letter or digit (e.g. 'exp1')")
    return name


def runtime_dir() -> Path:
    """This user's directory of detached pools, made if needed (mode 0700).

    Raises:
        PermissionError: the path exists but is not a directory of this user's closed to others.
    """
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = (Path(base) / "notebook_accel" if base and os.path.isdir(base)
            else Path(tempfile.gettempdir()) / f"notebook_accel-{os.getuid()}")
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"{path}: the directory of detached pools must be a directory of this user's "
            f"(uid {os.getuid()}) with mode 0700; it is mode {stat.S_IMODE(info.st_mode):o}, "
            f"owner uid {info.st_uid}{', a link' if stat.S_ISLNK(info.st_mode) else ''}: "
            "remove it, or set XDG_RUNTIME_DIR to a private directory")
    return path


@dataclass(frozen=True)
class PoolFiles:
    """One detached pool's files."""

    name: str
    socket: Path
    token: Path
    log: Path
    output: Path  # the folder of the latest run's output rings

    def read_token(self) -> bytes:
        """The pool's token (what a connection presents)."""
        return self.token.read_bytes()

    def write_token(self) -> bytes:
        """Make a new token, readable by this user only (0600, never an existing file)."""
        token = os.urandom(32).hex().encode()
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(token)
        return token

    def remove(self) -> None:
        """Remove the socket, the token and the output (the log stays, to say why the pool
        ended)."""
        for path in (self.socket, self.token):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.output, ignore_errors=True)


def pool_files(name: str) -> PoolFiles:
    """The files of the detached pool ``name`` (checked) in :func:`runtime_dir`.

    Raises:
        ValueError: a bad name, or a runtime directory too deep for a socket's path.
    """
    folder = runtime_dir()
    socket = folder / f"{check_name(name)}.sock"
    if len(os.fsencode(socket)) > _SOCKET_PATH_MAX:
        raise ValueError(f"{socket}: too long for a socket's path ({_SOCKET_PATH_MAX} bytes at "
                         "most); set XDG_RUNTIME_DIR to a shorter directory")
    return PoolFiles(name, socket, folder / f"{name}.token", folder / f"{name}.log",
                     folder / f"{name}.out")


def pool_names() -> list[str]:
    """The names of the pools that have a socket in :func:`runtime_dir` (live or stale)."""
    return sorted(path.stem for path in runtime_dir().glob("*.sock"))
