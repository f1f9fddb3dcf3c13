"""A pool worker's namespace: one dict per rank that every run on the pool executes in.

A function (or ``%%accelerate`` cell) from the notebook travels with copies of the
notebook's globals it reads. On a pool worker it runs in this rank's one namespace
(:func:`worker_scope`), as cells run in a notebook's one namespace, so a function a
run defined sees what later runs assign. The names a run assigns are the worker's
own: they stay, each rank its own value, and a notebook copy never replaces one.
Names the notebook sent are only copies: the next run's copies replace them.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Iterator
from typing import Any

NAMESPACE: dict[str, Any] = {"__name__": "__main__"}
_COPIES: set[str] = set()  # names in NAMESPACE that are the notebook's copies, not assigned here


def names() -> tuple[str, ...]:
    """The names the pool's runs assigned on this worker (not the notebook's copies), sorted."""
    return tuple(sorted(name for name in NAMESPACE
                        if name not in _COPIES and not name.startswith("__")))


@contextlib.contextmanager
def worker_scope(shipped: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The globals of one run: this worker's namespace, with the ``shipped`` names put in
    where the worker has no name of its own. What the run assigns becomes the worker's
    own, even when the run raises."""
    missing = object()
    copies = {name: value for name, value in shipped.items()
              if name not in NAMESPACE or name in _COPIES}
    NAMESPACE.update(copies)
    _COPIES.update(copies)
    try:
        yield NAMESPACE
    finally:
        for name, value in copies.items():
            if NAMESPACE.get(name, missing) is not value:  # the run assigned (or deleted) it
                _COPIES.discard(name)


def _by_value(function: types.FunctionType) -> bool:
    """The function came by value (defined in the notebook), not from an importable module."""
    module = sys.modules.get(function.__module__)
    return module is None or function.__globals__ is not vars(module)


def bind(function: Any) -> Any:
    """``function`` running in this worker's namespace (:func:`worker_scope`); others
    (imported functions, callables that are not functions) are returned unchanged."""
    if not isinstance(function, types.FunctionType) or not _by_value(function):
        return function

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - read by the worker's traceback formatter
        with worker_scope(function.__globals__) as scope:
            bound = types.FunctionType(function.__code__, scope, function.__name__,
                                       function.__defaults__, function.__closure__)
            bound.__kwdefaults__ = function.__kwdefaults__
            bound.__dict__.update(function.__dict__)
            bound.__qualname__ = function.__qualname__
            return bound(*args, **kwargs)

    return call
