"""The kernel's side of the warm pool's stop button: agree on a cut, then wait for it.

Every rank of a pool run is asked where it stands (:class:`~notebook_accel.wire.StopAsk`);
from the answers the kernel picks the cut: one collective past the furthest rank. Every
rank runs on to it and waits at the first point of the user's code after it, the same
point on every rank (the worker side, ``launch/worker/stop_cut.py``, says why). A rank
that crossed the cut before it knew it moves the cut on, past every rank. When
all wait at the cut, they are told to stop there. Ranks found standing still at one and
the same place (asleep on the same line: there may be no collective ahead) are stopped
there at once. The whole stop takes at most ``stop_wait`` seconds. What cannot agree (a
rank that does not answer, a group that does not count, a second press, a rank that ends
or does not reach the cut in time) is returned as the reason to stop at once instead, as
before the cut existed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from notebook_accel.contract import OPTIONS
from notebook_accel.launch.control.interrupts import take_interrupt
from notebook_accel.launch.views.text import ranks_text, say
from notebook_accel.wire import StopAsk, StopAt, StopCount

ASK_WAIT = 1.0  # seconds every rank has to answer (they answer in milliseconds, from LOOK_EVERY into a run)
STOP_WAIT: float = OPTIONS["stop_wait"].default  # seconds every rank has to reach the cut
LOOK_EVERY = 0.05  # seconds between looks at where the ranks stand while they run to the cut
SAY_AFTER = 0.5  # a stop that takes longer says what it waits for


def _wait(workers: Sequence[Any], done: Callable[[Any], bool], seconds: float,
          poll: Callable[[float], None]) -> str | None:
    """Poll until ``done`` holds for every worker still running, or why not (None: it does;
    ``"timeout"``: ``seconds`` passed)."""
    deadline = time.monotonic() + seconds
    while not all(done(w) or w.finished for w in workers):
        if take_interrupt():
            return "stop was pressed again"
        ended = [w.rank for w in workers if w.exited]
        if ended:
            return f"{ranks_text(ended)} ended meanwhile"
        if time.monotonic() >= deadline:
            return "timeout"
        poll(0.02)
    return None


def _ask(workers: Sequence[Any], poll: Callable[[float], None]) -> str | None:
    """Ask every rank where it stands (``w.stop_count``); why not all answered (None: all did)."""
    for w in workers:
        w.stop_count = None
        if not w.finished and not w.handle.command(StopAsk()):
            return f"rank {w.rank} cannot be reached"
    why = _wait(workers, lambda w: w.stop_count is not None, ASK_WAIT, poll)
    if why == "timeout":
        silent = [w.rank for w in workers if w.stop_count is None and not w.finished]
        return f"{ranks_text(silent)} did not answer within {ASK_WAIT:g} s"
    return why


def _parked(before: Sequence[StopCount], after: Sequence[StopCount]) -> bool:
    """Every rank stands still at one and the same place of the user's own code (a sleep, a
    blocking read; not a collective's wait, which a slow peer can stretch): no collective
    issued between two answers, and all stacks alike and unchanged."""
    return (all(a.counts == b.counts and a.where == b.where for a, b in zip(before, after, strict=True))
            and all(a.in_user_code for a in after) and len({a.where for a in after}) == 1)


def _total(answer: StopCount, groups: tuple[str, ...]) -> int:
    return sum(answer.counts.get(group, 0) for group in groups)


def _behind_the_cut(answer: StopCount, groups: tuple[str, ...], total: int) -> bool:
    """The rank cannot wait at ``total``: it crossed it before it knew it (or it does not
    watch yet and is there already)."""
    seen = answer.seen if answer.seen is not None else _total(answer, groups)
    return answer.waiting_at is None and seen >= total


def agree_and_stop(workers: Sequence[Any], poll: Callable[[float], None],
                   stop_wait: float = STOP_WAIT) -> str | None:
    """Stop the pool run's ``workers`` (those still in it) at a point they all reach.

    The cut is one collective past the furthest rank: every rank runs on to it and waits
    at the first point of the user's code after it, the same point on every rank; when all
    wait there, they stop. A rank that crossed the cut before it knew it moves the cut on. Ranks that stand still at one and the same place (all asleep on one line) are
    stopped there at once: they may have no collective ahead.

    Args:
        workers: the supervisor's records of the ranks still running (``rank``,
            ``handle``, ``finished``, ``exited``, ``stop_count`` set by the supervisor
            when a :class:`StopCount` comes).
        poll: the supervisor's poll (reads the ranks' channels for ``timeout`` seconds).
        stop_wait: how long every rank may take to reach the cut.
    Returns:
        None when every rank stopped at the cut; else why not (the caller stops the
        others at once).
    """
    why = _ask(workers, poll)
    if why is not None:
        return why
    asked = [w for w in workers if not w.finished]
    if not asked:
        return None
    first: list[StopCount] = [w.stop_count for w in asked]
    if any(a.counts is None for a in first):
        return "a process group does not count its collectives, so no common point can be found"
    groups = tuple(sorted(set.intersection(*(set(a.counts) for a in first))))
    total = max(_total(a, groups) for a in first) + 1
    for w in asked:
        w.handle.command(StopAt(groups, total))
    started, said, before = time.monotonic(), False, first

    def waits(w: Any) -> bool:  # at the cut (each rank says so as it begins to wait)
        return w.stop_count is not None and w.stop_count.waiting_at == total

    while True:
        why = _wait(asked, waits, LOOK_EVERY, poll)
        if why is None:
            return _stop_where_they_wait([w for w in asked if not w.finished], poll)
        if why != "timeout":
            return why
        if not said and time.monotonic() - started >= SAY_AFTER:
            say("stopping after the current step (every rank runs on to the same point of "
                "your code); press stop again to stop now")
            said = True
        running = [w for w in asked if not w.finished]
        if time.monotonic() - started >= stop_wait:
            behind = [w.rank for w in running if w.stop_count is None or w.stop_count.waiting_at != total]
            return (f"{ranks_text(behind or [w.rank for w in running])} did not reach the "
                    f"common stopping point within {stop_wait:g} s (stop_wait)")
        why = _ask(running, poll)
        if why is not None:
            return why
        running = [w for w in running if not w.finished]  # one may finish while asked: no answer
        if not running:
            return None
        now = [w.stop_count for w in running]
        if any(_behind_the_cut(a, groups, total) for a in now):
            total = max(_total(a, groups) for a in now) + 1  # past every rank: on to it
            for w in running:
                w.handle.command(StopAt(groups, total))
        elif _parked([a for w, a in zip(asked, before, strict=True) if not w.finished], now):
            return _stop_where_they_wait(running, poll)
        before = [w.stop_count if not w.finished else a for w, a in zip(asked, before, strict=True)]


def _stop_where_they_wait(running: Sequence[Any], poll: Callable[[float], None]) -> str | None:
    for w in running:
        w.handle.command(StopAt(None))
    why = _wait(running, lambda w: False, ASK_WAIT, poll)
    return None if why is None else why.replace("timeout", "they did not stop")


def stop_now(workers: Sequence[Any]) -> None:
    """Stop the ranks' runs at once, wherever they are (a KeyboardInterrupt in each)."""
    for w in workers:
        if not w.handle.command(StopAt(None)):  # its reader thread signals it; else we do
            w.handle.interrupt()
