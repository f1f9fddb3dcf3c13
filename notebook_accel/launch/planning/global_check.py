"""Find the global names a function reads that exist nowhere, before workers start.

A typo in a training function otherwise costs a whole launch (workers started,
rendezvous, imports) before each rank fails with ``NameError``.
"""

from __future__ import annotations

import builtins
import dis
import functools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def missing_globals(function: Callable[..., Any]) -> list[str]:
    """Globals ``function`` (and the functions and lambdas nested in it) loads that are
    neither in its module's namespace nor builtins, in order of first use.

    Only plain Python functions are inspected (``functools.partial`` is unwrapped);
    anything else gives an empty list.
    """
    while isinstance(function, functools.partial):
        function = function.func
    code = getattr(function, "__code__", None)
    namespace = getattr(function, "__globals__", None)
    if not isinstance(code, types.CodeType) or namespace is None:
        return []
    missing: dict[str, None] = {}
    for inner in _code_objects(code):
        for instruction in dis.get_instructions(inner):
            name = instruction.argval
            if (instruction.opname == "LOAD_GLOBAL" and name not in namespace
                    and not hasattr(builtins, name)):
                missing[name] = None
    return list(missing)


def warn_missing_globals(function: Callable[..., Any]) -> None:
    """Print one line on stderr naming the globals ``function`` reads that do not exist."""
    missing = missing_globals(function)
    if missing:
        name = getattr(function, "__qualname__", None) or repr(function)
        print(f"[notebook_accel] warning: {name} reads {', '.join(map(repr, missing))}, not "
              "defined in its module or the notebook: the workers will raise NameError "
              "unless it is defined before they get there", file=sys.stderr, flush=True)
