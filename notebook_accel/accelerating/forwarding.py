"""Properties the ``Accelerator`` answers from one of its parts (``state``, ``gradient_state``,
``dataloader_config``): the peer's names for facts another object owns, said in one line each.
"""

from __future__ import annotations

import operator
from typing import Any


def forwarded(part: str, name: str, doc: str | None = None, settable: bool = False) -> property:
    """A property reading ``self.<part>.<name>`` (and, when ``settable``, writing it); ``part``
    may be a dotted path (``"strategy.context"``).

    Example:
        >>> class Accelerator:
        ...     num_processes = forwarded("state", "num_processes")
    """

    owner = operator.attrgetter(part)

    def getter(self: Any) -> Any:
        return getattr(owner(self), name)

    def setter(self: Any, value: Any) -> None:
        setattr(owner(self), name, value)

    return property(getter, setter if settable else None, doc=doc)
