"""The notebook front end: ``%%accelerate`` and ``%accelerate env|test|config``.

Load it with ``%load_ext notebook_accel`` (or ``%load_ext magics``). Importing
this package is cheap: IPython is imported only when the extension is loaded,
because the workers import ``magics.cell_runner`` too.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    """Register the ``accelerate`` magics with ``ipython`` (once, however often it is loaded)."""
    from magics.accelerate_magic import AccelerateMagics

    if "AccelerateMagics" not in ipython.magics_manager.registry:
        ipython.register_magics(AccelerateMagics)
