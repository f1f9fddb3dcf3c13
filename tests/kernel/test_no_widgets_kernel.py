"""Where widgets do not render (VS Code with some ipywidgets versions, an untrusted notebook,
nbconvert), a notebook still says what ran and how to configure (issue 31, part 6).

The notebook is executed in a real kernel (nbclient, as nbconvert does), then read as a front end
without a widget manager reads it: only the text/plain and text/html parts of the outputs.
"""

from __future__ import annotations

import html
import re

WIDGET = "application/vnd.jupyter.widget-view+json"

JOB = """\
from notebook_accel import notebook_launcher

def train(steps):
    import time
    from notebook_accel.observe.progress import tqdm
    for step in tqdm(range(steps), desc="train"):
        time.sleep(0.08)
    return steps

notebook_launcher(train, (25,), num_processes=2)
"""


def _shown_without_widgets(output) -> str:
    """What a front end without a widget manager shows of one output."""
    if output.output_type == "stream":
        return output.text
    data = output.get("data", {})
    text = data.get("text/plain", "")
    if "text/html" in data:
        text += "\n" + html.unescape(re.sub(r"<[^>]+>", " ", data["text/html"]))
    return text


def test_live_view_and_panel_speak_text_where_widgets_do_not_render(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(JOB),
        nbformat.v4.new_code_cell(f"%load_ext notebook_accel\n"
                                  f"%accelerate config --config {tmp_path / 'config.yaml'}"),
    ])
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    job, panel = ([_shown_without_widgets(o) for o in cell.outputs] for cell in notebook.cells)

    live = [o for o in notebook.cells[0].outputs if o.output_type == "display_data"]
    assert live and not any(WIDGET in o.data for o in live)  # the live view needs no widgets
    summary = "".join(_shown_without_widgets(o) for o in live)
    assert "finished in" in summary and "train: 100%" in summary and "25/25" in summary
    assert "rank 1: finished" in summary
    assert "".join(job).rstrip().endswith("25")  # rank 0's value, as text

    [result] = [o for o in notebook.cells[1].outputs if o.output_type == "execute_result"]
    assert WIDGET in result.data  # the panel itself, where widgets render
    text = result.data["text/plain"]
    assert "notebook-accel config --help" in text.splitlines()[0]  # even in ipywidgets 7's 110 chars
    assert "notebook-accel config --num-processes 2 --mixed-precision auto" in text
    assert str(tmp_path / "config.yaml") in "".join(panel)
