"""What the notebook's names are to the workers: copies sent out, snapshots brought back.

``%%accelerate`` sends the notebook's names a cell reads and brings back from rank 0 the
names it assigns. The ledger remembers, per name, which cell did either and which object
it was, so that the magic can tell the notebook's value from a snapshot of rank 0's
(``%accelerate status``, the refusal of rank 0's ``Accelerator``), and can tell when the
notebook's value changed since it was sent (the workers keep theirs: said, not done
silently). Objects are held weakly where Python allows; others by id only.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Entry:
    """One name's last crossing.

    Attributes:
        cell: the execution count of the cell that sent or brought it (``In [cell]``).
        on_pool: it went to, or came from, the warm pool's workers (not fresh ones).
    """

    cell: int
    on_pool: bool
    _id: int = 0
    _ref: Any = None

    @classmethod
    def of(cls, value: Any, cell: int, on_pool: bool) -> Entry:
        try:
            ref = weakref.ref(value)
        except TypeError:  # ints, dicts, lists...: compared by id
            ref = None
        return cls(cell, on_pool, id(value), ref)

    def holds(self, value: Any) -> bool:
        """``value`` is still the object this entry recorded."""
        if self._ref is not None:
            return self._ref() is value
        return id(value) == self._id


@dataclass
class NameLedger:
    """The kernel's record of names sent to and brought back from the workers."""

    sent: dict[str, Entry] = field(default_factory=dict)
    pulled: dict[str, Entry] = field(default_factory=dict)
    skipped: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (cell, what it is)

    def record_sent(self, values: dict[str, Any], cell: int, on_pool: bool) -> None:
        for name, value in values.items():
            self.sent[name] = Entry.of(value, cell, on_pool)

    def record_pulled(self, values: dict[str, Any], cell: int, on_pool: bool) -> None:
        for name, value in values.items():
            self.pulled[name] = Entry.of(value, cell, on_pool)
            self.sent.pop(name, None)  # the notebook's value is now rank 0's
            self.skipped.pop(name, None)

    def record_skipped(self, skipped: dict[str, str], cell: int) -> None:
        """Names a cell left on rank 0 by rule, quietly (name -> what it is), for
        ``%accelerate status`` to say once."""
        for name, what in skipped.items():
            self.skipped[name] = (cell, what)

    def snapshot(self, name: str, value: Any) -> Entry | None:
        """The entry saying ``value`` is the snapshot a cell brought back from rank 0."""
        entry = self.pulled.get(name)
        return entry if entry is not None and entry.holds(value) else None

    def matches_workers(self, name: str, value: Any) -> bool:
        """``value`` is what the pool's workers hold under ``name`` too (as far as the
        notebook can know): it was sent from there or brought back from there."""
        entry = self.sent.get(name) or self.pulled.get(name)
        return entry is not None and entry.on_pool and entry.holds(value)

    def snapshots(self, namespace: dict[str, Any]) -> dict[str, Entry]:
        """The notebook's names that still hold what a cell brought back, by name."""
        return {name: entry for name, entry in self.pulled.items()
                if name in namespace and entry.holds(namespace[name])}


LEDGER = NameLedger()
"""The kernel's one ledger (one notebook per kernel)."""
