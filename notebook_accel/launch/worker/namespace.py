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

import bisect
import contextlib
import functools
import itertools
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

NAMESPACE: dict[str, Any] = {"__name__": "__main__"}
_COPIES: dict[str, Any] = {}  # name -> the notebook's copy it holds (not assigned by a run since)


def names() -> tuple[str, ...]:
    """Every name living in this worker's namespace (what later runs see), sorted."""
    return _sorted_without_dunders(NAMESPACE)


def copies() -> tuple[str, ...]:
    """The names whose value is still the copy the notebook sent (no run assigned them)."""
    return _sorted_without_dunders(_COPIES)


def _sorted_without_dunders(keys: Iterable[str]) -> tuple[str, ...]:
    """``keys`` sorted, less those that start with ``__``: in sorted order they lie together,
    from ``"__"`` to ``"_`"`` (the character after ``_``), so they are cut out by two searches
    (a namespace of hundreds of names is read at every run's end)."""
    ordered = sorted(keys)
    start, end = bisect.bisect_left(ordered, "__"), bisect.bisect_left(ordered, "_`")
    return tuple(ordered[:start] + ordered[end:])


def imported(living: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The names that hold no state of their own: modules, and functions and classes
    imported from a module (a replacement loses nothing by losing them); ``living``:
    :func:`names`, when the caller has them."""
    living = names() if living is None else living
    code_or_modules = itertools.compress(living, map(  # (C loops: most values are neither)
        isinstance, map(NAMESPACE.__getitem__, living), itertools.repeat(_CODE_OR_MODULE)))
    return tuple(name for name in code_or_modules  # (in the order of ``names``: sorted)
                 if isinstance(NAMESPACE[name], types.ModuleType) or not _by_value(NAMESPACE[name]))


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


_CODE = (types.FunctionType, type)
_CODE_OR_MODULE = (*_CODE, types.ModuleType)


def _is_code(value: Any) -> bool:
    return isinstance(value, _CODE)


def _redefined_code(shipped: dict[str, Any]) -> list[str]:
    """Functions and classes defined in the notebook that replace the notebook's earlier
    copies here (code holds no training state; the notebook's newest definition counts)."""
    return [name for name, value in shipped.items()
            if name in _COPIES and _is_code(value) and _by_value(value)]


def _by_value(code: types.FunctionType | type) -> bool:
    """The function or class came by value (defined in the notebook), not from an
    importable module."""
    if getattr(code, "__globals__", None) is NAMESPACE:  # defined by a run here (no module's dict)
        return True
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
