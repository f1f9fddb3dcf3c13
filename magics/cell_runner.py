"""The worker side of ``%%accelerate``: run the cell's code, hand back what it assigned.

This module runs inside every worker, so it imports neither IPython nor the rest
of :mod:`magics`; it is pickled by reference and imported there.
"""

from __future__ import annotations

import builtins
import importlib
import linecache
import os
from dataclasses import dataclass, field
from typing import Any

from notebook_accel.launch.payload import dumps_result


@dataclass
class CellCode:
    """The cell as the workers compile it.

    Attributes:
        source: the cell body, preceded by blank lines so line numbers count from
            the top of the notebook cell (the ``%%accelerate`` line is line 1).
        filename: the name tracebacks show; registered in ``linecache``.
        lines: the whole notebook cell, for tracebacks to quote.
    """

    source: str
    filename: str
    lines: list[str]

    def register(self) -> None:
        """Put the cell into ``linecache`` (mtime None: never checked on disk)."""
        size = sum(len(line) for line in self.lines)
        linecache.cache[self.filename] = (size, None, list(self.lines), self.filename)


@dataclass
class PulledNames:
    """What rank 0 sends back: its names, pickled together, and what stayed behind.

    Attributes:
        blob: the names that could be serialised, as one pickle of a dict, so
            objects shared between them (a model and its optimizer) stay shared.
        failed: name -> why it could not come back.
    """

    blob: bytes
    failed: dict[str, str] = field(default_factory=dict)


def run_cell(cell: CellCode, values: dict[str, Any], modules: dict[str, str],
             pull: tuple[str, ...]) -> PulledNames | None:
    """Run the cell in a fresh namespace holding the shipped names.

    Args:
        cell: the code to run.
        values: names shipped by value (already unpickled by the launcher).
        modules: name -> module name, imported here.
        pull: names to send back from the first local worker; empty: none.
    Returns:
        On the node's first worker, the pulled names; elsewhere None.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython/pytest convention: not the user's frame
    cell.register()
    code = compile(cell.source, cell.filename, "exec")
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    for name, module_name in modules.items():
        namespace[name] = importlib.import_module(module_name)
    namespace.update(values)
    exec(code, namespace)
    if not pull or os.environ.get("LOCAL_RANK", "0") != "0":
        return None
    return pack_names({name: namespace[name] for name in pull if name in namespace})


def pack_names(names: dict[str, Any]) -> PulledNames:
    """Serialise ``names`` together; leave out (and say why) the ones that cannot be."""
    try:
        return PulledNames(dumps_result(names))
    except Exception:  # noqa: BLE001 - find the culprits one by one below
        pass
    failed: dict[str, str] = {}
    for name, value in names.items():
        try:
            dumps_result(value)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is reported
            failed[name] = f"{type(exc).__name__}: {exc}"
    kept = {name: value for name, value in names.items() if name not in failed}
    try:
        return PulledNames(dumps_result(kept), failed)
    except Exception as exc:  # noqa: BLE001 - fails only together: give up on all
        reason = f"{type(exc).__name__}: {exc}"
        return PulledNames(dumps_result({}), {**failed, **dict.fromkeys(kept, reason)})
