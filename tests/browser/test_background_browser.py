"""A background run, the page closed while it runs, then reopened: ``%accelerate watch``
shows every line, those printed while no page was open included (issue 46).

JupyterLab + headless Chromium (see ``tests/browser_support.py``). The notebook starts a
2-worker pool and runs a ``%%accelerate --background`` cell printing a numbered line per
step, each with the time it was printed; the page (the tab) is closed during the run, and
a new page opens the notebook again: JupyterLab reconnects it to the same kernel, where
the watch cell shows each rank's lines, each once, then the run's end. Screenshot:
``background_reopened_watch.png``.
"""

from __future__ import annotations

import json
import re
import time

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

STEPS = 60
START = "%load_ext notebook_accel\n%accelerate start -n 2"
TRAIN = f"""%%accelerate --background
import time
for i in range({STEPS}):
    print(f"step {{i}} at {{time.time():.3f}}", flush=True)
    time.sleep(0.15)"""
OUTCOME = """run = [value for value in Out.values() if type(value).__name__ == "RunHandle"][-1]
print("outcome:", run.state(), run.done())"""  # the train cell's value: its handle
SOURCES = {"start": START, "train": TRAIN, "watch": "%accelerate watch", "outcome": OUTCOME,
           "stop": "%accelerate stop"}
ORDER = list(SOURCES)
LINE = re.compile(r"^\[rank (\d)\] step (\d+) at ([\d.]+)$", re.MULTILINE)


def _cell(page, name: str):
    return code_cell(page, ORDER.index(name))


def _run(page, name: str, timeout_s: float = 40) -> str:
    """Run one cell (Ctrl+Enter in its editor), wait for its new execution count; its output."""
    cell = _cell(page, name)
    cell.scroll_into_view_if_needed()  # Lab renders cells in view only
    before = cell_prompt(cell)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    deadline = time.monotonic() + timeout_s
    while not (re.fullmatch(r"\[\d+\]:", cell_prompt(cell)) and cell_prompt(cell) != before):
        assert time.monotonic() < deadline, (
            f"cell {name!r} did not finish in {timeout_s:g} s:\n{cell_output(cell)}")
        time.sleep(0.1)
    return cell_output(cell)


def test_watch_in_the_reopened_page_shows_every_line_of_a_background_run(tmp_path):
    from playwright.sync_api import sync_playwright

    artifacts = artifacts_dir(tmp_path)
    root = tmp_path / "lab"
    root.mkdir()
    (root / "background.ipynb").write_text(json.dumps(notebook_json(SOURCES)))

    with jupyter_lab(root, lab_env()) as server, sync_playwright() as pw, \
            chromium(pw, tmp_path / "profile") as first:
        open_notebook(first, server, "background.ipynb")
        out = _run(first, "start", timeout_s=60)
        assert "[rank" not in out and "Error" not in out, out
        out = _run(first, "train", timeout_s=10)  # returns at once: the run goes on
        assert "runs in the background on the pool; %accelerate watch" in out, out
        assert re.search(r"<RunHandle cell \[\d+\]: running", out), out
        context = first.context
        first.close()  # the tab: no page listens to the kernel now
        closed = time.time()
        time.sleep(2)
        page = context.new_page()
        try:
            open_notebook(page, server, "background.ipynb")  # the same kernel, reconnected
            reopened = time.time()
            out = _run(page, "watch", timeout_s=40)
            watched = time.time()
            _cell(page, "watch").locator(".jp-OutputArea-output").last.scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts / "background_reopened_watch.png"),
                            full_page=True)
            lines = LINE.findall(out)
            for rank in ("0", "1"):
                steps = [int(step) for r, step, _ in lines if r == rank]
                assert steps == list(range(STEPS)), (rank, steps, out)
            printed = [float(at) for _, _, at in lines]
            assert any(closed < at < reopened for at in printed), (  # printed with no page open
                closed, reopened, printed)
            print(f"closed for {reopened - closed:.1f} s; {sum(at > reopened for at in printed)} "
                  f"lines printed after the reopen; watch ended {watched - max(printed):.2f} s "
                  "after the last line")
            # watch returned at the run's end, saying so: its outcome
            assert re.fullmatch(r"\[notebook_accel\] cell \[\d+\] finished", out.strip().splitlines()[-1]), out
            assert re.match(r"\[rank \d\] step 59 at", out.strip().splitlines()[-2]), out
            assert _run(page, "outcome").strip() == "outcome: finished True"
            out = _run(page, "stop")
            assert "[notebook_accel] pool stopped" in out, out
        finally:
            page.screenshot(path=str(artifacts / "background_last.png"), full_page=True)
    assert (artifacts / "background_reopened_watch.png").stat().st_size > 1000
