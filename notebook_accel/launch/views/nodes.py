"""A large launch at a glance: one row per node, plus the ranks that went wrong.

Above ``PER_RANK_LIMIT`` ranks a view shows no row per rank (1024 rows are ~700 kB per redraw):
each node gets one :class:`NodeRow` (its ranks' state counts, its slowest rank, its largest
memory, the last line most of its ranks show and a rank whose line differs), at most
``NODE_ROWS`` of them (nodes with a failed rank first), then the abnormal ranks (failed, or
stopped, root cause first), at most ``ABNORMAL_ROWS``. What does not fit is counted.
:class:`NodeTable` keeps the rows, recomputing only the nodes whose ranks changed, so a redraw
costs the nodes, not the ranks, and one with nothing changed reuses what was drawn.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

from notebook_accel.launch.record import LaunchRecord, RankStatus

PER_RANK_LIMIT = 32  # ranks shown one row each up to this many
NODE_ROWS = 32
ABNORMAL_ROWS = 16
ABNORMAL_STATES = ("failed", "stopped")
LOOK_BUDGET = 0.0003  # seconds a look spends on rows whose node changed no state


@dataclass
class NodeRow:
    """One node's ranks, summarised."""

    node: int
    ranks: list[int] = field(default_factory=list)
    states: Counter = field(default_factory=Counter)
    slowest: int | None = None  # the rank with the least progress (None: no progress events)
    rss: int | None = None  # the largest of its ranks' (bytes)
    gpu_memory: int | None = None
    common_line: str = ""  # the last line most of its ranks show
    divergent: tuple[int, str] | None = None  # a rank whose last line is another, and that line
    divergent_count: int = 0  # how many ranks show another line
    shown: dict = field(default_factory=dict, repr=False, compare=False)  # a view's text of it

    @property
    def states_text(self) -> str:
        """``"7 running, 1 failed"``."""
        return ", ".join(f"{count} {state}" for state, count in self.states.most_common())


def per_node(record: LaunchRecord) -> bool:
    """Whether a view shows this launch per node (more than ``PER_RANK_LIMIT`` ranks)."""
    return len(record.ranks) > PER_RANK_LIMIT


class NodeTable:
    """A record's rows per node, kept up to date at the cost of what changed: each rank's
    status tells the table when it changes (``RankStatus.watch``). A look counts the changed
    ranks' states exactly, and keeps rows only for the nodes a view shows (at most
    ``NODE_ROWS``: those with a failed rank first, then by number): a shown node whose ranks
    changed state is remade at once, one whose ranks changed otherwise (a new last line,
    memory) within ``LOOK_BUDGET`` seconds a look, oldest first, the rest at the next look
    (all once the launch ended). So a redraw costs the shown rows, whatever the ranks."""

    def __init__(self, record: LaunchRecord) -> None:
        self.record, self.size = record, len(record.ranks)
        self.changed: set[int] = set(record.ranks)
        self.nodes: dict[int, list[int]] = {}
        for status in record.ranks.values():
            self.nodes.setdefault(status.node, []).append(status.rank)
            status.watch(self.changed)
        self.in_order = sorted(self.nodes)
        self.rows: dict[int, NodeRow] = {}  # the shown nodes'
        self.stale: dict[int, None] = {}  # nodes whose row waits to be remade, oldest first
        self.state_of: dict[int, str] = {}
        self.states: Counter = Counter()  # every rank's state, counted
        self.abnormal: set[int] = set()
        self.in_phase: set[int] = set()
        self.gpu = False  # some rank reports its GPU memory
        self.least_done: dict[int, tuple[float, int]] = {}  # node -> its least-done rank's
        self.progressed: set[int] = set()  # nodes whose least-done rank may have changed
        self.showing: list[int] = []  # the nodes shown, as of the last look
        self.settled = False  # no shown node's row waits to be remade
        self.drawn: dict = {}  # a view's text of the shown rows, until a look changes them

    def look(self) -> None:
        """Take in the ranks that changed since the last look (see the class); nothing
        changed and no shown row waiting: nothing to do (a quiet redraw costs no row)."""
        if self.settled and not self.changed:
            return
        self.drawn.clear()
        ranks, urgent = self.record.ranks, []
        for rank in self.changed:
            status = ranks[rank]
            if self.state_of.get(rank) != status.state:
                if rank in self.state_of:
                    self.states[self.state_of[rank]] -= 1
                self.states[status.state] += 1
                self.state_of[rank] = status.state
                urgent.append(status.node)
            self.stale[status.node] = None
            self.progressed.add(status.node)
            _mark(self.abnormal, rank, status.state in ABNORMAL_STATES)
            _mark(self.in_phase, rank, status.phase_started is not None)
            self.gpu = self.gpu or status.gpu_memory is not None
        self.changed.clear()
        self.showing = self.shown()
        shown = set(self.showing)
        for node in list(self.rows):
            if node not in shown:
                del self.rows[node]
                self.stale[node] = None  # remade if it is shown again
        for node in urgent:
            if node in shown:
                self._remake(node)
        deadline = time.perf_counter() + LOOK_BUDGET
        for node in list(self.stale):
            if node not in shown:
                continue
            if self.record.outcome is None and node in self.rows and time.perf_counter() > deadline:
                break
            self._remake(node)
        self.settled = shown.isdisjoint(self.stale)

    def shown(self) -> list[int]:
        """The nodes a view shows: those with a failed rank, then the others by number."""
        failed = sorted({self.record.ranks[rank].node for rank in self.abnormal
                         if self.state_of.get(rank) == "failed"})
        rest = (node for node in self.in_order if node not in failed)
        return [*failed, *itertools.islice(rest, max(0, NODE_ROWS - len(failed)))][:NODE_ROWS]

    def _remake(self, node: int) -> None:
        if self.stale.pop(node, 0) is not None:
            return  # remade already in this look
        self.rows[node] = _row(self.record, node, self.nodes[node])

    def slowest(self) -> int | None:
        """The rank that has done the least of its progress bar (None: no progress events)."""
        progress = self.record.progress
        for node in self.progressed:
            done = [_done(rank, progress[rank]) for rank in self.nodes[node] if rank in progress]
            if done:
                self.least_done[node] = min(done)
        self.progressed.clear()
        return min(self.least_done.values())[1] if self.least_done else None


