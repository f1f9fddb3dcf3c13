"""A warm pool's background runs: ``WorkerPool.submit`` and what it changes for the pool.

:class:`BackgroundRuns` is a part of :class:`~notebook_accel.WorkerPool`: a run started here is
the pool's own (``_ready``, ``_payload``, ``_launch``: the same supervisor, stop and recovery as
``run``) on a daemon thread of the kernel's, the run's output pump, which returns a
:class:`~notebook_accel.launch.pools.run_handle.RunHandle` at once. Its prints go to the handle's
kept output (``thread_output.routed_to``), its stop is the handle's (``interrupts.stopped_by``).
Until it ends, the pool refuses other runs (:class:`PoolBusy`); its failure is raised once by
the next call that touches the pool, unless ``result``/``watch`` raised it already.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from notebook_accel.launch.control.interrupts import deferred_interrupts
from notebook_accel.launch.handoff.shared_tensors import SharedTensors
from notebook_accel.launch.pools.run_handle import RunHandle
from notebook_accel.launch.pools.thread_output import routed_to
from notebook_accel.launch.supervision.tracebacks import hide_our_frames
from notebook_accel.launch.views.text import say


class PoolBusy(RuntimeError):
    """The pool is running a background run: nothing else runs on it until that run ends
    (the message says what runs, for how long, and how to watch or stop it)."""


class BackgroundRuns:
    """``submit`` and the busy pool's rules, for :class:`~notebook_accel.WorkerPool`."""

    _background: RunHandle | None = None  # the latest background run

    def submit(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> RunHandle:
        """Start ``function(*args, **kwargs)`` on every rank in the background and return at
        once: the kernel stays free for other cells while it runs.

        The run is :meth:`run`'s (the same supervisor, stop and recovery); what it prints is
        kept, not shown: :meth:`RunHandle.watch` shows it (the lines so far, then live) in the
        cell that calls it. Until it ends, anything else on the pool is refused (``PoolBusy``,
        saying what runs and how to watch or stop it). If it fails, its ``WorkerError`` is
        raised by ``watch``/``result``, else by the next call that touches the pool.

        Returns:
            A :class:`~notebook_accel.launch.pools.run_handle.RunHandle`: ``done()``,
            ``result(timeout=)``, ``cancel()``, ``watch()``, ``logs(rank)``.
        Raises:
            TypeError, PoolUnavailable: as :meth:`run`, at once.
            PoolBusy: a background run is still running on the pool.

        Example:
            >>> run = pool.submit(train, epochs=3)  # doctest: +SKIP
            >>> run.watch()  # doctest: +SKIP
        """
        return self.start_background(function, args, kwargs)

    def start_background(self, function: Callable[..., Any], args: tuple[Any, ...] = (),
                         kwargs: dict[str, Any] | None = None, *, ranks: tuple[int, ...] | None = None,
                         what: str | None = None, advice: str | None = None) -> RunHandle:
        """:meth:`submit` for a front end: on some ``ranks`` (None: all), described as
        ``what`` (``"cell [14]"``) with its own ``advice`` for a refused run
        (``"%accelerate watch, or .cancel()"``). Says in one line how to watch it."""
        with deferred_interrupts():
            workers = self._ready(function)
            shared = SharedTensors()  # closed by the run's thread when the run has ended
            try:
                payload = self._payload(workers, function, args, dict(kwargs or {}), shared)
            except BaseException:
                shared.close()
                raise
            name = getattr(function, "__name__", type(function).__name__)
            handle = RunHandle(what or f"a background run of {name}",
                               advice or "its RunHandle's .watch(), or .cancel()")
            self._begin(handle, workers, ranks, payload, shared)
        say(f"{handle.what} runs in the background on the pool; "
            f"{'%accelerate watch' if advice else '.watch()'} shows it live")
        return handle

    def submit_payload(self, payload: bytes, ranks: tuple[int, ...] | None,
                       handle: RunHandle) -> Callable[[], None]:
        """A run of a payload serialised elsewhere (a detached pool's keeper gets it from a
        kernel), kept in ``handle``, as :meth:`start_background`'s; the pool counts it as
        running at once, and the caller runs the returned function on a thread of its own
        (the run's output pump; it returns when the run has ended: a keeper keeps one such
        thread for all its runs).

        Raises:
            PoolUnavailable, PoolBusy, WorkerError: as :meth:`run`, at once.
        """
        with deferred_interrupts():
            self.revive()
            workers = self._usable()
            self._background = handle
        return functools.partial(self._in_background, handle, workers, ranks, payload,
                                 SharedTensors())

    def _begin(self, handle: RunHandle, workers: Any, ranks: tuple[int, ...] | None,
               payload: Any, shared: SharedTensors) -> None:
        self._background = handle
        threading.Thread(target=self._in_background, args=(handle, workers, ranks, payload, shared),
                         name=f"notebook_accel: {handle.what}", daemon=True).start()

    @property
    def background(self) -> RunHandle | None:
        """The latest background run (running or ended), if any."""
        return self._background

    def _in_background(self, handle: RunHandle, workers: Any, ranks: tuple[int, ...] | None,
                       payload: Any, shared: SharedTensors) -> None:
        """The background run's thread: the run, its output kept in the handle (notes of the
        pool's too, such as a heal's), then its outcome."""
        value, error = None, None
        with routed_to(handle.output.stdout, handle.output.stderr):
            try:
                value = self._launch(workers, ranks, payload, handle.presses, handle)
            except BaseException as caught:  # noqa: BLE001 - the outcome belongs to the handle
                error = caught
            finally:
                shared.close()
        handle.finish(value, error)

    def _check_background(self) -> None:
        """Refuse while a background run runs; raise its failure if nobody was told yet."""
        self._refuse_if_busy()
        handle = self._background
        failure = handle.unreported_failure() if handle is not None else None
        if failure is not None:  # said where it is seen, with which run it was
            note = f"(this is how {handle.what}, which ran in the background, failed)"
            failure.__notes__ = [*getattr(failure, "__notes__", ()), note]
            raise failure

    def _refuse_if_busy(self) -> None:
        handle = self._background
        if handle is not None and not handle.done():
            raise hide_our_frames(PoolBusy(
                f"the pool is running {handle.what} ({handle.state().removeprefix('running ')}); "
                f"{handle.advice}"))
