"""The kernel side of names in: pick what a cell needs from the notebook, check it travels.

Modules go by name (the worker imports them again); everything else by cloudpickle,
so functions and classes defined in the notebook travel by value. Each value is
tried on its own, so *every* name that cannot travel is reported at once, before
any worker starts.
"""

from __future__ import annotations

import builtins
import difflib
import importlib.util
import re
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from magics.cell.ledger import NameLedger
from notebook_accel.launch import check_sendable, serialise_payload


class UnshippableNamesError(TypeError):
    """Names the cell reads cannot be sent to the workers (raised before any starts).

    Attributes:
        reasons: name -> why it cannot be sent.
    """

    def __init__(self, reasons: Mapping[str, str]) -> None:
        self.reasons = dict(reasons)
        listing = "\n".join(f"  {name}: {why}" for name, why in self.reasons.items())
        super().__init__(
            f"%%accelerate cannot send {len(self.reasons)} name(s) the cell uses to the workers; "
            f"no worker was started:\n{listing}\n"
            "Create them inside the cell instead, or pass something that can be pickled.")

    def _render_traceback_(self) -> list[str]:
        """IPython hook: the message alone; the magic's internals are no help here."""
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self.args[0]}"]


class UndefinedNamesError(NameError):
    """The cell reads names that exist nowhere: not in the notebook, not assigned by the
    cell, not builtins (raised before any worker starts).

    Attributes:
        names: the undefined names, in order of first use.
    """

    def __init__(self, names: list[str], hints: Mapping[str, str]) -> None:
        self.names = list(names)
        listed = ", ".join(repr(name) + (f" (did you mean {hints[name]!r}?)" if name in hints
                                         else "") for name in names)
        plural = "s" if len(names) > 1 else ""
        super().__init__(
            f"name{plural} {listed} {'are' if plural else 'is'} not defined: the cell reads "
            f"{'them' if plural else 'it'}, but neither the notebook nor the cell defines "
            f"{'them' if plural else 'it'}; no worker was started")

    def _render_traceback_(self) -> list[str]:
        """IPython hook: the message alone, as for a NameError in a plain cell."""
        return [f"\x1b[31mNameError\x1b[0m: {self.args[0]}"]


def check_defined(reads: Iterable[str], assigns: Iterable[str], namespace: Mapping[str, Any]) -> None:
    """Refuse a cell that reads a name defined nowhere.

    A name the cell assigns somewhere is let through (it may be bound on the path
    that reads it); so are builtins and the notebook's names.

    Raises:
        UndefinedNamesError: naming each, with the closest notebook name when one is near.
    """
    assigned = set(assigns)
    missing = [name for name in reads if name not in namespace and name not in assigned
               and not hasattr(builtins, name)]
    if missing:
        candidates = [name for name in namespace if not name.startswith("_")]
        hints = {name: close[0] for name in missing
                 if (close := difflib.get_close_matches(name, candidates, n=1))}
        raise UndefinedNamesError(missing, hints)


@dataclass
class Shipment:
    """What goes to the workers.

    Attributes:
        values: name -> value, serialised by the launcher with cloudpickle.
        modules: name -> module name, imported again in each worker.
    """

    values: dict[str, Any] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)


def collect_names(reads: Iterable[str], namespace: Mapping[str, Any],
                  hidden: Mapping[str, Any] = types.MappingProxyType({}),
                  ledger: NameLedger | None = None) -> Shipment:
    """Pick the names in ``reads`` that ``namespace`` holds and check each can travel.

    An object that belongs to one rank (an ``Accelerator``, a prepared model, optimizer
    or loader, a process group, or anything holding one) never travels: every worker
    would get that one process's identity.

    Args:
        reads: names the cell may read (:func:`magics.cell.names.analyse_cell`).
        namespace: the notebook's namespace.
        hidden: IPython's own names (``In``, ``Out``, ``get_ipython``...); skipped
            while they still hold IPython's value.
        ledger: where the notebook's names came from, for the refusal's advice.
    Returns:
        The :class:`Shipment`.
    Raises:
        UnshippableNamesError: listing every name that cannot travel, with the reason.
    """
    shipment, refused = Shipment(), {}
    for name in reads:
        if name not in namespace:
            continue  # a builtin (undefined names were refused by check_defined)
        value = namespace[name]
        if name in hidden and hidden[name] is value:
            continue
        if isinstance(value, types.ModuleType):
            reason = _module_problem(value)
            if reason is None:
                shipment.modules[name] = value.__name__
            else:
                refused[name] = reason
            continue
        reason = _value_problem(name, value, ledger)
        if reason is None:
            shipment.values[name] = value
        else:
            refused[name] = reason
    if refused:
        raise UnshippableNamesError(refused)
    return shipment


def _module_problem(module: types.ModuleType) -> str | None:
    name = module.__name__
    if name == "__main__":
        return "it is the __main__ module, which workers cannot import"
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"module {name!r} cannot be imported by name in a worker"
    return None


def _value_problem(name: str, value: Any, ledger: NameLedger | None) -> str | None:
    try:
        rank_bound = check_sendable(value)
    except Exception as exc:  # noqa: BLE001 - any failure means it cannot travel
        return _where(name, value) or f"{type(exc).__name__}: {exc}"
    if rank_bound is None:
        return None
    snapshot = ledger.snapshot(name, value) if ledger is not None else None
    if snapshot is not None:
        return (f"rank 0's copy of {rank_bound}, brought back by cell [{snapshot.cell}]: it "
                "carries rank 0's identity (rank, world size, process group), so it is never "
                f"sent to other ranks; run the cell that builds it (In [{snapshot.cell}]) "
                "again, so that each worker builds its own")
    return (f"{rank_bound}, made in the notebook: it carries one process's identity (rank, "
            "world size, process group), so it is never sent to the workers; build it inside "
            "the %%accelerate cell, so that each worker builds its own")


_LAUNCHER_MESSAGE = re.compile(r"cannot send kwargs\[(?P<key>'[^']*')\](?P<path>.*?) to the "
                               r"workers: (?P<error>.*?)\. Create it", re.DOTALL)


def _where(name: str, value: Any) -> str | None:
    """The launcher's diagnosis (which part of the value fails), reworded for a cell."""
    try:
        serialise_payload(_nothing, (), {name: value})
    except TypeError as exc:
        match = _LAUNCHER_MESSAGE.search(str(exc))
        if match is None:
            return None
        path = match["path"].rstrip()
        return f"{match['error']}" + (f" (at {name}{path})" if path.strip() else "")
    return None


def _nothing() -> None:
    return None
