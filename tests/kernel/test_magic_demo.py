"""demo_notebooks/02_cell_magic.ipynb runs top to bottom, headless, and shows what it promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DEMO = Path(__file__).parents[2] / "demo_notebooks" / "02_cell_magic.ipynb"


def _outputs(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type == "error":
            parts.append(re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(output.traceback)))
        elif "data" in output:
            parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


@pytest.mark.slow
def test_magic_demo_notebook_runs_headless(monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("NOTEBOOK_ACCEL_NUM_PROCESSES", "2")  # "every device": 2 CPU workers here
    notebook = nbformat.read(DEMO, as_version=4)
    nbformat.validate(notebook)
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(DEMO.parent)}}).execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    by_source = {cell.source.splitlines()[0]: _outputs(cell) for cell in code}
    text = "".join(_outputs(cell) for cell in code)
    training = [_outputs(cell) for cell in code if "accelerator.prepare" in cell.source][0]
    assert "[rank 0] epoch 5: loss" in training and "[rank 1]" not in training
    assert "Sequential trained on 2 processes" in text
    assert float(text.split("accuracy: ")[1].split()[0]) > 0.9
    failing = [_outputs(cell) for cell in code if "found a bug" in cell.source][0]
    assert "rank 1 failed: ValueError: rank 1 found a bug" in failing
    assert ", line 5, in <module>" in failing
    refused = [_outputs(cell) for cell in code if cell.source.endswith('print("never runs")')][0]
    assert "lock: TypeError: cannot pickle '_thread.lock' object" in refused
    assert "never runs" not in refused.replace('print("never runs")', "")
    assert "PyTorch: " in by_source["%accelerate env"]
    assert "Test is a success!" in by_source["%accelerate test"]
