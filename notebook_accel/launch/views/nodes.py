"""A large launch at a glance: one row per node, plus the ranks that went wrong.

Above ``PER_RANK_LIMIT`` ranks a view shows no row per rank (1024 rows are ~700 kB per redraw):
each node gets one :class:`NodeRow` (its ranks' state counts, its slowest rank, its largest
memory, the last line most of its ranks show and a rank whose line differs), at most
``NODE_ROWS`` of them (nodes with a failed rank first), then the abnormal ranks (failed, or
stopped, root cause first), at most ``ABNORMAL_ROWS``. What does not fit is counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from notebook_accel.launch.record import LaunchRecord, RankStatus

PER_RANK_LIMIT = 32  # ranks shown one row each up to this many
NODE_ROWS = 32
ABNORMAL_ROWS = 16
ABNORMAL_STATES = ("failed", "stopped")


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

    @property
    def states_text(self) -> str:
        """``"7 running, 1 failed"``."""
        return ", ".join(f"{count} {state}" for state, count in self.states.most_common())


def per_node(record: LaunchRecord) -> bool:
    """Whether a view shows this launch per node (more than ``PER_RANK_LIMIT`` ranks)."""
    return len(record.ranks) > PER_RANK_LIMIT


def node_rows(record: LaunchRecord) -> tuple[list[NodeRow], int]:
    """The rows to show (at most ``NODE_ROWS``, nodes with a failed rank first) and how many
    nodes were left out."""
    rows: dict[int, NodeRow] = {}
    lines: dict[int, Counter] = {}
    for status in record.ranks.values():
        row = rows.get(status.node)
        if row is None:
            row = rows[status.node] = NodeRow(status.node)
            lines[status.node] = Counter()
        row.ranks.append(status.rank)
        row.states[status.state] += 1
        row.rss = _larger(row.rss, status.rss)
        row.gpu_memory = _larger(row.gpu_memory, status.gpu_memory)
        lines[status.node][status.last_line.rstrip()] += 1
    for node, row in rows.items():
        row.slowest = _slowest(record, row.ranks)
        common, count = lines[node].most_common(1)[0]
        row.common_line, row.divergent_count = common, len(row.ranks) - count
        if row.divergent_count:
            row.divergent = next((rank, record.ranks[rank].last_line.rstrip()) for rank in row.ranks
                                 if record.ranks[rank].last_line.rstrip() != common)
    ordered = sorted(rows.values(), key=lambda r: (not r.states.get("failed"), r.node))
    return ordered[:NODE_ROWS], max(0, len(ordered) - NODE_ROWS)


def abnormal_ranks(record: LaunchRecord) -> tuple[list[RankStatus], int]:
    """The failed and stopped ranks (root cause first), at most ``ABNORMAL_ROWS``, and how many
    more there are."""
    found = [s for s in record.ranks.values() if s.state in ABNORMAL_STATES]
    found.sort(key=lambda s: (s.rank != record.root_cause, s.state != "failed", s.rank))
    return found[:ABNORMAL_ROWS], max(0, len(found) - ABNORMAL_ROWS)


def _larger(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _slowest(record: LaunchRecord, ranks: list[int]) -> int | None:
    reported = [(state.get("n", 0), rank) for rank in ranks
                if (state := record.progress.get(rank)) is not None]
    return min(reported)[1] if reported else None
