"""The stop button inside a collective, then the cells after it, in a real browser (issue 36).

JupyterLab + headless Chromium (see ``tests/browser_support.py``). The notebook starts a
2-worker pool without the heal (``--no-heal``: every worker replaced after a rank is ended), builds a prepared model on it, then waits in an ``all_reduce`` that rank 1
(asleep) never joins; the notebook toolbar's stop button is pressed. The cell says the
workers were replaced and what was lost; the next cell, which reads rank 0's copy of the
``Accelerator``, is refused, naming the cell that brought it back by the number the
browser shows; after the training cell runs again, the same cell gives each rank its
own identity. Screenshots: ``pool_interrupt_stopped.png``, ``pool_interrupt_refused.png``,
``pool_interrupt_rebuilt.png``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from tests.browser_support import (
    BROWSER_MARKS,
    REPO,
    artifacts_dir,
    chromium,
    jupyter_lab,
    lab_env,
    notebook_json,
    open_notebook,
)

pytestmark = BROWSER_MARKS

START = """%load_ext notebook_accel
import magics, notebook_accel
print("imported from", notebook_accel.__file__, magics.__file__)
%accelerate start -n 2 --no-heal"""  # every worker replaced after the stop (the heal: test_pool_heal)
BUILD = """%%accelerate
import time, torch, torch.distributed as dist
from notebook_accel import Accelerator
accelerator = Accelerator()
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.arange(16.0).reshape(8, 2), batch_size=2)
model, opt, loader = accelerator.prepare(model, opt, loader)"""
STUCK = """%%accelerate
import time, torch, torch.distributed as dist
if accelerator.process_index == 1:
    time.sleep(30)
print("waiting in all_reduce", flush=True)
dist.all_reduce(torch.ones(1))"""
REDUCE = """%%accelerate
t = torch.tensor([accelerator.process_index + 1.0])
dist.all_reduce(t)
print("process_index", accelerator.process_index, "sum:", t.item())"""
STOP = "%accelerate stop"
SOURCES = {"start": START, "build": BUILD, "stuck": STUCK, "reduce": REDUCE, "stop": STOP}
NOTEBOOK = notebook_json(SOURCES)
ORDER = list(SOURCES)
PROMPT = re.compile(r"^\[(\d+)\]:$")
INTERRUPT = ('.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"], '
             '.jp-NotebookPanel-toolbar [title="Interrupt the kernel"]')


def _cell(page, name: str):
    return page.locator(".jp-Notebook .jp-CodeCell").nth(ORDER.index(name))


def _prompt(cell) -> str:
    return " ".join(cell.locator(".jp-InputPrompt").first.inner_text().split())


def _start(page, name: str) -> tuple[object, str]:
    """Run one cell (Ctrl+Enter in its editor); returns it and its prompt before."""
    cell = _cell(page, name)
    cell.scroll_into_view_if_needed()  # Lab renders cells in view only
    before = _prompt(cell)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    return cell, before


def _wait_done(cell, before: str, timeout_s: float) -> int:
    """Wait for the cell's prompt to show a new execution count; returns it."""
    deadline = time.monotonic() + timeout_s
    while True:
        prompt = _prompt(cell)
        match = PROMPT.match(prompt)
        if match and prompt != before:
            return int(match.group(1))
        assert time.monotonic() < deadline, (
            f"the cell did not finish in {timeout_s:g} s (prompt {prompt!r}):\n{_output(cell)}")
        time.sleep(0.1)


def _run(page, name: str, timeout_s: float = 40) -> tuple[int, str]:
    cell, before = _start(page, name)
    count = _wait_done(cell, before, timeout_s)
    return count, _output(cell)


def _output(cell) -> str:
    return cell.locator(".jp-Cell-outputWrapper").inner_text()


def _press_stop(page) -> str:
    """The notebook toolbar's stop button; else Kernel -> Interrupt Kernel, by exact text."""
    button = page.locator(INTERRUPT).first
    if button.count():
        button.click()
        return "the toolbar's stop button"
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel").get_by_text("Kernel", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Interrupt Kernel", exact=True).click()
    return "Kernel -> Interrupt Kernel"


