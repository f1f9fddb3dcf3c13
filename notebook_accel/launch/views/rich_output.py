"""Kernel side of workers' rich output: show it in the launching cell, as if the cell made it
(:func:`in_kernel`: whether there is a kernel's cell to show it in)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `import notebook_accel` imports this module (views.in_kernel): kept light
    from notebook_accel.wire import Display


def in_kernel() -> bool:
    """True when running inside a Jupyter kernel (where rich displays render)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show_display(message: Display) -> None:
    """Publish one display message sent by the main worker (data, metadata, transient, update).

    In a kernel it goes out through the shell's own display publisher (so display
    ids update in place); elsewhere its ``text/plain`` is printed.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        text = message.data.get("text/plain")
        if text:
            print(text, flush=True)
        return
    shell.display_pub.publish(data=message.data, metadata=message.metadata,
                              transient=message.transient, update=message.update)
