"""The kernel side of names out: load what rank 0 sent back and say what stayed behind."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from magics.cell.crossings import listed
from magics.cell.runner import PulledNames

_REASON_CHARS = 70


def default_pull(assigns: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The names a cell brings back when ``--pull`` does not say (those it assigns), and
    those it leaves on rank 0 quietly: underscore names (``for _ in ...``: IPython's own ``_``
    stays the notebook's; ``_private``), with what they are."""
    return (tuple(name for name in assigns if not name.startswith("_")),
            {name: "an underscore name" for name in assigns if name.startswith("_")})


def unpack(result: PulledNames | None, requested: Sequence[str],
           explicit: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The names rank 0 sent back, and name -> why for those it could not (the names it
    left behind by rule are ``result.skipped``, not failures).

    Args:
        result: the worker's return value (None when nothing was pulled).
        requested: the names asked for.
        explicit: they were named with ``--pull`` (so a missing one is worth a word).
    """
    if result is None:
        return {}, {}
    failed = dict(result.failed)
    try:
        values = pickle.loads(result.blob)
    except Exception as exc:  # noqa: BLE001 - a class the kernel cannot import, say
        reason = f"the kernel cannot load them: {type(exc).__name__}: {exc}"
        return {}, {**failed, **{name: reason for name in requested if name not in failed}}
    if explicit:
        for name in requested:
            if name not in values and name not in failed:
                failed[name] = "not defined on rank 0"
    return values, failed


def notice(failed: dict[str, str]) -> str:
    """One short line naming what did not come back, with a clipped reason each."""
    parts = []
    for name, reason in failed.items():
        if len(reason) > _REASON_CHARS:
            reason = reason[: _REASON_CHARS - 3] + "..."
        parts.append(f"{name} ({reason})")
    return "[notebook_accel] not brought back from rank 0: " + "; ".join(parts)


def stopped_text(stop: BaseException, names: Sequence[str], namespace: Mapping[str, Any],
                 on_workers: Sequence[str] | None) -> str:
    """The stop's line of a stopped cell, saying which of the ``names`` it would have brought
    back did not come (none is brought back after a stop): those the pool's workers hold now
    (``on_workers``; None: fresh workers, which are gone), and which of the notebook's own are
    older than the workers'.

    >>> stopped_text(KeyboardInterrupt("interrupted; the pool keeps its state"), ["step"],
    ...              {"step": 200}, ["step"])
    "interrupted; the pool keeps its state; not brought back to the notebook: step (the notebook's step is older than the workers')"
    """
    line = str(stop) or "interrupted"
    names = [name for name in names if not name.startswith("_")]
    if on_workers is not None:
        names = [name for name in names if name in on_workers]
    if not names:
        return line
    older = [name for name in names if name in namespace]
    than = " than the workers'" if on_workers is not None else ""
    verb = "is" if len(older) == 1 else "are"
    return (f"{line}; not brought back to the notebook: {listed(names)}"
            + (f" (the notebook's {listed(older)} {verb} older{than})" if older else ""))


def report(failed: dict[str, str]) -> None:
    """Print :func:`notice` to stderr when something stayed behind."""
    if failed:
        print(notice(failed), file=sys.stderr, flush=True)
