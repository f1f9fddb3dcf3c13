"""The notebook front end: ``%%accelerate`` and ``%accelerate env|test|config``.

Load it with ``%load_ext notebook_accel`` (or ``%load_ext magics``). Importing
this package is cheap: IPython is imported only when the extension is loaded,
because the workers import ``magics.cell.runner`` too.
"""

from __future__ import annotations

from typing import Any

from notebook_accel.launch import register_kernel_view


def _live_view(record: Any) -> Any:
    """The widget live view of a launch in a kernel (``ImportError`` without ipywidgets)."""
    from magics.view.live_view import LiveView

    return LiveView(record)


register_kernel_view(_live_view)  # the engine shows it for every launch in a kernel


def load_ipython_extension(ipython: Any) -> None:
    """Register the ``accelerate`` magics with ``ipython`` (once, however often it is loaded)."""
    from magics.accelerate_magic import AccelerateMagics

    if "AccelerateMagics" not in ipython.magics_manager.registry:
        ipython.register_magics(AccelerateMagics)
