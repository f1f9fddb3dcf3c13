"""``breakpoint()`` on rank 1 of a pool, answered in JupyterLab's own input box (issue 34).

JupyterLab + headless Chromium (see ``tests/browser_support.py``). A pool cell stops rank 1
at ``breakpoint()`` in a loop; its prompt, ``(Pdb rank 1)``, appears in the cell's input box
(Jupyter's stdin channel); typing ``p value`` shows rank 1's value, ``c`` lets the cell end
with its normal result. Screenshots: ``pdb_prompt.png``, ``pdb_prompt_done.png``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from tests.browser_support import (
    BROWSER_MARKS,
    artifacts_dir,
    cell_output,
    cell_prompt,
    chromium,
    code_cell,
    jupyter_lab,
    lab_env,
    notebook_json,
    open_notebook,
)

pytestmark = BROWSER_MARKS

SOURCES = {
    "start": "%load_ext notebook_accel\n%accelerate start -n 2",
    "loop": """%%accelerate
import torch, torch.distributed as dist
total = 0
for i in range(4):
    value = (i + 1) * (dist.get_rank() + 1) * 7
    if dist.get_rank() == 1 and i == 2:
        breakpoint()
    total += value
t = torch.tensor([float(total)])
dist.all_reduce(t)
f"sum over the ranks: {t.item()}\"""",
    "stop": "%accelerate stop",
}
ORDER = list(SOURCES)
PROMPT = re.compile(r"^\[(\d+)\]:$")


def _cell(page, name: str):
    return code_cell(page, ORDER.index(name))


def _start(page, name: str) -> tuple[object, str]:
    cell = _cell(page, name)
    cell.scroll_into_view_if_needed()
    before = cell_prompt(cell)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    return cell, before


def _wait_done(cell, before: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (PROMPT.match(cell_prompt(cell)) and cell_prompt(cell) != before):
        assert time.monotonic() < deadline, f"the cell did not finish:\n{cell_output(cell)}"
        time.sleep(0.1)


def _type_at_prompt(cell, line: str) -> str:
    """Wait for the cell's input box, type ``line`` and Enter; returns the box's prompt."""
    from playwright.sync_api import expect

    box = cell.locator(".jp-Stdin-input").last  # (the box answered may linger a moment)
    expect(box).to_be_visible(timeout=30_000)
    prompt = cell.locator(".jp-Stdin-prompt").last.inner_text()
    box.fill(line)
    box.press("Enter")
    # Lab replaces the box by the prompt and the line typed (a new box comes with pdb's next prompt)
    expect(cell.locator(".jp-Cell-outputWrapper")).to_contain_text(f"{prompt.strip()} {line}",
                                                                  timeout=10_000)
    return prompt


def test_breakpoint_on_rank_one_is_answered_in_the_notebooks_input_box(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    artifacts = artifacts_dir(tmp_path)
    root = tmp_path / "lab"
    root.mkdir()
    (root / "pdb.ipynb").write_text(json.dumps(notebook_json(SOURCES)))

    with jupyter_lab(root, lab_env()) as server, sync_playwright() as pw, \
            chromium(pw, tmp_path / "profile") as page:
        try:
            open_notebook(page, server, "pdb.ipynb")
            cell, before = _start(page, "start")
            _wait_done(cell, before, 60)
            assert "pool up: 2 ranks" in cell_output(cell), cell_output(cell)

            cell, before = _start(page, "loop")
            expect(cell.locator(".jp-Stdin-input").last).to_be_visible(timeout=30_000)
            _shot(page, cell, artifacts / "pdb_prompt.png")
            assert _type_at_prompt(cell, "p value").strip() == "(Pdb rank 1)"
            expect(cell.locator(".jp-Cell-outputWrapper")).to_contain_text("[rank 1] 42",
                                                                          timeout=10_000)
            assert _type_at_prompt(cell, "c").strip() == "(Pdb rank 1)"
            _wait_done(cell, before, 30)
            out = cell_output(cell)
            _shot(page, cell, artifacts / "pdb_prompt_done.png")
            assert "'sum over the ranks: 210.0'" in out, out  # 70 + 140: the normal result
            assert "[rank 0] 42" not in out and "Error" not in out, out

            cell, before = _start(page, "stop")
            _wait_done(cell, before, 30)
            assert "pool stopped" in cell_output(cell)
        finally:
            page.screenshot(path=str(artifacts / "pdb_prompt_last.png"), full_page=True)
    assert (artifacts / "pdb_prompt.png").stat().st_size > 1000


def _shot(page, cell, path: Path) -> None:
    cell.scroll_into_view_if_needed()
    page.screenshot(path=str(path), full_page=True)
