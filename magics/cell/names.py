"""Which names a cell reads from the notebook, and which it assigns.

A name is *read* when the cell may load it before binding it itself: such names
are looked up in the notebook namespace and shipped to the workers. A name is
*assigned* when the cell binds it at top level: those come back afterwards.

The top level is walked in execution order (``ast``), erring on the side of
reading: a name bound only on some paths (an ``if`` branch, a loop body, a
``try`` block) does not count as bound after that statement. Class bodies and
comprehensions run at once and read in place. Code that runs later (function and
lambda bodies, methods) reads the globals it uses (found with ``symtable``, the
compiler's own scoping) unless the cell binds them at top level somewhere.
"""

from __future__ import annotations

import ast
import functools
import symtable
from dataclasses import dataclass


@dataclass(frozen=True)
class CellNames:
    """The result of :func:`analyse_cell`.

    Attributes:
        reads: names the cell may read before binding them, in order of first use.
        assigns: names the cell binds at top level, in order of first binding.
        star_import: the cell has a ``from module import *``, which binds names no reading
            of the text can know.
    """

    reads: tuple[str, ...]
    assigns: tuple[str, ...]
    star_import: bool = False


def imported_names(tree: ast.Module) -> set[str]:
    """The names the cell's imports bind (modules, and what comes from them: code, no state)."""
    return {alias.asname or (alias.name.split(".")[0] if isinstance(node, ast.Import) else alias.name)
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names if alias.name != "*"}


def analyse_cell(source: str | ast.Module) -> CellNames:
    """Find the names a cell reads from its namespace and the names it assigns.

    Args:
        source: the cell's code, or its parsed module.
    Returns:
        A :class:`CellNames`.
    Raises:
        SyntaxError: the code does not parse.

    Example:
        >>> analyse_cell("y = f(x)\\nx = 1")
        CellNames(reads=('f', 'x'), assigns=('y', 'x'), star_import=False)
    """
    tree = ast.parse(source) if isinstance(source, str) else source
    scope = _TopLevel()
    scope.block(tree.body)
    later_reads, global_writes = _inner_scope_globals(
        source if isinstance(source, str) else ast.unparse(tree)) if _has_inner_scopes(tree) else ([], [])
    augmented, star_import = set(), False
    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            augmented.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and node.names[0].name == "*":
            star_import = True
    later_reads += [name for name in global_writes if name in augmented]  # global x; x += 1
    assigned_anywhere = set(scope.assigns)
    deferred = [name for name in later_reads if name not in assigned_anywhere]
    reads = list(dict.fromkeys([*scope.reads, *deferred]))
    assigns = list(dict.fromkeys([*scope.assigns, *global_writes]))
    return CellNames(tuple(reads), tuple(assigns), star_import)


@functools.lru_cache(maxsize=64)
def parsed_cell(source: str) -> tuple[ast.Module, CellNames]:
    """A cell's parsed module and its names, kept for the last 64 texts (a cell run again is
    not parsed and walked again). The module is shared: read it, never change it.

    Raises:
        SyntaxError: the code does not parse (nothing is kept).
    """
    tree = ast.parse(source)
    return tree, analyse_cell(tree)


_INNER_SCOPES = tuple(getattr(ast, name) for name in (
    "FunctionDef", "AsyncFunctionDef", "Lambda", "ClassDef", "ListComp", "SetComp", "DictComp",
    "GeneratorExp", "TypeAlias") if hasattr(ast, name))  # what opens a scope of its own


def _has_inner_scopes(tree: ast.Module) -> bool:
    """Whether the cell has a scope below its top level (else its symbol table has no child)."""
    return any(isinstance(node, _INNER_SCOPES) for node in ast.walk(tree))


def _inner_scope_globals(source: str) -> tuple[list[str], list[str]]:
    """Global names used by the cell's inner scopes (functions, lambdas, classes,
    comprehensions), from the compiler's own symbol tables: (read, declared global
    and assigned)."""
    reads, writes = [], []
    tables = list(symtable.symtable(source, "<cell>", "exec").get_children())
    while tables:
        table = tables.pop(0)
        for symbol in table.get_symbols():
            if symbol.is_global() and symbol.is_referenced():
                reads.append(symbol.get_name())
            if symbol.is_declared_global() and symbol.is_assigned():
                writes.append(symbol.get_name())
        tables.extend(table.get_children())
    return reads, writes


def _targets(node: ast.AST) -> list[str]:
    """Names bound by an assignment target (``a``, ``a, *b``, ``[a, (b, c)]``)."""
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]


