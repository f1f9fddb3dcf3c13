"""The plain-text view of a running launch (scripts, ``notebook-accel launch``, terminals).

A status line when ranks change state and every ~10 s while the job runs, and one
summary line at the end; a job shorter than a second prints nothing. Lines go to
stdout (prefixed ``[notebook_accel] ``): they are information, and stderr is for warnings and
errors (a notebook paints stderr as one).
A start that takes seconds (torch still to import) is said first, in a kernel too
(:func:`starting_text`). The small formatters here are shared with the notebook's live view.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

from notebook_accel.launch.views.nodes import node_table, per_node, taken_in
from notebook_accel.launch.views.rank_ranges import ranks_text  # noqa: F401 - the words every view uses
from notebook_accel.launch.views.record import ENDED_STATES as _ENDED
from notebook_accel.launch.views.record import LaunchRecord, RankState, RankStatus
from notebook_accel.launch.views.rich_output import in_kernel
from notebook_accel.observe.progress import bar_label, job_progress

PREFIX = "[notebook_accel] "
NOTABLE_PHASE = 1.0  # seconds: a shorter phase (a small recompile) prints no line of its own


def format_bytes(size: int | None) -> str:
    """``1234567`` -> ``"1.2 MB"``; ``None`` -> ``"-"``."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def format_duration(seconds: float | None) -> str:
    """``3.21`` -> ``"3.2 s"``, ``125`` -> ``"2:05"``, ``3725`` -> ``"1:02:05"``."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_value(value: Any) -> str:
    """A metric value, short: ``0.123457``, ``1.23e-05``, ``12``."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def workers_text(record: LaunchRecord) -> str:
    """Which workers run the launch: ``"on the warm pool (fork)"`` or ``"fresh workers (fork)"``."""
    where = "on the warm pool" if record.warm_pool else "fresh workers"
    return f"{where} ({record.start_method})"


def starting_text(count: int, method: str) -> str:
    """``"starting 2 workers (fork)..."``: a launch's first line when its start takes seconds
    (torch still to import, workers to start), said before that work so it is not silent."""
    return f"starting {count} worker{'s' if count != 1 else ''} ({method})..."


def say(line: str, stream: TextIO | None = None) -> None:
    """Write one line of the text view: prefixed, to ``stream``. Default: ``sys.stdout`` in a
    kernel (information, not a warning JupyterLab paints red), ``sys.stderr`` in a script
    (whose stdout is its own output, as pip's and tqdm's progress keep out of it)."""
    stream = stream or (sys.stdout if in_kernel() else sys.stderr)
    stream.write(PREFIX + line + "\n")
    stream.flush()


def state_text(status: RankStatus) -> str:
    """The rank's state, with the time spent in its phase: ``"compiling (12.0 s)"``, ``"running"``."""
    seconds = status.phase_elapsed
    if seconds is None or status.state in _ENDED:
        return status.state
    return f"{status.state} ({format_duration(seconds)})"


def rank_states(record: LaunchRecord) -> str:
    """``"2 running"``, ``"1 compiling (rank 0 for 12.0 s), 1 running"``, or
    ``"1 finished, 1 failed (rank 1, exit code 1)"``."""
    if per_node(record):  # the nodes' counts, and only the ranks in a phase or abnormal
        summary = node_table(record)
        counts = +summary.states  # (no zero counts)
        # the ranks named, kept until a rank's state or phase changes
        if summary.named is None or summary.named[0] != summary.membership:
            summary.named = (summary.membership, (_firsts(record, summary.in_phase),
                                                  _firsts(record, summary.abnormal)))
        phased, abnormal = summary.named[1]
    else:
        counts = Counter(status.state for status in record.ranks.values())
        phased = abnormal = list(record.ranks.values())
    parts = []
    for state, count in counts.items():
        part = f"{count} {state}"
        in_phase = [s for s in phased if s.state == state and s.phase_elapsed is not None]
        if in_phase and state not in _ENDED:
            part += " (" + ", ".join(f"rank {s.rank} for {format_duration(s.phase_elapsed)}"
                                     for s in in_phase[:4]) + ")"
        if state == RankState.FAILED:
            failed = [s for s in abnormal if s.state == RankState.FAILED]
            part += " (" + ", ".join(
                f"rank {s.rank}" + (f", exit code {s.exitcode}" if s.exitcode is not None else "")
                for s in failed[:4]) + ")"
        parts.append(part)
    return ", ".join(parts) or "no ranks"


def _firsts(record: LaunchRecord, ranks: set[int], limit: int = 4) -> list[RankStatus]:
    """The ``limit`` lowest ranks of each state among ``ranks`` (all a state's text names)."""
    firsts, count = [], Counter()
    for rank in sorted(ranks):
        status = record.ranks[rank]
        if count[status.state] < limit:
            count[status.state] += 1
            firsts.append(status)
    return firsts


def progress_text(record: LaunchRecord) -> str | None:
    """The job's progress as one line (tqdm's own format), or None without progress events."""
    state = job_progress(record, node_table(record).slowest() if per_node(record) else None)
    return None if state is None else progress_line(state)


def progress_line(state: dict) -> str:
    """One progress state (``job_progress``'s) as tqdm's own one-line format."""
    from tqdm.std import tqdm

    return tqdm.format_meter(
        n=state.get("n", 0), total=state.get("total"), elapsed=state.get("elapsed") or 0.0,
        prefix=bar_label(state), unit=state.get("unit", "it"),
        unit_scale=state.get("unit_scale", False), rate=state.get("rate"),
        postfix=state.get("postfix") or None, ncols=0,
    ).strip()


