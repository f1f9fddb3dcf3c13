"""How to configure without the panel: ``notebook-accel config`` from a terminal.

Said where widgets do not render (VS Code with some ipywidgets versions, an untrusted notebook,
nbconvert: the panel's ``text/plain``), and where the panel is not installed (``%accelerate
config``). No ipywidgets here, so both can import it.
"""

from __future__ import annotations

SHORT = "widgets not shown? from a terminal: `notebook-accel config --help`"

TERMINAL = """\
Widgets not shown here (VS Code, an untrusted notebook, nbconvert)? Configure from a terminal,
or from a cell starting with `!`:
  notebook-accel config                                           show the config in force
  notebook-accel config --num-processes 2 --mixed-precision auto  write these settings to the file
  notebook-accel config --default                                 write what this machine has
  notebook-accel config --help                                    every setting"""