def _pattern_names(pattern: ast.pattern) -> list[str]:
    names = []
    for node in ast.walk(pattern):
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.append(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.append(node.rest)
    return names


class _TopLevel:
    """Walks the cell's statements in execution order, tracking what is surely bound."""

    def __init__(self) -> None:
        self.bound: set[str] = set()  # surely bound at the current point
        self.reads: list[str] = []
        self.assigns: list[str] = []

    # --- names -----------------------------------------------------------------
    def load(self, name: str) -> None:
        if name not in self.bound:
            self.reads.append(name)

    def bind(self, name: str) -> None:
        self.bound.add(name)
        if name not in self.assigns:
            self.assigns.append(name)

    # --- statements --------------------------------------------------------------
    def block(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            self.statement(statement)

    def branch(self, statements: list[ast.stmt]) -> set[str]:
        """Run a block that may or may not execute; return what it surely binds."""
        before = set(self.bound)
        self.block(statements)
        after, self.bound = self.bound, before
        return after

    def statement(self, node: ast.stmt) -> None:
        handler = getattr(self, "stmt_" + type(node).__name__, None)
        if handler is not None:
            handler(node)
        else:
            self.expression(node)

    def stmt_Assign(self, node: ast.Assign) -> None:
        self.expression(node.value)
        for target in node.targets:
            self.store(target)

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        self.expression(node.value)
        if isinstance(node.target, ast.Name):
            self.load(node.target.id)
        self.store(node.target)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.expression(node.value)
        self.expression(node.annotation)
        if node.value is not None:
            self.store(node.target)
        elif not isinstance(node.target, ast.Name):
            self.expression(node.target)

    def store(self, target: ast.expr) -> None:
        """Bind an assignment target; subscripts and attributes read their base."""
        if isinstance(target, ast.Name):
            self.bind(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.store(element)
        elif isinstance(target, ast.Starred):
            self.store(target.value)
        else:  # x[i] = ..., x.a = ...: x is read
            self.expression(target)

    def stmt_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.load(target.id)
                self.bound.discard(target.id)
            else:
                self.expression(target)

    def stmt_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.bind(alias.asname or alias.name.split(".")[0])

    def stmt_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self.bind(alias.asname or alias.name)

    def stmt_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.definition_time(node)  # the body runs later: see _inner_scope_globals
        self.bind(node.name)

    stmt_AsyncFunctionDef = stmt_FunctionDef

    def stmt_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.expression(expr)
        _ClassBody(self).block(node.body)
        self.bind(node.name)

    def stmt_If(self, node: ast.If) -> None:
        self.expression(node.test)
        self.bound = self.branch(node.body) & self.branch(node.orelse)

    def stmt_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.expression(node.iter)
        body = [ast.Assign(targets=[node.target], value=ast.Constant(None)), *node.body]
        self.branch(body)  # may run zero times
        self.branch(node.orelse)  # skipped by a break

    stmt_AsyncFor = stmt_For

    def stmt_While(self, node: ast.While) -> None:
        self.expression(node.test)
        self.branch(node.body)
        self.branch(node.orelse)

    def stmt_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.expression(item.context_expr)
            if item.optional_vars is not None:
                self.store(item.optional_vars)
        self.block(node.body)

    stmt_AsyncWith = stmt_With

    def stmt_Try(self, node: ast.Try) -> None:
        before = set(self.bound)
        self.block(node.body)
        self.block(node.orelse)
        outcomes = [self.bound]  # without handlers: success, or the exception propagates
        for handler in node.handlers:  # a handler may run after any part of the body
            self.bound = set(before)
            if handler.type is not None:
                self.expression(handler.type)
            if handler.name:
                self.bind(handler.name)
            self.block(handler.body)
            self.bound.discard(handler.name or "")
            outcomes.append(self.bound)
        self.bound = set.intersection(*outcomes)
        self.block(node.finalbody)

    stmt_TryStar = stmt_Try

    def stmt_Match(self, node: ast.Match) -> None:
        self.expression(node.subject)
        before = set(self.bound)
        for case in node.cases:
            self.bound = set(before)
            self.expression(case.pattern)  # value patterns read names
            for name in _pattern_names(case.pattern):
                self.bind(name)
            if case.guard is not None:
                self.expression(case.guard)
            self.block(case.body)
        self.bound = before

    def stmt_Global(self, node: ast.Global) -> None:
        pass

    stmt_Nonlocal = stmt_Global

    # --- expressions ---------------------------------------------------------------
    def expression(self, node: ast.AST) -> None:
        """Visit an expression (or a statement without bindings) in evaluation order."""
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self.load(node.id)
            elif isinstance(node.ctx, ast.Store):
                self.bind(node.id)
            return
        if isinstance(node, ast.NamedExpr):
            self.expression(node.value)
            self.bind(node.target.id)
            return
        if isinstance(node, ast.Lambda):
            self.definition_time(node)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            self.comprehension(node)
            return
        for child in ast.iter_child_nodes(node):
            self.expression(child)

    def definition_time(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        """What a ``def`` or ``lambda`` evaluates where it stands: decorators, defaults,
        annotations."""
        args = node.args
        parts = [*getattr(node, "decorator_list", []), *args.defaults,
                 *(d for d in args.kw_defaults if d is not None)]
        every_arg = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        parts += [a.annotation for a in every_arg if a is not None and a.annotation is not None]
        if getattr(node, "returns", None) is not None:
            parts.append(node.returns)
        for part in parts:
            self.expression(part)

    def comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        """The first iterable is evaluated here; the loop variables are the comprehension's own."""
        generators = node.generators
        self.expression(generators[0].iter)
        local: set[str] = set()
        walrus: list[str] = []
        for index, generator in enumerate(generators):
            if index:
                self.comprehension_part(generator.iter, local, walrus)
            local.update(_targets(generator.target))
            for condition in generator.ifs:
                self.comprehension_part(condition, local, walrus)
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for element in elements:
            self.comprehension_part(element, local, walrus)
        for name in walrus:
            if name not in self.assigns:  # binds in the cell's scope, on some paths
                self.assigns.append(name)

    def comprehension_part(self, node: ast.expr, local: set[str], walrus: list[str]) -> None:
        saved = self.bound
        self.bound = self.bound | local
        assigns_before = len(self.assigns)
        self.expression(node)
        # names bound inside (walrus) are not surely bound afterwards
        walrus.extend(self.assigns[assigns_before:])
        del self.assigns[assigns_before:]
        self.bound = saved


class _ClassBody(_TopLevel):
    """A class body runs at once; names it does not bind itself are read from the cell."""

    def __init__(self, outer: _TopLevel) -> None:
        super().__init__()
        self.outer = outer

    def load(self, name: str) -> None:
        if name not in self.bound:
            self.outer.load(name)

    def bind(self, name: str) -> None:
        self.bound.add(name)
