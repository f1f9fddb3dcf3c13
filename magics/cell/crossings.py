"""Which notebook names a cell on the pool sends, and the lines that say what crossed.

On a warm pool the workers' names win, whatever their origin: a name they hold (assigned
by a cell, or sent from the notebook earlier) is not sent again, so an in-place change
made on the workers is never undone by the notebook's stale copy. Two cases send it
anyway, each said in one line: ``--push NAME`` (the user asks), and a function or class
the notebook sent earlier and has redefined since (code holds no training state). When
the notebook's value of a name differs from the workers' and is not sent, the cell says
so too, so a changed ``lr`` in the notebook is never ignored silently.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from magics.cell.ledger import NameLedger
from notebook_accel.launch import rank_bound_kind

_MOST = 8  # names listed in a line before "and N more"


@dataclass
class Crossing:
    """What a cell sends, beyond the names the workers lack.

    Attributes:
        send: the names to send (checked by :func:`magics.cell.shipping.collect_names`).
        replace: those of ``send`` that replace the workers' own value.
        redefined: those of ``replace`` sent because the notebook redefined them.
        kept: names the cell reads whose notebook value differs from the workers', not sent.
    """

    send: list[str] = field(default_factory=list)
    replace: list[str] = field(default_factory=list)
    redefined: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def is_notebook_code(value: Any) -> bool:
    """A function or class defined in the notebook (not imported from a module)."""
    return (isinstance(value, (types.FunctionType, type))
            and getattr(value, "__module__", None) == "__main__")


def choose(reads: Sequence[str], namespace: Mapping[str, Any], ledger: NameLedger,
           on_workers: Iterable[str] = (), copies: Iterable[str] = (),
           push: Sequence[str] = ()) -> Crossing:
    """Decide which of the names a cell reads are sent (see the module's docstring).

    Args:
        reads: the names the cell reads.
        namespace: the notebook's namespace.
        ledger: what crossed before.
        on_workers: the names the pool's workers hold (none for fresh workers).
        copies: those of ``on_workers`` that still hold the notebook's copy.
        push: names the user asked to send even though the workers hold their own.
    """
    on_workers, copies = set(on_workers), set(copies)
    crossing = Crossing()
    for name in dict.fromkeys([*reads, *push]):
        if name not in namespace:
            continue  # the workers' own, or a builtin
        value = namespace[name]
        if name not in on_workers:
            crossing.send.append(name)
        elif name in push:
            crossing.send.append(name)
            crossing.replace.append(name)
        elif isinstance(value, types.ModuleType) or ledger.matches_workers(name, value):
            continue
        elif name in copies and is_notebook_code(value):
            crossing.send.append(name)
            crossing.replace.append(name)
            crossing.redefined.append(name)
        else:
            crossing.kept.append(name)
    return crossing


def listed(names: Sequence[str]) -> str:
    """``a, b, c`` (at most a few, then ``and N more``)."""
    more = f" and {len(names) - _MOST} more" if len(names) > _MOST else ""
    return ", ".join(names[:_MOST]) + more


def holds_state(value: Any) -> bool:
    """Worth naming: not a module, nor a function or class imported from one."""
    if isinstance(value, types.ModuleType):
        return False
    return not isinstance(value, (types.FunctionType, type)) or is_notebook_code(value)


def summary(sent: Mapping[str, Any], pulled: Mapping[str, Any], crossing: Crossing,
            on_pool: bool, ledger: NameLedger) -> str | None:
    """One line: the names sent from the notebook and those brought back from rank 0."""
    parts = []
    out = []
    for name, value in sent.items():
        if not holds_state(value) and name not in crossing.replace:
            continue
        snapshot = ledger.snapshot(name, value)
        if name in crossing.redefined:
            out.append(f"{name} (redefined in the notebook)")
        elif name in crossing.replace:
            out.append(f"{name} (replacing the workers')")
        elif snapshot is not None:
            out.append(f"{name} (rank 0's copy from cell [{snapshot.cell}])")
        else:
            out.append(name)
    if out:
        parts.append("sent from the notebook: " + listed(out))
    back = [name for name, value in pulled.items() if holds_state(value)]
    if back:
        bound = [name for name in back if rank_bound_kind(pulled[name]) is not None]
        note = []
        if on_pool:
            note.append("copies: the live objects stay on the workers")
        if bound:
            note.append(f"{listed(bound)}: rank 0's, to look at here; never sent to the workers")
        parts.append("back from rank 0: " + listed(back) + (f" ({'; '.join(note)})" if note else ""))
    return "[notebook_accel] " + " · ".join(parts) if parts else None


def kept_notice(crossing: Crossing) -> str | None:
    """One line naming the notebook values the workers did not take."""
    if not crossing.kept:
        return None
    names = crossing.kept
    them = "it" if len(names) == 1 else "them"
    return (f"[notebook_accel] the workers keep their own {listed(names)} (the notebook's "
            f"differs: changed since it crossed, or never sent); %%accelerate --push "
            f"{','.join(names)} sends {them}, replacing theirs")


def report_kept(crossing: Crossing) -> None:
    """Print :func:`kept_notice` to stderr, when there is something to say."""
    notice = kept_notice(crossing)
    if notice:
        print(notice, file=sys.stderr, flush=True)
