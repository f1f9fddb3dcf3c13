"""Pick how a running launch is shown: a live notebook display, plain text, or nothing.

A view has one method, ``update(record, final=False)``, called about ten times a
second while the job runs and once with ``final=True`` at the end; it reads the
:class:`~notebook_accel.launch.record.LaunchRecord` and decides itself when to redraw.
"""

from __future__ import annotations

import sys
from typing import Protocol

from notebook_accel.launch.record import LaunchRecord


class View(Protocol):
    """``holds_output``: True while relayed output must wait, because the view is about
    to appear and its place is above the output (under the cell's input)."""

    holds_output: bool

    def update(self, record: LaunchRecord, final: bool = False) -> None: ...


class NullView:
    """Shows nothing (``output="none"``, or no view available)."""

    holds_output = False

    def update(self, record: LaunchRecord, final: bool = False) -> None:
        return None


def in_kernel() -> bool:
    """True when running inside a Jupyter kernel (where rich displays render)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def make_view(record: LaunchRecord, show: str) -> View:
    """The live display in a kernel, plain text lines elsewhere, nothing for ``show="none"``."""
    if show == "none":
        return NullView()
    try:
        if in_kernel():
            from magics.live_view import LiveView

            return LiveView(record)
        from notebook_accel.launch.text_view import TextView

        return TextView(record)
    except ImportError:
        return NullView()
