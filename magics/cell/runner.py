"""What ``%%accelerate`` sends to the workers: the cell as a job, and the names it hands back.

The workers import this module (its functions travel by reference), so it imports
neither IPython nor the rest of :mod:`magics`.
"""

from __future__ import annotations

import ast
import functools
import importlib
import linecache
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from notebook_accel.launch import dumps_result, join_process_group, worker_scope

CELL_VALUE = "_accelerate_cell_value_"  # the value of a cell's last expression, on rank 0


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
    _code: types.CodeType | None = field(default=None, init=False, repr=False, compare=False)

    def register(self) -> None:
        """Put the cell into ``linecache`` (mtime None: never checked on disk)."""
        size = sum(len(line) for line in self.lines)
        linecache.cache[self.filename] = (size, None, list(self.lines), self.filename)

    def compile(self) -> types.CodeType:
        """Compile the cell; a last expression's value is kept in :data:`CELL_VALUE`.

        Raises:
            SyntaxError: with the cell's file name and line.
        """
        if self._code is None:  # compiled once: the kernel's check and the job share it
            self._code = self.compile_tree(ast.parse(self.source, self.filename))
        return self._code

    def compile_tree(self, tree: ast.Module) -> types.CodeType:
        """:meth:`compile`, from the source already parsed (``tree`` is left as it is)."""
        if self._code is None:
            self._code = _compiled(self.source, self.filename, tree)
        return self._code


@functools.lru_cache(maxsize=64)
def _compiled(source: str, filename: str, tree: ast.Module) -> types.CodeType:
    """``tree``, the parse of ``source``, compiled under ``filename`` with its last expression's value
    kept; a cell run again under the same name (Jupyter names a cell by its text) is not compiled
    again (code objects are immutable: shared)."""
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        value = ast.copy_location(ast.Assign(targets=[ast.Name(CELL_VALUE, ast.Store())], value=last.value), last)
        tree = ast.fix_missing_locations(ast.Module(body=[*tree.body[:-1], value], type_ignores=tree.type_ignores))
    return compile(tree, filename, "exec")


@dataclass
class PulledNames:
    """What rank 0 sends back: its names, pickled together, and what stayed behind.

    Attributes:
        blob: the names that could be serialised, as one pickle of a dict, so
            objects shared between them (a model and its optimizer) stay shared.
        failed: name -> why it could not come back.
        skipped: name -> what it is, for the names left on rank 0 by rule, without a word in
            the cell (an iterator or generator: a position in a loop, no use as a copy).
    """

    blob: bytes
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def cell_job(cell: CellCode, values: dict[str, Any], modules: dict[str, str],
             pull: tuple[str, ...], pooled: bool = False, replace: tuple[str, ...] = (),
             pack_rank: int | None = None, asked: bool = False) -> CellJob:
    """The callable the launcher runs on every worker: run the cell, then pack the names.

    The cell runs in a fresh namespace holding the shipped names (modules travel as
    references and are imported again in the worker; everything else by value), with
    the process group ready, as on a pool's workers.

    Args:
        cell: the code to run.
        values: names sent by value.
        modules: name -> module name.
        pull: names to send back from the node's first worker; empty: none.
        pooled: the cell runs on a warm pool's workers: in each worker's namespace, whose
            names win over the shipped ones, and what the cell assigns stays there.
        replace: on a pool, the shipped names that replace the workers' own.
        pack_rank: the rank that sends the names back (a cell on some ranks of a pool);
            None: the node's first worker.
        asked: ``pull`` was named by the user (``--pull``): each name is tried, even an
            iterator (else iterators and generators stay behind quietly: :func:`left_behind`).
    Returns:
        A picklable :class:`CellJob` returning :class:`PulledNames` on the node's first
        worker (None elsewhere, or when ``pull`` is empty).
    """
    namespace: dict[str, Any] = {"__name__": "__main__"}
    namespace.update({name: importlib.import_module(module) for name, module in modules.items()})
    namespace.update(values)
    return CellJob(cell.compile(), namespace, tuple(pull), pooled, tuple(replace), pack_rank, asked)


@dataclass
class CellJob:
    """A cell as the workers run it (:func:`cell_job`). It travels as its fields, the class by
    reference (the workers import this module): one code object and the names, nothing by value
    that the workers already have.

    Calling it evaluates one line compiled under the cell's file name that hides itself
    (``__tracebackhide__``), and ``exec`` is built in, so a failing worker's traceback shows the
    cell's own frames and no frame of this module.
    """

    code: types.CodeType
    namespace: dict[str, Any]
    pull: tuple[str, ...]
    pooled: bool
    replace: tuple[str, ...]
    pack_rank: int | None
    asked: bool

    def __call__(self) -> PulledNames | None:
        __tracebackhide__ = True  # noqa: F841 - read by the worker's traceback formatter
        outer = {"_cell": self.code, "__tracebackhide__": True, "_pull": self.pull,
                 "_pack": functools.partial(_pack_on_first_worker, rank=self.pack_rank, asked=self.asked),
                 "_show": _show_figures, "_join": _nothing if self.pooled else join_process_group}
        line_one = _LINE_ONE.replace(co_filename=self.code.co_filename)  # as compiled under that name
        if not self.pooled:
            return eval(line_one, {**outer, "_namespace": self.namespace})  # noqa: S307 - our own line
        with worker_scope(self.namespace, self.replace) as scope:
            try:
                return eval(line_one, {**outer, "_namespace": scope})  # noqa: S307 - as above
            finally:
                scope.pop(CELL_VALUE, None)  # the magic's, not a name of the user's


_LINE_ONE = compile("(_join(), exec(_cell, _namespace), _show(), _pack(_namespace, _pull))[3]",
                    "<%%accelerate cell>", "eval")  # each cell's: this, under the cell's file name


def _nothing() -> None:
    return None


def _show_figures() -> None:
    """Show the figures the cell left open, as a notebook cell does with the inline backend
    (on the main process; the others close theirs)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None or "inline" not in str(pyplot.get_backend()):
        return
    if os.environ.get("RANK", "0") == "0":
        from IPython.display import display

        for number in pyplot.get_fignums():
            display(pyplot.figure(number))
    pyplot.close("all")


def _pack_on_first_worker(namespace: dict[str, Any], pull: tuple[str, ...],
                          rank: int | None = None, asked: bool = False) -> PulledNames | None:
    packs = (os.environ.get("LOCAL_RANK", "0") == "0" if rank is None
             else os.environ.get("RANK") == str(rank))
    if not pull or not packs:
        return None
    names = {name: namespace[name] for name in pull if name in namespace}
    skipped = {} if asked else {name: kind for name, value in names.items()
                                if name != CELL_VALUE and (kind := left_behind(value))}
    packed = pack_names({name: value for name, value in names.items() if name not in skipped})
    packed.skipped = skipped
    return packed


def left_behind(value: Any) -> str | None:
    """What ``value`` is when it stays on rank 0 unless asked for (``"a generator"``, ``"an
    iterator"``: a DataLoader's iterator, ``zip(...)``; a copy of a loop's position is no use
    to the notebook, and most cannot be pickled), else None."""
    if isinstance(value, types.GeneratorType):
        return "a generator"
    if isinstance(value, Iterator):
        return "an iterator"
    return None


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