def metrics_text(record: LaunchRecord, limit: int = 4) -> str | None:
    """The latest value of up to ``limit`` metrics: ``"loss 0.1234, acc 0.9 @ step 40"``."""
    if not record.history:
        return None
    latest = [(name, points[-1]) for name, points in record.history.items() if points]
    if not latest:
        return None
    text = ", ".join(f"{name} {format_value(value)}" for name, (_, value) in latest[:limit])
    step = latest[0][1][0]
    return text + (f" @ step {step}" if step is not None else "")


def rich_hidden_text(record: LaunchRecord) -> str | None:
    """``"rank 1 displayed 12 rich outputs (shown for rank 0, in a notebook)"``, or None when none."""
    counts = sorted((rank, count) for rank, count in record.rich_hidden.items() if count)
    if not counts:
        return None
    said = ", ".join(f"rank {rank} displayed {count} rich output{'s' if count > 1 else ''}"
                     for rank, count in counts)
    return said + " (shown for rank 0, in a notebook)"


def _lasting_state(status: RankStatus) -> str:
    """The state, with a phase younger than ``NOTABLE_PHASE`` counted as running."""
    seconds = status.phase_elapsed
    if status.state in _ENDED or seconds is None or seconds >= NOTABLE_PHASE:
        return status.state
    return RankState.RUNNING


class TextView:
    """Plain text lines about a launch, for places where no notebook display renders.

    Args:
        record: the launch to describe (the supervisor keeps it up to date).
        stream: where lines go (default: ``sys.stdout`` at the time of writing).
        quiet_for: seconds before anything is printed (trivial jobs print nothing).
        every: seconds between status lines while nothing changes.
        clock: the monotonic clock (tests pass their own).
    """

    holds_output = False  # its lines go to stdout, interleaved with the output

    def __init__(
        self,
        record: LaunchRecord,
        stream: TextIO | None = None,
        quiet_for: float = 1.0,
        every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.quiet_for = quiet_for
        self.every = every
        self.clock = clock
        self.last_states: tuple | None = None
        self.last_time = -math.inf
        self.done = False
        # per node: (membership, when a young phase turns notable, the states then)
        self._counted: tuple[int, float, tuple] | None = None

    def update(self, record: LaunchRecord, final: bool = False) -> None:
        """Print a status line when due, or the summary line when ``final``."""
        if self.done:
            return
        if final:
            self.done = True
            if self.last_states is not None or record.elapsed >= self.quiet_for:
                self._write(self.summary_line(record))
            return
        if record.elapsed < self.quiet_for:
            return
        now = self.clock()
        states, ended = self._lasting_states(record)
        if ended:
            return  # the summary line follows
        if states != self.last_states or now - self.last_time >= self.every:
            first = self.last_states is None
            self.last_states, self.last_time = states, now
            self._write(self.status_line(record, first))

    def _lasting_states(self, record: LaunchRecord) -> tuple[tuple, bool]:
        """What a status line is news for, and whether every rank ended: each rank's state, a
        phase younger than ``NOTABLE_PHASE`` counted as running. Per node (a large launch),
        the states counted, looked at again only after a rank's state or phase changed or when
        a young phase turns notable: a wakeup costs nothing otherwise, whatever the ranks."""
        if not per_node(record):
            states = tuple(_lasting_state(status) for status in record.ranks.values())
            return states, all(state in _ENDED for state in states)
        table, now = taken_in(record), time.time()
        counted = self._counted
        if counted is None or counted[0] != table.membership or now >= counted[1]:
            counts, turns = +table.states, math.inf
            for rank in table.in_phase:
                status = record.ranks[rank]
                notable_at = status.phase_started + NOTABLE_PHASE
                if status.state not in _ENDED and now < notable_at:
                    counts[status.state] -= 1
                    counts[RankState.RUNNING] += 1
                    turns = min(turns, notable_at)
            counted = self._counted = table.membership, turns, tuple(sorted((+counts).items()))
        return counted[2], all(state in _ENDED for state, _ in counted[2])

    def status_line(self, record: LaunchRecord, first: bool = False) -> str:
        """``12.0 s: 2 running | train 40/100 [...] | loss 0.12 @ step 40``; the ``first``
        line also says which workers run it (``| fresh workers (fork)``)."""
        parts = [f"{format_duration(record.elapsed)}: {rank_states(record)}"]
        if first:
            parts.append(workers_text(record))
        parts += [text for text in (progress_text(record), metrics_text(record)) if text]
        return " | ".join(parts)

    def summary_line(self, record: LaunchRecord) -> str:
        """``finished in 12.3 s: 2 finished | on the warm pool (fork) | ... | largest RSS 230.1 MB``."""
        outcome = record.outcome or "ended"
        preposition = "in" if outcome == "finished" else "after"
        parts = [f"{outcome} {preposition} {format_duration(record.elapsed)}: "
                 f"{rank_states(record)}", workers_text(record)]
        parts += [text for text in (progress_text(record), metrics_text(record)) if text]
        largest = max((s.rss for s in record.ranks.values() if s.rss), default=None)
        if largest:
            parts.append(f"largest RSS {format_bytes(largest)}")
        dropped = sum(record.dropped.values())
        if dropped:
            parts.append(f"{dropped} events dropped")
        hidden = rich_hidden_text(record)
        if hidden:
            parts.append(hidden)
        return " | ".join(parts)

    def _write(self, line: str) -> None:
        say(line, self.stream)
