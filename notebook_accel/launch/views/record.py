"""What the kernel knows about a launch while it runs and after: the model behind the views.

The supervisor fills a :class:`LaunchRecord` (per-rank state, memory, last output
line; progress and metric events from the workers); views (the notebook's live
display, the text fallback) only read it. After the job, ``last_launch()``
returns it, e.g. ``last_launch().history["loss"]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from notebook_accel.wire import Dropped, Memory, Message, Metrics, Phase, Progress, RichHidden

if TYPE_CHECKING:
    from notebook_accel.launch.views.rank_logs import RankLogs



class RankState(str, Enum):
    """A rank's state as the kernel shows it; str-valued, so the views and messages read the
    words themselves (``"running"``, ``f"{state}"`` too). A phase the worker names
    (``Phase``) that is none of these is shown by its name."""

    __str__ = str.__str__  # the word, as ``enum.StrEnum`` (Python 3.11) says it
    __format__ = str.__format__

    STARTING = "starting"  # started, not watched yet
    RUNNING = "running"
    COMPILING = "compiling"  # a phase: torch.compile at work (runtime/compilation.py)
    NO_PROGRESS = "no progress"  # a phase: silent for hang_after seconds (the hang watch's mark)
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"  # we stopped it (another rank failed, a timeout, the stop button)


ENDED_STATES = frozenset({RankState.FINISHED, RankState.FAILED, RankState.STOPPED})  # how a
# rank ends (no phase replaces them)


@dataclass
class RankStatus:
    """One worker as the kernel sees it."""

    rank: int
    pid: int | None = None
    node: int = 0  # the node it runs on (a cluster's)
    state: RankState | str = RankState.STARTING  # a phase the worker names: its name
    started: float = field(default_factory=time.time)
    ended: float | None = None
    exitcode: int | None = None
    rss: int | None = None  # bytes
    gpu_memory: int | None = None  # bytes, where the worker reports it
    last_line: str = ""
    phase_started: float | None = None  # when its current phase (state "compiling") began
    watchers: Any = field(default=None, repr=False, compare=False)

    def watch(self, watchers: Any) -> None:
        """Tell ``watchers`` of every change from now on (``watchers.changed(status, field)``;
        ``"progress"`` for a new state of its progress bar): a view's summary takes in what
        changed as it changes, not every rank at each redraw. Only a watched status pays."""
        self.watchers = watchers
        self.__class__ = WatchedRankStatus

    @property
    def elapsed(self) -> float:
        return (self.ended or time.time()) - self.started

    @property
    def phase_elapsed(self) -> float | None:
        """Seconds in the current phase (None outside one)."""
        if self.phase_started is None:
            return None
        return (self.ended or time.time()) - self.phase_started

    def enter_phase(self, name: str | None, when: float) -> None:
        """Show the phase ``name`` as the rank's state from ``when`` on (None: back to running);
        a rank that has ended keeps its state."""
        if self.state in ENDED_STATES:
            return
        if name is None:
            self.state, self.phase_started = RankState.RUNNING, None
        elif self.state != name:
            self.state, self.phase_started = _STATES.get(name, name), when


_STATES: dict[str, RankState] = {state.value: state for state in RankState}


class WatchedRankStatus(RankStatus):
    """A status a view watches (``RankStatus.watch``): each change is told to the watchers."""

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get(name, _UNSET) == value:
            return
        object.__setattr__(self, name, value)
        self.watchers.changed(self, name)


_UNSET = object()


@dataclass
class LaunchRecord:
    """A launch: its settings, its ranks, and the events they sent.

    Attributes:
        history: metric name -> list of ``(step, value)`` logged by rank 0, in order.
        progress: rank -> the latest progress state it reported (a dict).
        dropped: rank -> events the worker dropped because the kernel lagged.
        rich_hidden: rank -> rich displays of that (non-main) rank not shown: their only
            text was a default repr such as ``<IPython.core.display.HTML object>``.
        outcome: None while running, then "finished", "failed", "interrupted" or
            "timed out".
        root_cause: the rank whose failure ended the job (set when one failed).
        warm_pool: True when the ranks are a warm pool's workers, kept across calls (their
            handles are ``persistent``); False for workers started for this launch.
        output: every rank's output lines, whatever the cell showed (see :meth:`logs`).
    """

    world_size: int
    num_processes: int
    device_type: str
    start_method: str
    mixed_precision: str
    warm_pool: bool = False
    started: float = field(default_factory=time.time)
    ended: float | None = None
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    history: dict[str, list[tuple[int | None, float]]] = field(default_factory=dict)
    progress: dict[int, dict[str, Any]] = field(default_factory=dict)
    dropped: dict[int, int] = field(default_factory=dict)
    rich_hidden: dict[int, int] = field(default_factory=dict)
    outcome: str | None = None
    root_cause: int | None = None
    events: int = 0
    output: RankLogs | None = field(default=None, repr=False)
    node_table: Any = field(default=None, repr=False, compare=False)  # views' per-node summary

    @property
    def elapsed(self) -> float:
        return (self.ended or time.time()) - self.started

    def apply(self, rank: int, message: Message) -> None:
        """Fold one event message of ``rank`` into the record."""
        self.events += 1
        if type(message) is Metrics:
            if rank == min(self.ranks, default=0):
                for name, value in message.values.items():
                    self.history.setdefault(name, []).append((message.step, value))
        elif type(message) is Progress:
            self.progress[rank] = dict(message.state, time=message.timestamp)
            status = self.ranks.get(rank)
            if status is not None and status.watchers is not None:
                status.watchers.changed(status, "progress")
        elif type(message) is Phase:
            self.ranks[rank].enter_phase(message.name, message.timestamp or time.time())
        elif type(message) is Memory:
            self.ranks[rank].gpu_memory = message.gpu
        elif type(message) is Dropped:
            self.dropped[rank] = self.dropped.get(rank, 0) + message.count
        elif type(message) is RichHidden:
            self.rich_hidden[rank] = self.rich_hidden.get(rank, 0) + message.count

    def logs(self, rank: int, stream: str | None = None) -> str:
        """Everything ``rank`` printed (only ``stream``'s, "stdout" or "stderr", if given), one
        line per line, also what the cell left out (rate-limited, or shown once for many
        ranks); e.g. ``print(last_launch().logs(3))``."""
        return self.output.text(rank, stream) if self.output is not None else ""

    def finish(self, outcome: str, ended: float | None = None) -> None:
        """Set the outcome; ``ended`` (a ``time.time()``) defaults to now."""
        self.outcome = outcome
        self.ended = time.time() if ended is None else ended


_last: LaunchRecord | None = None


def remember(record: LaunchRecord) -> None:
    global _last
    _last = record


def last_launch() -> LaunchRecord | None:
    """The record of the most recent launch in this process (None before any)."""
    return _last
