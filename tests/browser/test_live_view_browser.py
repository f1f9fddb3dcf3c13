"""Rich worker output and the live view in a real browser, live and in the reopened notebook.

JupyterLab + headless Chromium (see ``tests/browser_support.py``). The notebook runs a
2-worker job whose rank 0 displays HTML, a matplotlib figure and a ``tqdm.auto`` bar,
and logs a loss falling four decades; it is saved, then reopened by a server with
another notary secret, i.e. as an untrusted notebook (an SVG output shown as its
text proves it). Screenshots: ``live_view_run.png``,
``live_view_reopened_untrusted.png``.
"""

from __future__ import annotations

import json
import time

from tests.browser_support import (
    BROWSER_MARKS,
    artifacts_dir,
    chromium,
    jupyter_lab,
    lab_env,
    notebook_json,
    open_notebook,
    run_all_cells,
)

pytestmark = BROWSER_MARKS

TRAIN = '''%matplotlib inline
from IPython.display import HTML, SVG, display
from tqdm.auto import tqdm
from notebook_accel import Accelerator, notebook_launcher

def train():
    import time
    import matplotlib.pyplot as plt
    accelerator = Accelerator()
    display(HTML(f"<b>rich output from rank {accelerator.process_index}</b>"))
    for step in tqdm(range(60), desc="train", disable=not accelerator.is_local_main_process):
        accelerator.log({"loss": 10 ** (-4 * step / 59)}, step=step)
        time.sleep(0.04)
    if accelerator.is_main_process:
        plt.figure(figsize=(3, 2))
        plt.plot(range(10))
        plt.title("figure of rank 0")
        plt.show()
    return accelerator.process_index

notebook_launcher(train, num_processes=2)'''
TRUST_PROBE = ('SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20">'
               '<rect width="40" height="20" fill="green"/></svg>\')')
NOTEBOOK = notebook_json({"train": TRAIN, "probe": TRUST_PROBE})
LOADED_IMAGES = """root => [...root.querySelectorAll('img')].map(img => ({
    src: img.src.slice(0, 30), ok: img.complete && img.naturalWidth > 0,
    text: img.src.startsWith('data:image/svg+xml') ? atob(img.src.split(',')[1]) : ''}))"""


def _check_outputs(page, expect) -> None:
    """What both the live run and the reopened notebook must show in the training cell."""
    cell = page.locator(".jp-CodeCell").first
    outputs = cell.locator(".jp-OutputArea-output")
    live = cell.locator(".notebook-accel-live")
    expect(live).to_contain_text("finished in", timeout=120_000)
    expect(live).to_contain_text("train")  # tqdm.auto in the workers: the job's bar
    # the block sits under the input, above the log (below only the cold start's one line)
    first = [html for html in outputs.evaluate_all("els => els.map(e => e.innerHTML)")
             if "starting 2 workers" not in html][0]
    assert "notebook-accel-live" in first
    expect(cell.get_by_text("rich output from rank 0")).to_be_visible()
    # rank 1's display is counted, not printed as its object repr
    expect(cell).to_contain_text("rank 1 displayed 1 rich output")
    assert "<IPython.core.display.HTML object>" not in cell.inner_text()
    assert cell.get_by_text("rich output from rank 1", exact=True).count() == 0
    charts = live.evaluate(LOADED_IMAGES)
    assert charts and all(chart["ok"] for chart in charts), charts
    assert "(log scale)" in charts[0]["text"] and "step 0</text>" in charts[0]["text"]
    assert "step 59" not in live.inner_text()  # no stray chart labels as text
    figures = [img for img in outputs.evaluate_all(
        "els => els.flatMap(e => [...e.querySelectorAll('img')]).map(i => ({src: i.src.slice(0, 22),"
        " ok: i.complete && i.naturalWidth > 0}))") if img["src"] == "data:image/png;base64,"]
    assert figures and all(f["ok"] for f in figures), figures  # rank 0's matplotlib figure


def test_rich_output_and_the_summary_render_live_and_in_the_reopened_untrusted_notebook(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    artifacts = artifacts_dir(tmp_path)
    root = tmp_path / "lab"
    root.mkdir()
    path = root / "train.ipynb"
    path.write_text(json.dumps(NOTEBOOK))  # plain JSON: no nbformat import
    env = lab_env()

    with sync_playwright() as pw:
        with jupyter_lab(root, env, data="first") as server, \
                chromium(pw, tmp_path / "profile-1") as page:
            try:
                open_notebook(page, server, "train.ipynb")  # both cells in view
                run_all_cells(page)
                _check_outputs(page, expect)
                probe = page.locator(".jp-CodeCell").nth(1)
                probe.scroll_into_view_if_needed()  # Lab renders cells in view only
                expect(probe.locator(".jp-OutputArea-output img")).to_be_visible(
                    timeout=30_000)  # trusted while it runs: Lab shows the SVG
                page.locator(".jp-CodeCell").first.scroll_into_view_if_needed()
                page.keyboard.press("Control+s")
                deadline = time.monotonic() + 30
                while "notebook-accel-live" not in path.read_text():
                    assert time.monotonic() < deadline, "the notebook was not saved"
                    time.sleep(0.3)
            finally:
                page.screenshot(path=str(artifacts / "live_view_run.png"), full_page=True)

        with jupyter_lab(root, env, data="second") as server, \
                chromium(pw, tmp_path / "profile-2") as page:
            try:
                open_notebook(page, server, "train.ipynb")  # both cells in view
                untrusted = page.locator(".jp-CodeCell").nth(1)
                untrusted.scroll_into_view_if_needed()
                # untrusted: Lab shows the SVG's text/plain, not the image
                expect(untrusted).to_contain_text("<IPython.core.display.SVG object>",
                                                  timeout=30_000)
                assert untrusted.locator(".jp-OutputArea-output img").count() == 0
                page.locator(".jp-CodeCell").first.scroll_into_view_if_needed()
                _check_outputs(page, expect)
            finally:
                page.screenshot(path=str(artifacts / "live_view_reopened_untrusted.png"),
                                full_page=True)
    for name in ("live_view_run.png", "live_view_reopened_untrusted.png"):
        assert (artifacts / name).stat().st_size > 1000
