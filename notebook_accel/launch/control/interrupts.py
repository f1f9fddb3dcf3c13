"""Hold the notebook's stop button back while a launch is at a point it cannot be safely cut.

A ``KeyboardInterrupt`` raised inside an import (torch, ``torch._dynamo``, sympy:
what a first launch imports lazily) leaves half-initialised modules in
``sys.modules`` that break every later launch until the kernel restarts. So the
launcher runs with SIGINT recorded instead of raised, and acts on it where it
is safe: between steps, and in the watch loop.

This module imports only the standard library: it is imported before anything heavy.
"""

from __future__ import annotations

import _signal  # signal's functions without its enum conversions: 9 us of each pool run
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


_active: _Deferral | None = None  # the main thread's (the stop button's)
_threads = threading.local()  # another thread's own presses (a background run's .cancel())


class StopPresses(_Deferral):
    """The stop button of a run in a thread of its own (a background run): :meth:`press` is
    what a press of the notebook's stop button is to a run in the main thread, which keeps the
    real button for its own cells."""

    def press(self) -> None:
        """Ask the run to stop (a second press: at once, as the stop button pressed twice)."""
        self.presses += 1


@contextlib.contextmanager
def stopped_by(presses: StopPresses) -> Iterator[None]:
    """In a thread other than the main one: the interrupt checks of this thread
    (:func:`check_interrupt`...) read ``presses``, never the main thread's stop button."""
    _threads.presses = presses
    try:
        yield
    finally:
        _threads.presses = None


def _pending() -> _Deferral | None:
    """The presses this thread answers to: the stop button's in the main thread, else its own."""
    if threading.current_thread() is threading.main_thread():
        return _active
    return getattr(_threads, "presses", None)


def interrupt_requested() -> bool:
    """True when the stop button was pressed since the outermost deferral began."""
    pending = _pending()
    return pending is not None and pending.presses > 0


def take_interrupt() -> bool:
    """Consume a pending press of the stop button; True when there was one."""
    pending = _pending()
    if pending is not None and pending.presses:
        pending.presses = 0
        return True
    return False


def check_interrupt(message: str = "launch interrupted") -> None:
    """Raise :class:`LaunchInterrupted` now if the stop button was pressed (in a background
    run's thread: if its :class:`StopPresses` was pressed).

    Raises:
        LaunchInterrupted: an interrupt is pending; it is consumed.
    """
    if take_interrupt():
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
    previous = _signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        yield
        return
    deferral = _Deferral()
    _signal.signal(signal.SIGINT, deferral.handler)
    _active = deferral
    try:
        yield
    finally:
        _active = None
        _signal.signal(signal.SIGINT, previous)
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
