"""What a background thread prints goes where it was told, not into whichever cell runs.

In a Jupyter kernel, ``sys.stdout`` is one stream whose messages carry the parent of the
cell executing *now*: a line a background run's thread prints (a heal's summary, a hang
note) would land in an unrelated cell. While a thread is inside :func:`routed_to`,
``sys.stdout`` and ``sys.stderr`` are replaced by a proxy that sends that thread's writes to
its own targets and every other thread's to the stream it replaced (unchanged). The proxy
is removed when the last routed thread leaves, if nobody replaced it meanwhile.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

_lock = threading.Lock()
_routes: dict[int, dict[str, Any]] = {}  # thread id -> {"stdout": target, "stderr": target}


class _Routed:
    """Stands in for ``sys.stdout`` or ``sys.stderr`` (``name``) while a thread is routed."""

    def __init__(self, name: str, original: TextIO) -> None:
        self._name = name
        self._original = original

    def _target(self) -> Any:
        route = _routes.get(threading.get_ident())
        return self._original if route is None else route[self._name]

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, isatty...: the original's
        return getattr(self._original, name)


@contextlib.contextmanager
def routed_to(stdout: Any, stderr: Any) -> Iterator[None]:
    """What this thread writes to ``sys.stdout`` / ``sys.stderr`` inside the block goes to
    ``stdout`` / ``stderr`` (objects with ``write`` and ``flush``); other threads' writes
    are untouched."""
    me = threading.get_ident()
    with _lock:
        if not _routes:
            for name in ("stdout", "stderr"):
                if not isinstance(getattr(sys, name), _Routed):
                    setattr(sys, name, _Routed(name, getattr(sys, name)))
        _routes[me] = {"stdout": stdout, "stderr": stderr}
    try:
        yield
    finally:
        with _lock:
            del _routes[me]
            if not _routes:
                for name in ("stdout", "stderr"):
                    current = getattr(sys, name)
                    if isinstance(current, _Routed):  # (else someone replaced it: theirs now)
                        setattr(sys, name, current._original)
