"""A large launch at a glance: one row per node, plus the ranks that went wrong.

Above ``PER_RANK_LIMIT`` ranks a view shows no row per rank (1024 rows are ~700 kB per redraw):
each node gets one :class:`NodeRow` (its ranks' state counts, its slowest rank, its largest
memory, the last line most of its ranks show and a rank whose line differs), at most
``NODE_ROWS`` of them (nodes with a failed rank first), then the abnormal ranks (failed, or
stopped, root cause first), at most ``ABNORMAL_ROWS``. What does not fit is counted.
:class:`NodeTable` takes in each rank's change as it comes and keeps the rows, remaking only
shown nodes whose ranks changed, in the wakeups between redraws, so that a redraw costs what it
shows, not the ranks, and one with nothing changed reuses what was drawn.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from notebook_accel.launch.views.record import LaunchRecord, RankState, RankStatus
from notebook_accel.observe.progress import done_fraction

PER_RANK_LIMIT = 32  # ranks shown one row each up to this many
NODE_ROWS = 32
ABNORMAL_ROWS = 16
ABNORMAL_STATES = (RankState.FAILED, RankState.STOPPED)
LOOK_AGAIN = 0.05  # seconds before a look without news remakes more rows (a redraw: 0.3 s)
PREPARE_BUDGET = 0.0001  # seconds a wakeup without a redraw spends on the table (see prepare)
TAKE_IN_CHUNK = 32  # ranks taken in between two looks at the clock
_NO_ROWS = float("-inf")  # a look that remakes no row (a redraw of a table a view prepares)
ROW_FIELDS = frozenset({"state", "rss", "gpu_memory", "last_line"})  # a rank's, a row shows


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
    """A record's rows per node, kept up to date as the ranks change: each rank's status tells
    the table of every change (``RankStatus.watch``), which it takes in at once (its state
    counted, its node marked for a new row, its node's least-done rank updated), so that work
    goes with the news that caused it. Rows are kept only for the nodes a view shows (at most
    ``NODE_ROWS``: those with a failed rank first, then by number).

    The work is done between redraws (:meth:`prepare`, ``PREPARE_BUDGET`` seconds a wakeup):
    the ranks are taken in a few at a time, then the shown nodes whose ranks changed are remade
    (those whose ranks changed state first, oldest first). A redraw's :meth:`look` remakes no
    row: it puts together the rows made so far (a shown node without one yet is counted with
    the nodes left out), and once the launch ended every changed row is remade. So a redraw
    never costs the ranks or the rows, and one with nothing changed reuses what was drawn."""

    def __init__(self, record: LaunchRecord) -> None:
        self.record, self.size = record, len(record.ranks)
        self.nodes: dict[int, list[int]] = {}
        self.in_order: list[int] = []  # the nodes by number (once every rank is taken in)
        self.unwatched = list(record.ranks.values())  # ranks to take in, from ``taken`` on
        self.taken = 0
        self.rows: dict[int, NodeRow] = {}  # the shown nodes'
        self.stale: dict[int, None] = {}  # rows to remake, oldest first
        self.urgent: set[int] = set()  # nodes whose ranks changed state since the last look
        self.state_of: dict[int, str] = {}
        self.states: Counter = Counter()  # every rank's state, counted
        self.failed_nodes: Counter = Counter()  # node -> its failed ranks (only nodes with some)
        self.abnormal: set[int] = set()
        self.in_phase: set[int] = set()
        self.gpu = False  # some rank reports its GPU memory
        self.least_done: dict[int, tuple[float, int]] = {}  # node -> its least-done rank's
        self._slowest: tuple[float, int] | None = None  # the least of them (None: to be found)
        self.showing: list[int] = []  # the nodes shown, as of the last look
        self.news = True  # something changed since the last look
        self.looked = float("-inf")  # when a look last remade rows (time.monotonic())
        self.settled = False  # no shown node's row waits to be remade
        self.drawn: dict = {}  # a view's text of the shown rows, until a look changes them
        self.membership = 0  # counts the changes of a rank's state or phase (a view's key)
        self.named: tuple[int, Any] | None = None  # (membership, a view's ranks named per state)
        self.listed: tuple[Any, Any] | None = None  # ((membership, root cause), the abnormal ranks)
        self.show: Callable[[NodeRow, bool], Any] | None = None  # a view's rendering of a row

    def take_in(self, deadline: float | None = None) -> bool:
        """Watch the ranks not watched yet, taking in what they show now (until ``deadline``, a
        ``time.perf_counter()``; a chunk at least); True once every rank is."""
        pending, first = self.unwatched, self.taken
        progress, nodes, stale = self.record.progress, self.nodes, self.stale
        while self.taken < len(pending):
            if deadline is not None and self.taken > first and time.perf_counter() > deadline:
                return False
            for status in pending[self.taken:self.taken + TAKE_IN_CHUNK]:
                rank, node = status.rank, status.node
                nodes.setdefault(node, []).append(rank)
                self._count_state(status)
                if status.state in ABNORMAL_STATES:
                    self.urgent.add(node)  # (its row first)
                if status.phase_started is not None:
                    self.in_phase.add(rank)
                if status.gpu_memory is not None:
                    self.gpu = True
                if rank in progress:
                    self._progressed(rank, node)
                stale[node] = None
                status.watch(self)
            self.taken += TAKE_IN_CHUNK
            self.news = True
        if not self.in_order:
            self.unwatched = []
            self.in_order = sorted(nodes)
        return True

    def prepare(self, shown: Callable[[NodeRow, bool], Any] | None = None) -> None:
        """Spend ``PREPARE_BUDGET`` seconds of a wakeup without a redraw on the table: take in
        ranks not watched yet, then remake changed rows (see the class), each with the view's
        ``shown(row, gpu)`` (kept in ``row.shown[gpu]``: a redraw then only puts rows together)."""
        self.show = shown or self.show
        deadline = time.perf_counter() + PREPARE_BUDGET
        if self.take_in(deadline):
            self._look(deadline)

    def changed(self, status: RankStatus, name: str) -> None:
        """``status``'s field ``name`` changed (``"progress"``: its progress bar): take it in; its
        node's row is remade only for what the row shows (a new step is news only when it
        changes the node's slowest rank)."""
        node = status.node
        if name == "state":
            self._count_state(status)
            self.urgent.add(node)
        elif name == "phase_started":
            _mark(self.in_phase, status.rank, status.phase_started is not None)
            self.membership += 1
            return
        elif name == "gpu_memory":
            self.gpu = self.gpu or status.gpu_memory is not None
        elif name == "progress":
            if not self._progressed(status.rank, node):
                return
        elif name not in ROW_FIELDS:
            return
        self.stale[node] = None
        self.news = True

    def _count_state(self, status: RankStatus) -> None:
        rank, node, state = status.rank, status.node, status.state
        old = self.state_of.get(rank)
        if old == state:
            return
        if old is not None:
            self.states[old] -= 1
            if old == RankState.FAILED:
                self.failed_nodes[node] -= 1
                if not self.failed_nodes[node]:
                    del self.failed_nodes[node]
        self.states[state] += 1
        self.state_of[rank] = state
        self.membership += 1
        if state == RankState.FAILED:
            self.failed_nodes[node] += 1
        _mark(self.abnormal, rank, state in ABNORMAL_STATES)

    def _progressed(self, rank: int, node: int) -> bool:
        """Keep the node's least-done rank: a rank doing less than it replaces it; when that
        rank itself moves on, the node's few ranks are asked again. True when the node's
        least-done rank is another one now."""
        progress = self.record.progress
        if rank not in progress:
            return False
        mine, least = (done_fraction(progress[rank]), rank), self.least_done.get(node)
        if least is None or mine < least:
            self.least_done[node] = mine
        elif least[1] == rank:
            self.least_done[node] = min((done_fraction(progress[other]), other)
                                        for other in self.nodes[node] if other in progress)
        else:
            return False  # (the node's least-done rank did no more)
        self._slowest = None
        return least is None or self.least_done[node][1] != least[1]

    def look(self) -> None:
        """Bring the table up to date for a redraw: every rank taken in; the rows as
        :meth:`prepare` left them (a table that no view prepares: every changed shown row
        remade, as is every one once the launch ended)."""
        self.take_in()
        self._look(None if self.show is None else _NO_ROWS)

    def _look(self, until: float | None) -> None:
        """Remake the shown rows that changed, those whose ranks changed state first, until
        ``until`` (a ``time.perf_counter()``; one row at least; ``_NO_ROWS``: none; None: all,
        as once the launch ended). Nothing changed and no shown row waiting: nothing to do; the
        several calls of one redraw or wakeup look once (``LOOK_AGAIN``)."""
        now = time.monotonic()
        if not self.news and (self.settled or (self.record.outcome is None
                                               and now - self.looked < LOOK_AGAIN)):
            return
        self.looked = now
        self.news = False
        showing = self.shown()
        if showing != self.showing:
            self.drawn.clear()
            self.showing = showing
        shown = set(showing)
        if self.record.outcome is not None:
            until = None
        elif until is _NO_ROWS:  # (a redraw: the rows as they are)
            self.settled = shown.isdisjoint(self.stale)
            return
        for node in list(self.rows):
            if node not in shown:
                del self.rows[node]
                self.stale[node] = None  # remade if it is shown again
                self.drawn.clear()
        made = 0
        for node in [*(self.urgent & shown), *self.stale]:
            if until is not None and made and time.perf_counter() > until:
                break
            if node in shown and node in self.stale:
                self._remake(node)
                made += 1
        self.urgent.intersection_update(self.stale)
        self.settled = shown.isdisjoint(self.stale)

    def shown(self) -> list[int]:
        """The nodes a view shows: those with a failed rank, then the others by number."""
        failed = sorted(self.failed_nodes)
        rest = (node for node in self.in_order if node not in self.failed_nodes)
        return [*failed, *itertools.islice(rest, max(0, NODE_ROWS - len(failed)))][:NODE_ROWS]

    def _remake(self, node: int) -> None:
        if self.stale.pop(node, 0) is not None:
            return  # remade already in this look
        least = self.least_done.get(node)
        row = self.rows[node] = _row(self.record, node, self.nodes[node], least and least[1])
        if self.show is not None:
            row.shown[self.gpu] = self.show(row, self.gpu)
        self.drawn.clear()

    def slowest(self) -> int | None:
        """The rank that has done the least of its progress bar (None: no progress events)."""
        if self._slowest is None and self.least_done:
            self._slowest = min(self.least_done.values())
        return self._slowest and self._slowest[1]


def _table(record: LaunchRecord) -> NodeTable:
    if record.node_table is None or record.node_table.size != len(record.ranks):
        record.node_table = NodeTable(record)
    return record.node_table


def node_table(record: LaunchRecord) -> NodeTable:
    """The record's :class:`NodeTable`, ready to draw."""
    table = _table(record)
    table.look()
    return table


def taken_in(record: LaunchRecord) -> NodeTable:
    """The record's :class:`NodeTable` with every rank taken in (its counts, phases and
    membership current), no row looked at: what a view that shows no rows needs."""
    table = _table(record)
    table.take_in()
    return table


def prepare_node_table(record: LaunchRecord,
                       shown: Callable[[NodeRow, bool], Any] | None = None) -> None:
    """A view's wakeup without a redraw: the per-node summary's work, a little at a time, rows
    rendered by ``shown`` (:meth:`NodeTable.prepare`); nothing at ``PER_RANK_LIMIT`` ranks or
    fewer."""
    if per_node(record):
        _table(record).prepare(shown)


def node_rows(record: LaunchRecord) -> tuple[list[NodeRow], int]:
    """The rows to show (at most ``NODE_ROWS``, nodes with a failed rank first; a shown node
    whose row is not made yet is left out) and how many nodes were left out."""
    table = node_table(record)
    rows = [table.rows[node] for node in table.showing if node in table.rows]
    return rows, len(table.nodes) - len(rows)


def abnormal_ranks(record: LaunchRecord) -> tuple[list[RankStatus], int]:
    """The failed and stopped ranks (root cause first), at most ``ABNORMAL_ROWS``, and how many
    more there are."""
    table = node_table(record)
    key = (table.membership, record.root_cause)
    if table.listed is None or table.listed[0] != key:  # (kept until a rank's state changes)
        found = heapq.nsmallest(ABNORMAL_ROWS, (record.ranks[rank] for rank in table.abnormal),
                                key=lambda s: (s.rank != record.root_cause, s.state != RankState.FAILED, s.rank))
        table.listed = key, (found, max(0, len(table.abnormal) - ABNORMAL_ROWS))
    return table.listed[1]


def _row(record: LaunchRecord, node: int, ranks: list[int], slowest: int | None) -> NodeRow:
    statuses = [record.ranks[rank] for rank in ranks]
    lines = [status.last_line.rstrip() for status in statuses]
    common, count = Counter(lines).most_common(1)[0]
    row = NodeRow(node, list(ranks), Counter(status.state for status in statuses), slowest,
                  rss=_largest(status.rss for status in statuses),
                  gpu_memory=_largest(status.gpu_memory for status in statuses),
                  common_line=common, divergent_count=len(ranks) - count)
    if row.divergent_count:
        row.divergent = next((rank, line) for rank, line in zip(ranks, lines, strict=True)
                             if line != common)
    return row


def _mark(ranks: set[int], rank: int, member: bool) -> None:
    if member:
        ranks.add(rank)
    else:
        ranks.discard(rank)


def _largest(values) -> int | None:
    """The largest of ``values`` that are known (None: none is)."""
    return max((value for value in values if value is not None), default=None)
