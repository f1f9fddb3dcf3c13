"""Progress bars for the workers: ``tqdm`` as in Accelerate, drawn once, in the notebook.

Inside a worker started by ``notebook_launcher``, a bar does not draw itself (eight
forked bars writing carriage returns into one cell is what users of the peer get);
it sends its state as throttled ``Kind.PROGRESS`` events and the kernel draws one bar
for the job. Anywhere else it is an ordinary ``tqdm.auto`` bar.

The kernel side, :func:`job_progress`, picks the bar that stands for the job.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from tqdm.std import tqdm as _std_tqdm

from notebook_accel import events
from notebook_accel.wire import Kind

_TEXT_LIMIT = 200  # characters of desc / postfix sent (an event must stay small)
_bar_ids = itertools.count()
_open_bars: list[EventTqdm] = []  # this process's open event bars, outermost first


class _NullFile:
    """Where an event bar 'draws': nowhere."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None


class EventTqdm(_std_tqdm):
    """A tqdm bar that reports its state to the kernel instead of drawing it.

    tqdm itself throttles :meth:`display` (``mininterval``, default 0.1 s here), so
    a training loop sends about ten small events a second per bar, whatever its
    speed. Events of one bar share a key: when the kernel lags they coalesce.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.bar_id = f"{os.getpid()}-{next(_bar_ids)}"
        kwargs["file"] = _NullFile()
        kwargs.setdefault("mininterval", 0.1)
        kwargs.setdefault("dynamic_ncols", False)
        super().__init__(*args, **kwargs)
        if not self.disable:
            _open_bars.append(self)

    def state(self, closed: bool = False) -> dict[str, Any]:
        """The bar as plain data: what the ``Kind.PROGRESS`` event carries (``Progress.state``)."""
        info = self.format_dict
        elapsed = info.get("elapsed") or 0.0
        rate = info.get("rate")
        if rate is None and elapsed > 0:
            rate = self.n / elapsed
        return {
            "id": self.bar_id,
            "n": self.n,
            "total": self.total,
            "desc": str(self.desc or "")[:_TEXT_LIMIT],
            "unit": str(self.unit),
            "unit_scale": self.unit_scale,
            "rate": rate,
            "elapsed": elapsed,
            "postfix": str(info.get("postfix") or "")[:_TEXT_LIMIT],
            "closed": closed,
            "outer": [bar.brief() for bar in _open_bars[:_open_bars.index(self)]]
            if self in _open_bars else [],
        }

    def brief(self) -> dict[str, Any]:
        """Where an enclosing bar stands (sent along with the inner bar's events)."""
        return {"desc": str(self.desc or "")[:_TEXT_LIMIT], "n": self.n, "total": self.total}

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Send the state (called by tqdm at most every ``mininterval`` seconds).

        While a bar opened inside this one is open (epochs around steps), only the
        inner bar reports, carrying this one's position in ``outer``.
        """
        if not self.disable and (not _open_bars or _open_bars[-1] is self):
            events.emit(Kind.PROGRESS, self.state(closed=False), key=self.bar_id)
        return True

    def clear(self, nolock: bool = False) -> None:
        """Nothing is drawn, so nothing to clear."""
        return None

    def close(self) -> None:
        """Close the bar and send its final state."""
        if self.disable:
            return
        final = self.state(closed=True)
        super().close()
        if self in _open_bars:
            _open_bars.remove(self)
        events.emit(Kind.PROGRESS, final, key=self.bar_id)


def _is_local_main_process() -> bool:
    return os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) == "0"


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> _std_tqdm:
    """A tqdm progress bar that works in launched workers (Accelerate's ``tqdm``).

    Args:
        *args, **kwargs: as for ``tqdm.auto.tqdm`` (iterable, total, desc, unit...).
        main_process_only: show the bar only on each machine's main process
            (``LOCAL_RANK`` 0); on the other ranks it is disabled (still iterates).

    Returns:
        Inside a worker started by ``notebook_launcher``: a bar whose progress
        goes to the kernel, which draws one bar for the whole job (with rate and
        ETA). Elsewhere: a ``tqdm.auto.tqdm`` bar.

    Example:
        >>> from notebook_accel import tqdm
        >>> total = sum(x for x in tqdm(range(3), disable=True))
    """
    if args and isinstance(args[0], bool):
        raise ValueError(
            "tqdm(True, ...) is the old Accelerate signature; pass "
            "main_process_only=True as a keyword and the iterable first"
        )
    if main_process_only and not kwargs.get("disable", False):
        kwargs["disable"] = not _is_local_main_process()
    if events.active():
        return EventTqdm(*args, **kwargs)
    from tqdm.auto import tqdm as auto_tqdm  # a widget bar in a notebook: import it only here

    return auto_tqdm(*args, **kwargs)


def bar_label(state: dict[str, Any]) -> str:
    """The bar's description after its enclosing bars: ``"epoch 2/3 · train"``."""
    parts = [f"{o['desc'] or 'outer'} {o['n']}/{o['total'] if o['total'] else '?'}"
             for o in state.get("outer") or ()]
    return " · ".join([*parts, str(state.get("desc") or "")]).strip(" ·")


def done_fraction(state: dict[str, Any]) -> float:
    """How much of its bar a progress state has done (0 without a total)."""
    total = state.get("total")
    return state.get("n", 0) / total if total else 0.0


def job_progress(record: Any, rank: int | None = None) -> dict[str, Any] | None:
    """The progress state that stands for the whole job, or None when no rank sent one.

    Rank 0's bar when it is the only one; when several ranks report (bars with
    ``main_process_only=False``), the slowest (the lowest completed fraction). The
    result is the rank's latest ``Progress.state`` plus ``rank`` and ``eta``
    (seconds, None when unknown).

    Args:
        record: a :class:`~notebook_accel.launch.views.record.LaunchRecord`.
        rank: the slowest rank when the caller knows it (a view's per-node summary, which
            spares a look at every rank's bar).
    """
    if not record.progress:
        return None
    if rank is not None and rank in record.progress:
        return _with_eta(dict(record.progress[rank], rank=rank))

    rank, state = min(record.progress.items(), key=lambda item: (done_fraction(item[1]), item[0]))
    return _with_eta(dict(state, rank=rank))


def _with_eta(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its ``eta`` (seconds; None when unknown)."""
    total, rate = state.get("total"), state.get("rate")
    remaining = (total - state.get("n", 0)) if total else None
    state["eta"] = remaining / rate if remaining is not None and rate else None
    if state.get("closed") and remaining is not None and remaining <= 0:
        state["eta"] = 0.0
    return state
