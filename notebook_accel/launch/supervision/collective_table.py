"""Every rank's last collectives side by side, aligned by their number: ``pool.collectives()``.

One table per process group; a row per collective number, a column per rank, where ranks
whose columns read alike share one (``ranks 0-1022``), so a thousand ranks that agree take
one column and the one that does not stands out beside it. A cell reads
``all_reduce float32[1024] train.py:18``, ``... waiting`` while the rank is still in it,
``-`` where the rank has no such collective (not issued, or out of its ring). Past 8
different columns, those of the most ranks are shown and the rest counted on one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from notebook_accel.launch.supervision.collective_disagreement import DEFAULT_GROUP
from notebook_accel.launch.supervision.tracebacks import short_place
from notebook_accel.launch.views.rank_ranges import ranks_text
from notebook_accel.wire import Collective

_WIDEST = 64  # characters a cell shows at most
_GAP = "  "
_COLUMNS = 8  # columns shown at most, those of the most ranks (the rest are counted)


def collectives_text(recorders: Mapping[int, Sequence[Collective] | None], last: int,
                     silent: Sequence[int] = ()) -> str:
    """The last ``last`` collectives of every group, side by side (see the module's docstring);
    ``silent``: ranks that did not answer."""
    known = {rank: tuple(c) for rank, c in recorders.items() if c is not None}
    groups = sorted({c.group for collectives in known.values() for c in collectives},
                    key=lambda g: (g != DEFAULT_GROUP, g))
    parts = [_group_table(group, known, last) for group in groups]
    if not parts:
        parts.append("no collective recorded yet" if known else "no rank answered")
    unrecorded = sorted(set(recorders) - set(known))
    if unrecorded:
        parts.append(f"{ranks_text(unrecorded)}: no recorder")
    if silent:
        parts.append(f"{ranks_text(silent)}: no answer (gone, or busy)")
    return "\n\n".join(parts)


def _group_table(group: str, known: Mapping[int, tuple[Collective, ...]], last: int) -> str:
    by_rank = {rank: {c.number: c for c in collectives if c.group == group}
               for rank, collectives in known.items()}
    if group != DEFAULT_GROUP:
        by_rank = {rank: numbers for rank, numbers in by_rank.items() if numbers}
    newest = max(n for numbers in by_rank.values() for n in numbers)
    rows = list(range(max(1, newest - last + 1), newest + 1))
    columns: dict[tuple[str, ...], list[int]] = {}
    for rank in sorted(by_rank):
        cells = tuple(_cell(by_rank[rank].get(n)) for n in rows)
        columns.setdefault(cells, []).append(rank)
    ordered = sorted(columns.items(), key=lambda column: column[1][0])
    if len(ordered) > _COLUMNS:  # the most ranks' columns, still in rank order; the rest counted
        kept = sorted(ordered, key=lambda column: (-len(column[1]), column[1][0]))[:_COLUMNS]
        rest = [rank for cells, ranks in ordered if (cells, ranks) not in kept for rank in ranks]
        ordered = [column for column in ordered if column in kept]
    else:
        rest = []
    heads = ["#"] + [ranks_text(ranks) for _, ranks in ordered]
    body = [[str(n)] + [cells[i] for cells, _ in ordered] for i, n in enumerate(rows)]
    widths = [max(len(row[i]) for row in [heads, *body]) for i in range(len(heads))]
    lines = [f"group {group} (the last {len(rows)}):"]
    for row in [heads, *body]:
        lines.append(_GAP.join(text.rjust(widths[0]) if i == 0 else text.ljust(widths[i])
                               for i, text in enumerate(row)).rstrip())
    if rest:
        lines.append(f"({ranks_text(rest)}: {len(columns) - _COLUMNS} other columns, not shown)")
    return "\n".join(lines)


def _cell(collective: Collective | None) -> str:
    """The operation, its tensors (cut short to fit :data:`_WIDEST`: the rest is kept
    whole), the user's line, and ``waiting`` while the rank is in it."""
    if collective is None:
        return "-"
    place = "" if collective.where is None else " " + short_place(*collective.where[:2])
    waiting = "" if collective.done else " waiting"
    tensors = ",".join(collective.tensors)
    room = max(8, _WIDEST - len(collective.op) - len(place) - len(waiting) - 1)
    if len(tensors) > room:
        tensors = tensors[:room - 3] + "..."
    return " ".join(filter(None, [collective.op, tensors])) + place + waiting
