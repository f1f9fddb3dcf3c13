"""The kernel side of names out: load what rank 0 sent back and say what stayed behind."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Sequence
from typing import Any

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


def report(failed: dict[str, str]) -> None:
    """Print :func:`notice` to stderr when something stayed behind."""
    if failed:
        print(notice(failed), file=sys.stderr, flush=True)
