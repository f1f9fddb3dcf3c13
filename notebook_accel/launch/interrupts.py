"""Hold the notebook's stop button back while a launch is at a point it cannot be safely cut.

A ``KeyboardInterrupt`` raised inside an import (torch, ``torch._dynamo``, sympy:
what a first launch imports lazily) leaves half-initialised modules in
``sys.modules`` that break every later launch until the kernel restarts. So the
launcher runs with SIGINT recorded instead of raised, and acts on it where it
is safe: between steps, and in the watch loop.

This module imports only the standard library: it is imported before anything heavy.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

_FORCE_AFTER = 3  # a third press while deferred raises at once (the user insists)


class LaunchInterrupted(KeyboardInterrupt):
    """The stop button ended a launch; every worker it had started was stopped.

    IPython shows it as one line (``_render_traceback_``), not the launcher's frames.
    """

    def _render_traceback_(self) -> list[str]:
        message = str(self) or "launch interrupted"
        return [f"\x1b[31mKeyboardInterrupt\x1b[0m: {message}"]


class _Deferral:
    """The interrupts seen while deferring (shared by nested ``deferred_interrupts``)."""

    def __init__(self) -> None:
        self.presses = 0
        self.first_at: float | None = None

    def handler(self, signum: int, frame: object) -> None:
        self.presses += 1
        if self.first_at is None:
            self.first_at = time.monotonic()
        if self.presses >= _FORCE_AFTER:
            self.presses = 0
            raise LaunchInterrupted("interrupted (stop pressed 3 times while starting)")


_active: _Deferral | None = None


def interrupt_requested() -> bool:
    """True when the stop button was pressed since the outermost deferral began."""
    return _active is not None and _active.presses > 0


def take_interrupt() -> bool:
    """Consume a pending press of the stop button; True when there was one."""
    if _active is not None and _active.presses:
        _active.presses = 0
        return True
    return False


def check_interrupt(message: str = "launch interrupted") -> None:
    """Raise :class:`LaunchInterrupted` now if the stop button was pressed.

    Raises:
        LaunchInterrupted: an interrupt is pending; it is consumed.
    """
    if _active is not None and _active.presses:
        _active.presses = 0
        raise LaunchInterrupted(message)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Record SIGINT instead of raising it inside the block; raise it when the block ends.

    Only in the main thread (the only one that receives signals) and only when the
    current handler is Python's default one (the kernel's while a cell runs), so a
    custom handler the user installed keeps working. Nested uses share one state;
    the outermost restores the handler. A pending interrupt is raised as
    :class:`LaunchInterrupted` when the outermost block ends without an exception.

    Example:
        >>> with deferred_interrupts():
        ...     import json  # an interrupt here waits until the import is done
    """
    global _active
    if _active is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        yield
        return
    deferral = _Deferral()
    signal.signal(signal.SIGINT, deferral.handler)
    _active = deferral
    try:
        yield
    finally:
        _active = None
        signal.signal(signal.SIGINT, previous)
    if deferral.presses:
        raise LaunchInterrupted("launch interrupted")


@contextlib.contextmanager
def interrupts_raised() -> Iterator[None]:
    """Inside :func:`deferred_interrupts`: let the stop button raise KeyboardInterrupt at once,
    for a wait only the user ends (a debugger's prompt). A press pending already raises now.

    Raises:
        LaunchInterrupted: a press was pending.
    """
    deferral = _active
    if deferral is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    check_interrupt()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, deferral.handler)
