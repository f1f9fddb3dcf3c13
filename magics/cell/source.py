"""Turn a ``%%accelerate`` cell into code whose tracebacks point into the notebook cell.

The body is compiled under the name IPython gives the cell (registered in
``linecache`` with mtime None), and shifted down so its line numbers count from
the top of the cell as the user sees it: the ``%%accelerate`` line is line 1.
"""

from __future__ import annotations

import ast
import sys
import traceback
from typing import Any

from magics.cell.names import CellNames, parsed_cell
from magics.cell.runner import CellCode
from notebook_accel.launch import cell_numbers


class CellSyntaxError(ValueError):
    """The cell does not compile (found in the kernel, before any worker starts).

    Attributes:
        error: the ``SyntaxError``, with the cell's file name and line.
    """

    def __init__(self, error: SyntaxError, label: str) -> None:
        self.hint = ""
        if (error.text or "").lstrip().startswith(("%", "!")):
            self.hint = ("IPython syntax (%magics, !commands) does not run on the workers; "
                         "use plain Python in a %%accelerate cell")
        super().__init__(f"{label}, line {error.lineno}: {error.msg}"
                         + (f" ({self.hint})" if self.hint else ""))
        self.error = error
        self.label = label

    def _render_traceback_(self) -> list[str]:
        """IPython hook: the syntax error as IPython shows one in a plain cell."""
        lines = traceback.format_exception_only(type(self.error), self.error)
        text = "".join(lines).replace(f'File "{self.error.filename}", ', f"{self.label}, ", 1)
        return text.rstrip("\n").splitlines() + ([self.hint] if self.hint else [])


def _cell_text(raw_cell: str | None, line: str, body: str) -> tuple[list[str], int, bool]:
    """The notebook cell's lines, how many come before the body, and whether they are
    the cell as typed (else rebuilt, e.g. for ``run_cell_magic`` called from code)."""
    body_lines = body.splitlines()
    if raw_cell:
        lines = raw_cell.splitlines()
        for index, text in enumerate(lines):
            if text.lstrip().startswith("%%") and lines[index + 1:] == body_lines:
                return [text + "\n" for text in lines], index + 1, True
    rebuilt = [f"%%accelerate {line}".rstrip() + "\n", *(text + "\n" for text in body_lines)]
    return rebuilt, 1, False


def cell_number(shell: Any) -> int:
    """The execution count of the cell running now, as its ``Cell In[N]`` label says.

    ``shell.execution_count`` is already the next cell's number while a cell runs
    (IPython counts up before running it), so find the running cell's frame instead.
    """
    names = cell_numbers(shell)
    frame = sys._getframe(1)
    while frame is not None:
        number = names.get(frame.f_code.co_filename)
        if number is not None:
            return number
        frame = frame.f_back
    return shell.execution_count


def make_cell_code(shell: Any, line: str, body: str,
                   raw_cell: str | None) -> tuple[CellCode, ast.Module, CellNames]:
    """Compile-check the body in the kernel and describe it for the workers.

    Args:
        shell: the IPython shell (its compiler names and caches the cell).
        line: the magic's arguments; body: the cell body.
        raw_cell: the whole cell as typed, when known.
    Returns:
        The :class:`CellCode`, the parsed body (shared: read it only) and its names.
    Raises:
        CellSyntaxError: the body does not compile; it names the cell's line.
    """
    lines, offset, as_typed = _cell_text(raw_cell, line, body)
    text = "".join(lines)
    number = cell_number(shell)
    compiler = getattr(shell, "compile", None)
    if compiler is not None and hasattr(compiler, "cache"):
        # As typed: the name IPython gives this cell (its traceback label "Cell In[n]").
        filename = compiler.cache(text, number, raw_code=raw_cell if as_typed else text)
    else:
        filename = f"<%%accelerate cell {number}>"
    code = CellCode("\n" * offset + body, filename, lines)
    code.register()
    try:
        tree, names = parsed_cell(code.source)
        code.compile_tree(tree)  # what parsing misses: `return` outside a function...
    except SyntaxError as error:
        error.filename = filename  # (a parse names no file: the text is what is kept)
        raise CellSyntaxError(error, f"Cell In[{number}]") from None
    return code, tree, names