def node_table(record: LaunchRecord) -> NodeTable:
    """The record's :class:`NodeTable`, up to date."""
    if record.node_table is None or record.node_table.size != len(record.ranks):
        record.node_table = NodeTable(record)
    record.node_table.look()
    return record.node_table


def node_rows(record: LaunchRecord) -> tuple[list[NodeRow], int]:
    """The rows to show (at most ``NODE_ROWS``, nodes with a failed rank first) and how many
    nodes were left out."""
    table = node_table(record)
    rows = [table.rows[node] for node in table.showing]
    return rows, len(table.nodes) - len(rows)


def abnormal_ranks(record: LaunchRecord) -> tuple[list[RankStatus], int]:
    """The failed and stopped ranks (root cause first), at most ``ABNORMAL_ROWS``, and how many
    more there are."""
    found = [record.ranks[rank] for rank in node_table(record).abnormal]
    found.sort(key=lambda s: (s.rank != record.root_cause, s.state != "failed", s.rank))
    return found[:ABNORMAL_ROWS], max(0, len(found) - ABNORMAL_ROWS)


def _row(record: LaunchRecord, node: int, ranks: list[int]) -> NodeRow:
    row, lines = NodeRow(node), Counter()
    for rank in ranks:
        status = record.ranks[rank]
        row.ranks.append(rank)
        row.states[status.state] += 1
        row.rss = _larger(row.rss, status.rss)
        row.gpu_memory = _larger(row.gpu_memory, status.gpu_memory)
        lines[status.last_line.rstrip()] += 1
    row.slowest = _slowest(record, row.ranks)
    common, count = lines.most_common(1)[0]
    row.common_line, row.divergent_count = common, len(row.ranks) - count
    if row.divergent_count:
        row.divergent = next((rank, record.ranks[rank].last_line.rstrip()) for rank in row.ranks
                             if record.ranks[rank].last_line.rstrip() != common)
    return row


def _mark(ranks: set[int], rank: int, member: bool) -> None:
    if member:
        ranks.add(rank)
    else:
        ranks.discard(rank)


def _done(rank: int, state: dict) -> tuple[float, int]:
    total = state.get("total")
    return (state.get("n", 0) / total if total else 0.0, rank)


def _larger(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _slowest(record: LaunchRecord, ranks: list[int]) -> int | None:
    reported = [(state.get("n", 0), rank) for rank in ranks
                if (state := record.progress.get(rank)) is not None]
    return min(reported)[1] if reported else None
