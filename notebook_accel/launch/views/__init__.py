"""Pick how a running launch is shown: a live notebook display, plain text, or nothing.

A view has one method, ``update(record, final=False)``, called about ten times a
second while the job runs and once with ``final=True`` at the end; it reads the
:class:`~notebook_accel.launch.views.record.LaunchRecord` and decides itself when to redraw.

The engine builds no notebook display itself: the front end offers one with
:func:`register_kernel_view` (``magics`` does so when it is imported). In a kernel
where it is not imported yet, a launch opens the engine's one door into the front
end (``notebook_accel._front_end``, which ``%load_ext`` uses too, and which the package
registers here with :func:`register_front_end`: the engine never imports its own package), so
the live view appears without ``%load_ext``; without a registered view, text lines are shown.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from notebook_accel.launch.views.rich_output import in_kernel

if TYPE_CHECKING:  # magics imports this module to register its view: keep it light
    from notebook_accel.launch.views.record import LaunchRecord


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


ViewFactory = Callable[["LaunchRecord"], View]

_kernel_view: ViewFactory | None = None
_open_front_end: Callable[[], object] | None = None


def register_kernel_view(factory: ViewFactory | None) -> None:
    """Offer the view a launch shows inside a Jupyter kernel (``None`` withdraws it).

    Args:
        factory: called with the launch's record; returns the view. It may raise
            ``ImportError`` (e.g. no ipywidgets): the launch then shows nothing, as
            when there is no display to draw on.
    """
    global _kernel_view
    _kernel_view = factory


def register_front_end(opener: Callable[[], object]) -> None:
    """Set how the engine opens the front end (``notebook_accel._front_end``, registered by the
    package when it is imported): importing it registers its kernel view."""
    global _open_front_end
    _open_front_end = opener


def kernel_view() -> ViewFactory | None:
    """The registered kernel view; the first time, the front end is opened to register its own."""
    if _kernel_view is None and _open_front_end is not None:
        _open_front_end()  # importing magics registers its live view
    return _kernel_view


class GuardedView:
    """A view that can never break the job: its first error stops it, said in one line."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.broken = False

    @property
    def holds_output(self) -> bool:
        return not self.broken and self.view.holds_output

    def update(self, record: LaunchRecord, final: bool = False) -> None:
        if self.broken:
            return
        try:
            self.view.update(record, final)
        except Exception as exc:  # noqa: BLE001 - a view must never break the job
            self.broken = True
            print(f"[notebook_accel] live view stopped ({type(exc).__name__}: {exc})",
                  file=sys.stderr, flush=True)


def make_view(record: LaunchRecord, show: str) -> View:
    """The live display in a kernel, plain text lines elsewhere, nothing for ``show="none"``;
    guarded, so that a failing view stops itself and never the job."""
    if show == "none":
        return NullView()
    try:
        factory = kernel_view() if in_kernel() else None
        if factory is not None:
            return GuardedView(factory(record))
        from notebook_accel.launch.views.text import TextView

        return GuardedView(TextView(record))
    except ImportError:
        return NullView()
