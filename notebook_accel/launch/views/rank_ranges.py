"""Rank lists as people read them: ``rank 1``, ``ranks 0, 1``, ``ranks 0-511, 513-1023``.

Used wherever a line names ranks (errors, the stop button, grouped output lines, the live
view), so that naming 1024 ranks takes a few characters, not 5000.
"""

from __future__ import annotations

from collections.abc import Iterable

PIECES = 12  # runs named before "and N more"


def rank_runs(ranks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, distinct ``ranks`` as runs of consecutive numbers: ``[(0, 511), (513, 1023)]``."""
    runs: list[tuple[int, int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    return runs


def ranges_text(ranks: Iterable[int], limit: int | None = PIECES) -> str:
    """``"0-511, 513-1023"`` (a run of two is ``"4, 5"``); past ``limit`` runs, the rest is
    counted: ``"0, 2, 4, ... and 509 more"``."""
    pieces: list[str] = []
    runs = rank_runs(ranks)
    for first, last in runs:
        if first == last:
            pieces.append(str(first))
        elif last == first + 1:
            pieces += [str(first), str(last)]
        else:
            pieces.append(f"{first}-{last}")
    if limit is not None and len(pieces) > limit:
        shown = pieces[:limit]
        rest = sum(1 for _ in _expand(runs)) - sum(_count(piece) for piece in shown)
        return ", ".join(shown) + f", ... and {rest} more"
    return ", ".join(pieces)


def ranks_text(ranks: Iterable[int], limit: int | None = PIECES) -> str:
    """``"rank 1"``, ``"ranks 0, 1"``, ``"ranks 0-511, 513-1023"``."""
    ranks = list(ranks)
    return ("rank " if len(set(ranks)) == 1 else "ranks ") + ranges_text(ranks, limit)


def _expand(runs: list[tuple[int, int]]) -> Iterable[int]:
    for first, last in runs:
        yield from range(first, last + 1)


def _count(piece: str) -> int:
    first, _, last = piece.partition("-")
    return int(last) - int(first) + 1 if last else 1


def parse_ranks(ranks: int | str | Iterable[int], world_size: int) -> tuple[int, ...]:
    """The ranks a user chose (``1``, ``"0,2-3"``, ``[0, 2]``), sorted and distinct.

    Raises:
        ValueError: not a rank list, or a rank outside ``0..world_size-1`` (both named).
    """
    if isinstance(ranks, bool):
        raise ValueError(f"ranks={ranks!r}: give ranks as 1, '0,2-3' or [0, 2]")
    if isinstance(ranks, int):
        chosen = [ranks]
    elif isinstance(ranks, str):
        chosen = []
        try:
            for piece in ranks.replace(" ", "").split(","):
                first, dash, last = piece.partition("-")
                chosen += range(int(first), int(last) + 1) if dash else [int(first)]
        except ValueError:
            raise ValueError(f"ranks={ranks!r}: give ranks as '1', '0,2-3' or '0-3'") from None
    else:
        chosen = list(ranks)
    outside = sorted({r for r in chosen if not isinstance(r, int) or not 0 <= r < world_size},
                     key=str)
    if outside or not chosen:
        raise ValueError(f"ranks={ranks!r}: choose among ranks 0-{world_size - 1} "
                         f"(outside: {', '.join(map(str, outside)) or 'none chosen'})")
    return tuple(sorted(set(chosen)))
