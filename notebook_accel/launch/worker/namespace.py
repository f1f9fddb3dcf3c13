"""A pool worker's namespace: the names its runs assigned, kept on this rank for later runs.

A function defined in the notebook travels by value, with copies of the notebook's
globals it uses. On a pool worker it runs with those copies overlaid by this rank's
namespace (:func:`bind`): a name that lives here is used here, never replaced by the
notebook's copy; names the worker lacks come from the notebook. The names the run
assigns (``global model; model = ...``) stay here afterwards, each rank its own value.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

NAMESPACE: dict[str, Any] = {}


def names() -> tuple[str, ...]:
    """The names living on this worker (not dunders), sorted."""
    return tuple(sorted(name for name in NAMESPACE if not name.startswith("__")))


def _by_value(function: types.FunctionType) -> bool:
    """The function came by value (defined in the notebook), not from an importable module."""
    module = sys.modules.get(function.__module__)
    return module is None or function.__globals__ is not vars(module)


def bind(function: Any) -> Any:
    """``function`` running in this worker's namespace; others (imported functions,
    callables that are not functions) are returned unchanged."""
    if not isinstance(function, types.FunctionType) or not _by_value(function):
        return function
    scope = dict(function.__globals__)
    scope.update(NAMESPACE)  # the worker's own names win over the notebook's copies
    bound = types.FunctionType(function.__code__, scope, function.__name__,
                               function.__defaults__, function.__closure__)
    bound.__kwdefaults__ = function.__kwdefaults__
    bound.__dict__.update(function.__dict__)
    bound.__qualname__ = function.__qualname__
    before = dict(scope)

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - read by the worker's traceback formatter
        try:
            return bound(*args, **kwargs)
        finally:
            keep_assigned(scope, before)

    return call


def keep_assigned(scope: dict[str, Any], before: dict[str, Any]) -> None:
    """Keep in the namespace what a run assigned in ``scope`` (or deleted from it)."""
    missing = object()
    for name, value in scope.items():
        if before.get(name, missing) is not value:
            NAMESPACE[name] = value
    for name in before.keys() - scope.keys():
        NAMESPACE.pop(name, None)
