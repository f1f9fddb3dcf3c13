"""Kernel side of workers' rich output: show it in the launching cell, as if the cell made it."""

from __future__ import annotations

import sys

from notebook_accel.wire import Display


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
