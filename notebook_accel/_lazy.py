"""Lazy public names for a package: ``name -> module`` tables resolved on first access, so that
importing the package stays cheap (no torch in the kernel until something needs it)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any],
                 guard: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` for its public names ``exports``.

    Args:
        package: the package's name, for the ``AttributeError`` of an unknown name.
        exports: public name -> the module that defines it.
        namespace: the package's ``globals()``: a resolved name is cached there.
        guard: entered around each first import (the top package defers a kernel interrupt
            so that a half-done import of torch cannot break the kernel).
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        with guard():
            value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
