"""A pool worker's namespace: one dict per rank that every run on the pool executes in.

A function (or ``%%accelerate`` cell) from the notebook travels with copies of the
notebook's globals it reads. On a pool worker it runs in this rank's one namespace
(:func:`worker_scope`), as cells run in a notebook's one namespace, so a function a
run defined sees what later runs assign. The worker's names win, whatever their
origin: a name a run assigned, or one the notebook sent earlier, stays, each rank its
own value, and a later copy from the notebook never replaces it. The one exception
is code: a function or class the notebook sent is replaced when the notebook sends a
newer definition (``pool.run``); ``%%accelerate`` decides in the kernel and says so.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

NAMESPACE: dict[str, Any] = {"__name__": "__main__"}
_COPIES: dict[str, Any] = {}  # name -> the notebook's copy it holds (not assigned by a run since)


def names() -> tuple[str, ...]:
    """Every name living in this worker's namespace (what later runs see), sorted."""
    return tuple(sorted(name for name in NAMESPACE if not name.startswith("__")))


def copies() -> tuple[str, ...]:
    """The names whose value is still the copy the notebook sent (no run assigned them)."""
    return tuple(sorted(name for name in _COPIES if not name.startswith("__")))


def imported() -> tuple[str, ...]:
    """The names that hold no state of their own: modules, and functions and classes
    imported from a module (a replacement loses nothing by losing them)."""
    return tuple(sorted(name for name in names()
                        if isinstance(NAMESPACE[name], types.ModuleType)
                        or (_is_code(NAMESPACE[name]) and not _by_value(NAMESPACE[name]))))


def restore(values: dict[str, Any], copies: Iterable[str]) -> None:
    """Put a live replica's names in (a heal's new rank); those among ``copies``, which the
    replica still held as the notebook's copies, stay copies here too."""
    NAMESPACE.update(values)
    _COPIES.update((name, values[name]) for name in copies if name in values)


@contextlib.contextmanager
def worker_scope(shipped: dict[str, Any], replace: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
    """The globals of one run: this worker's namespace, with the ``shipped`` names put in
    where the worker has no name of its own (and for the names in ``replace``).

    The worker's names win: a name it holds, whether a run assigned it or the notebook
    sent it earlier, stays (so an in-place change made on the workers is never undone by
    the notebook's stale copy). What is put in stays for later runs.
    """
    replace = set(replace)
    entered = {name: value for name, value in shipped.items()
               if name not in NAMESPACE or name in replace}
    NAMESPACE.update(entered)
    _COPIES.update(entered)
    try:
        yield NAMESPACE
    finally:
        missing = object()
        for name, value in list(_COPIES.items()):
            if NAMESPACE.get(name, missing) is not value:  # a run assigned (or deleted) it
                del _COPIES[name]


def _is_code(value: Any) -> bool:
    return isinstance(value, (types.FunctionType, type))


def _redefined_code(shipped: dict[str, Any]) -> list[str]:
    """Functions and classes defined in the notebook that replace the notebook's earlier
    copies here (code holds no training state; the notebook's newest definition counts)."""
    return [name for name, value in shipped.items()
            if name in _COPIES and _is_code(value) and _by_value(value)]


def _by_value(code: types.FunctionType | type) -> bool:
    """The function or class came by value (defined in the notebook), not from an
    importable module."""
    module = sys.modules.get(code.__module__)
    if isinstance(code, type):
        return module is None or getattr(module, code.__qualname__, None) is not code
    return module is None or code.__globals__ is not vars(module)


def bind(function: Any) -> Any:
    """``function`` running in this worker's namespace (:func:`worker_scope`); others
    (imported functions, callables that are not functions) are returned unchanged."""
    if not isinstance(function, types.FunctionType) or not _by_value(function):
        return function

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - read by the worker's traceback formatter
        shipped = function.__globals__
        with worker_scope(shipped, replace=_redefined_code(shipped)) as scope:
            bound = types.FunctionType(function.__code__, scope, function.__name__,
                                       function.__defaults__, function.__closure__)
            bound.__kwdefaults__ = function.__kwdefaults__
            bound.__dict__.update(function.__dict__)
            bound.__qualname__ = function.__qualname__
            return bound(*args, **kwargs)

    return call
