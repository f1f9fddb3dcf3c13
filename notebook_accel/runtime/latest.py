"""``GradientState()`` and ``AcceleratorState()`` called without arguments: the latest Accelerator's.

The peer's states are process-wide singletons, so ``GradientState()`` anywhere (a data loader, a
callback, a test) sees what the ``Accelerator`` set: ``accelerator.gradient_accumulation_steps = 4``
reaches it. Ours belong to one ``Accelerator`` each, so several in one process never interfere;
called without arguments, the class answers with the state of the ``Accelerator`` made last in this
process (while that state lives), else builds a new one, which later calls without arguments
answer with until an ``Accelerator`` adopts its own (as the peer's first ``GradientState()``
fills its singleton). ``_reset_state()`` forgets it.

``Cls._shared_state`` (``SharedStateView``), which the peer's users and tests read, is a read-only
view of that state's attributes (``{}`` when there is none): nothing is shared through it, and
assigning to it changes no state.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


class SharedStateView:
    """Class attribute ``_shared_state``: the peer's singleton dict, read-only, as a view of the
    attributes of the instance the class last adopted (``LatestOrNew.adopt``), ``{}`` without one."""

    def __get__(self, instance: Any, owner: type) -> Mapping[str, Any]:
        ref = owner.__dict__.get("_latest")
        latest = ref() if ref is not None else None
        return MappingProxyType(vars(latest) if latest is not None else {})


class LatestOrNew(type):
    """Metaclass: ``Cls()`` is the instance last ``adopt``-ed (still alive), else a new one;
    ``Cls(...)`` with arguments always builds a new one."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return super().__call__(*args, **kwargs)
        latest = cls.latest()
        if latest is None:
            latest = super().__call__()
            cls.adopt(latest)
        return latest

    def adopt(cls, instance: Any) -> None:
        """Make ``instance`` what ``cls()`` answers with (an ``Accelerator`` adopts its states), and
        what the ``_shared_state`` views of ``cls`` and of its bases that declare one show."""
        ref = weakref.ref(instance)
        for klass in cls.__mro__:
            if klass is cls or isinstance(klass.__dict__.get("_shared_state"), SharedStateView):
                type.__setattr__(klass, "_latest", ref)

    def latest(cls) -> Any:
        """The instance adopted last, if it still lives, else ``None``."""
        ref = cls.__dict__.get("_latest")
        return ref() if ref is not None else None

    def forget(cls) -> None:
        """``cls()`` builds new instances again (until the next ``adopt``)."""
        cls._latest = None
