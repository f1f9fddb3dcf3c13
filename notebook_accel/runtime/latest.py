"""``GradientState()`` and ``AcceleratorState()`` called without arguments: the latest Accelerator's.

The peer's states are process-wide singletons, so ``GradientState()`` anywhere (a data loader, a
callback, a test) sees what the ``Accelerator`` set: ``accelerator.gradient_accumulation_steps = 4``
reaches it. Ours belong to one ``Accelerator`` each, so several in one process never interfere;
called without arguments, the class answers with the state of the ``Accelerator`` made last in this
process (while that state lives), else builds a new, independent one. ``_reset_state()`` forgets it.
"""

from __future__ import annotations

import weakref
from typing import Any


class LatestOrNew(type):
    """Metaclass: ``Cls()`` is the instance last ``adopt``-ed (still alive), else a new one;
    ``Cls(...)`` with arguments always builds a new one."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            latest = cls.latest()
            if latest is not None:
                return latest
        return super().__call__(*args, **kwargs)

    def adopt(cls, instance: Any) -> None:
        """Make ``instance`` what ``cls()`` answers with (an ``Accelerator`` adopts its states)."""
        cls._latest = weakref.ref(instance)

    def latest(cls) -> Any:
        """The instance adopted last, if it still lives, else ``None``."""
        ref = cls.__dict__.get("_latest")
        return ref() if ref is not None else None

    def forget(cls) -> None:
        """``cls()`` builds new instances again (until the next ``adopt``)."""
        cls._latest = None
