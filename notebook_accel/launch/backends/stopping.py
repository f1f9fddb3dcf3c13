"""Stop a call's workers, whatever backend started them: terminate, then kill after a grace."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait

from notebook_accel.launch.backends.base import WorkerHandle, kill_all
from notebook_accel.launch.backends.signal_all import signal_all
from notebook_accel.launch.control.interrupts import interrupt_requested

STOP_GRACE = 2.0  # seconds between terminate (SIGTERM) and kill (SIGKILL)


def stop_workers(handles: Sequence[WorkerHandle], grace: float | None = None,
                 on_wait: Callable[[], None] | None = None) -> None:
    """Terminate the live workers, kill whatever is left after ``grace`` seconds, reap them all.

    A (further) press of the stop button while waiting escalates to a kill at once.
    ``on_wait`` is called while waiting (to keep relaying output).
    """
    alive = [h for h in handles if _running(h)]
    signal_all(alive, "terminate")  # once per node on a cluster
    deadline = time.monotonic() + (STOP_GRACE if grace is None else grace)
    try:
        while alive and time.monotonic() < deadline and not interrupt_requested():
            wait(list({h.sentinel for h in alive}), timeout=0.05)  # (a cluster's: one inbox)
            if on_wait is not None:
                on_wait()
            alive = [h for h in alive if _running(h)]
    finally:
        kill_all(handles)


def _running(handle: WorkerHandle) -> bool:
    """No exit status yet, and not ended without one (a lost node's rank)."""
    return handle.exitcode is None and handle.describe_end() is None