def _shot(page, cell, path: Path) -> None:
    cell.scroll_into_view_if_needed()
    page.screenshot(path=str(path), full_page=True)


def test_the_stop_button_inside_a_collective_then_the_cells_after_it(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    artifacts = artifacts_dir(tmp_path)
    root = tmp_path / "lab"
    root.mkdir()
    (root / "interrupt.ipynb").write_text(json.dumps(NOTEBOOK))  # plain JSON: no nbformat import

    with jupyter_lab(root, lab_env()) as server, sync_playwright() as pw, \
            chromium(pw, tmp_path / "profile") as page:
        try:
            open_notebook(page, server, "interrupt.ipynb")

            # 1. the extension (this checkout's: the kernel sees it), a warm pool of 2
            _, out = _run(page, "start")
            assert f"imported from {REPO}/notebook_accel/__init__.py {REPO}/magics/" in out, out

            # 2. the training cell: what came back from rank 0, and that it stays rank 0's
            build_count, out = _run(page, "build")
            line = next((line for line in out.splitlines() if "back from rank 0" in line), out)
            assert "back from rank 0: accelerator, model, opt, loader" in line, line
            assert "rank 0's, to look at here; never sent to the workers" in line, line

            # 3. rank 0 waits in an all_reduce rank 1 never joins: press stop
            cell, before = _start(page, "stuck")
            expect(cell.locator(".jp-Cell-outputWrapper")).to_contain_text(
                "waiting in all_reduce", timeout=30_000)
            time.sleep(0.3)  # rank 0 is inside the collective now
            pressed = time.monotonic()
            print("pressed", _press_stop(page))
            _wait_done(cell, before, 20)
            stopped_in = time.monotonic() - pressed
            out = _output(cell)
            _shot(page, cell, artifacts / "pool_interrupt_stopped.png")
            assert ("the pool's workers were replaced (rank 0 did not stop within 1.5 s of the "
                    "interrupt") in out, out
            assert "so we ended it" in out and "their state was lost:" in out, out
            # LaunchInterrupted, a KeyboardInterrupt, shown as one line (its _render_traceback_)
            assert "KeyboardInterrupt: interrupted the run" in out, out
            assert stopped_in < 15, stopped_in  # not rank 1's 30 s sleep

            # 4. rank 0's Accelerator is never sent to every rank: refused, by the cell number
            build_prompt = _prompt(_cell(page, "build"))
            assert build_prompt == f"[{build_count}]:", build_prompt
            _, out = _run(page, "reduce")
            _shot(page, _cell(page, "reduce"),
                                     artifacts / "pool_interrupt_refused.png")
            assert "UnshippableNamesError" in out, out
            assert ("accelerator: rank 0's copy of an Accelerator, brought back by cell "
                    f"[{build_count}]") in out, out
            assert "sum:" not in out, out  # nothing ran: not rank 0's identity on every rank

            # 5. the training cell again, on the new workers: each rank is itself again
            _, out = _run(page, "build")
            assert "back from rank 0: accelerator, model, opt, loader" in out, out
            _, out = _run(page, "reduce")
            _shot(page, _cell(page, "reduce"),
                                     artifacts / "pool_interrupt_rebuilt.png")
            assert "[rank 0] process_index 0 sum: 3.0" in out, out
            assert "[rank 1] process_index 1 sum: 3.0" in out, out
            assert "UnshippableNamesError" not in out, out

            # 6. the pool is stopped (conftest checks that no worker is left)
            _, out = _run(page, "stop")
            assert "[notebook_accel] pool stopped" in out, out
        finally:
            page.screenshot(path=str(artifacts / "pool_interrupt_last.png"), full_page=True)
    for name in ("stopped", "refused", "rebuilt"):
        assert (artifacts / f"pool_interrupt_{name}.png").stat().st_size > 1000
