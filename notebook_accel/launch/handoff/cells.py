"""Which notebook cell compiled a file name, on IPython 8+ and on IPython 7 (Colab's 7.34).

IPython 8 keeps the map (``shell.compile._filename_map``: file name -> execution count).
IPython 7 keeps none: a cell's file name is ``<ipython-input-N-hash>`` or, under ipykernel 6,
a temporary file name (``/tmp/ipykernel_1/2.py``) that says nothing of ``N``; its compiled
cells are in ``linecache._ipython_cache`` (with a modification time, unlike IPython 8's). There
the map is rebuilt from the history: a cell's cached text is its input, raw or transformed.
This module is the one place that knows the difference. It also keeps what a warm pool's
workers already have of the cells (``SentCells``), so a payload carries only the new ones, and
a worker's registry of the cells' numbers (``NUMBERS``: its debugger names them).
"""

from __future__ import annotations

import contextlib
import itertools
import linecache
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_INPUT_NAME = re.compile(r"<ipython-input-(\d+)-[0-9a-f]+>")


def compiled_cells() -> Mapping[str, tuple]:
    """IPython 7's linecache entries of compiled cells (empty on IPython 8, whose entries
    carry no modification time and so read as in-memory sources anyway)."""
    return getattr(linecache, "_ipython_cache", {})


def cell_numbers(shell: Any) -> Mapping[str, int]:
    """File name -> execution count of the notebook cells ``shell`` compiled (``{}`` without
    a shell). Cells run without history are numbered only on IPython 8."""
    compiler = getattr(shell, "compile", None)
    names = getattr(compiler, "_filename_map", None)
    if names is not None:
        return names
    history = getattr(shell, "history_manager", None)
    by_text = {}
    for inputs in (getattr(history, "input_hist_raw", None) or [],
                   getattr(history, "input_hist_parsed", None) or []):
        for number, text in enumerate(inputs):  # index N is In[N]; a later run of the text wins
            if text:
                by_text[text] = number
    numbers = {}
    for filename, entry in list(compiled_cells().items()):
        match = _INPUT_NAME.fullmatch(filename)
        number = int(match[1]) if match else by_text.get("".join(entry[2]).rstrip("\n"))
        if number is not None:
            numbers[filename] = number
    return numbers


def notebook_shell() -> Any:
    """The kernel's IPython shell, or None (IPython not imported, or no shell running)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


@dataclass
class SentCells:
    """What some workers already have of the notebook's cells (warm workers keep them from run to
    run): the cells' sources, by file name, and their numbers; a payload carries only the rest."""

    sources: set[str] = field(default_factory=set)
    numbers: dict[str, int] = field(default_factory=dict)
    _map: Mapping[str, int] | None = field(default=None, repr=False)  # IPython 8's map as last
    _map_length: int = field(default=0, repr=False)  # sent, and its length then
    _last_file: str | None = field(default=None, repr=False)  # linecache's last name as last sent
    _left: tuple[str, ...] = field(default=(), repr=False)  # names read then, to read again

    def unread_files(self) -> tuple[list[str], str | None]:
        """linecache's file names that may hold a source these workers lack, in linecache's
        order, and the mark :meth:`sent` takes. linecache only appends (a name read again, after
        its entry was dropped, comes last too), so only the names after the last one as last
        sent are new, with those left then (an entry not read yet, a source over the budget);
        all of them when that name is gone."""
        cache, new = linecache.cache, None
        if self._last_file is not None and self._last_file in cache:
            with contextlib.suppress(RuntimeError):  # another thread changed linecache: read it whole
                new = list(itertools.takewhile(self._last_file.__ne__, reversed(cache)))
        if new is None:
            names = list(cache)
            last = names[-1] if names else None
        else:
            names = [*self._left, *reversed(new)]
            last = new[0] if new else self._last_file
        return [name for name in dict.fromkeys(names) if name not in self.sources], last

    def new_numbers(self) -> tuple[dict[str, int], tuple[Mapping[str, int], int]]:
        """The notebook's cell numbers these workers do not have yet (or have another of), and
        the mark that :meth:`sent` takes once they are on their way. IPython 8's map only grows
        (a cell's file name is new at each run), so only its new end is read, from the end."""
        numbers = cell_numbers(notebook_shell())
        if numbers is self._map and len(numbers) >= self._map_length:
            new = dict(reversed(list(itertools.islice(reversed(numbers.items()),
                                                      len(numbers) - self._map_length))))
        else:  # IPython 7's, rebuilt at each call: compared whole
            new = dict(numbers.items() - self.numbers.items())
        return new, (numbers, len(numbers))

    def sent(self, sources: Mapping[str, Any], numbers: dict[str, int],
             mark: tuple[Mapping[str, int], int], files: tuple[str | None, tuple[str, ...]]
             ) -> None:
        """These sources and numbers are on their way to the workers; ``files``: the mark of
        :meth:`unread_files` and the names it gave that are left to read again."""
        self.sources.update(sources)
        self.numbers.update(numbers)
        self._map, self._map_length = mark
        self._last_file, self._left = files


# a worker's side: the notebook cells the kernel named (file name -> In [N]), for its debugger
NUMBERS: dict[str, int] = {}
