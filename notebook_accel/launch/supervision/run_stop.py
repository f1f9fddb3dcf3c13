"""Stopping a launch's ranks still running (after a failure, a timeout, the stop button).

A one-off launch's workers are ended (interrupt, terminate, kill: ``backends/stopping.py``).
A warm pool's workers stay: their run is ended at a point they all agree on
(``control/stop_agreement.py``), else at once (a KeyboardInterrupt in each), and those that
do not end their run within ``INTERRUPT_GRACE`` (blocked in C++ code) are killed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from notebook_accel.launch import tuning
from notebook_accel.launch.backends.signal_all import signal_all
from notebook_accel.launch.backends.stopping import stop_workers
from notebook_accel.launch.control.interrupts import take_interrupt
from notebook_accel.launch.control.stop_agreement import agree_and_stop, stop_now
from notebook_accel.launch.supervision.watched import Worker

Poll = Callable[[float], None]  # the supervisor's wakeup: reads the channels for that long


def stop_ranks(workers: Sequence[Worker], poll: Poll, drain: Callable[[], None],
               at_once: Callable[[list[Worker]], str | None], stop_wait: float) -> str | None:
    """Stop every one of ``workers`` still running (marked stopped), their output relayed
    meanwhile (``drain``, ``poll``). A pool's run: returns why its ranks were stopped at once
    (``at_once(live)``'s reason, or why they could not agree within ``stop_wait``); None:
    they stopped at a common point (or the workers were a one-off launch's)."""
    if not any(w.handle.persistent for w in workers):
        for w in workers:
            if not w.exited and w.exitcode is None:  # (a lost rank has exited, with no code)
                w.stopped = True
        stop_workers([w.handle for w in workers], on_wait=drain)
        return None
    live = [w for w in workers if not w.finished]
    for w in live:
        w.stopped = True
    why = at_once(live) or agree_and_stop(live, poll, stop_wait)
    if why is None:
        return None
    live = [w for w in live if not w.finished]
    stop_now(live)
    poll_for(poll, tuning.INTERRUPT_GRACE, live)
    stuck = [w for w in live if not w.finished]
    signal_all([w.handle for w in stuck], "kill")
    for w in stuck:
        w.handle.reap(timeout=tuning.KILL_REAP_WAIT)
    take_interrupt()  # more presses meanwhile asked for what was just done
    return why


def poll_for(poll: Poll, seconds: float, until_finished: Sequence[Worker] | None = None) -> None:
    """Keep polling for ``seconds``, or until every one of ``until_finished`` has finished."""
    deadline = time.monotonic() + seconds
    while (until_finished is None or any(not w.finished for w in until_finished)) \
            and time.monotonic() < deadline:
        poll(tuning.STOP_POLL)
