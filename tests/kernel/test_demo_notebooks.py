"""The demo notebooks a new user opens first must run top to bottom in a real kernel."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from tests.cluster_harness import private_network

HAVE_OWN_TEST = {
    "02_cell_magic.ipynb",  # tests/kernel/test_magic_demo.py runs it
    "07_debugging.ipynb",  # tests/kernel/test_debugging_demo.py: its pdb prompts need answers
}
# The demos ask for every device and the best precision; these run them on 2 CPU workers through the
# environment tier (a user's NOTEBOOK_ACCEL_NUM_PROCESSES), as on any machine with 2 cores. 03
# saves a config file and launches from it, so it runs as it is (its count: every CPU core).
PINNED = {"NOTEBOOK_ACCEL_NUM_PROCESSES": "2"}
AS_IT_IS = {"03_config_panel.ipynb", "06_cluster.ipynb"}
NOTEBOOKS = sorted(p for p in (Path(__file__).parents[2] / "demo_notebooks").glob("*.ipynb")
                   if p.name not in HAVE_OWN_TEST)


def _execute(path: Path):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return notebook


def _text(notebook) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                parts.append(output.text)
            elif "data" in output:
                parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_demo_notebook_runs(path, monkeypatch):
    from notebook_accel.machine import devices, hardware

    if path.name not in AS_IT_IS:
        for name, value in PINNED.items():
            monkeypatch.setenv(name, value)  # the kernel inherits it
    hw = hardware.detect()
    if path.name == "06_cluster.ipynb":
        pytest.importorskip("ray", reason="the cluster demo needs the ray extra")
    with private_network() if path.name == "06_cluster.ipynb" else contextlib.nullcontext():
        notebook = _execute(path)  # raises CellExecutionError on any failing cell
    assert _text(notebook).strip(), f"{path.name} printed nothing"
    if path.name == "01_quickstart.ipynb":
        text = _text(notebook)
        best = devices.best_precision("cpu", hw)  # mixed_precision="auto" on this CPU
        assert f"[notebook_accel] mixed precision auto: {best} (this CPU has" in text
        assert "[rank 0] epoch 4: loss" in text and f"(2 processes, {best})" in text
        held_out = float(text.split("held-out loss:")[1].split()[0])
        assert held_out < 0.3, held_out
        assert "caught WorkerError (rank=1): rank 1 failed: ValueError: rank 1 found a bug" in text
        assert "loss values logged" in text
        displays = [output.data.get("text/plain", "") for cell in notebook.cells
                    for output in cell.get("outputs", []) if output.output_type == "display_data"]
        assert any("finished in" in text for text in displays), displays
        images = [output for cell in notebook.cells for output in cell.get("outputs", [])
                  if output.output_type == "display_data" and "image/png" in output.data]
        assert len(images) == 2, "rank 0's figure, once per training launch"
    if path.name == "06_cluster.ipynb":
        text = _text(notebook)
        assert "[node 0 rank 0] rank 0 of 2 on node 0" in text
        assert "[node 1 rank 1] rank 1 of 2 on node 1" in text
        assert "[node 0 rank 0] epoch 4: loss" in text
        assert float(text.split("held-out loss:")[1].split()[0]) < 0.3
        assert "sum over both nodes: 30.0" in text and "cluster stopped" in text
        assert re.search(r"caught WorkerError: rank 1 on node 1 \(127\.0\.0\.[12]\) failed: "
                         r"ValueError: rank 1 found a bug", text), text
    if path.name == "05_warm_workers.ipynb":
        text = _text(notebook)
        assert "pool up: 2 ranks" in text and "[rank 0] epoch 7: loss" in text
        assert float(text.split("held-out accuracy in the notebook:")[1].split()[0]) > 0.9
        assert "the workers still hold 7 epochs of losses" in text  # the failing cell kept them
        assert "sum over all ranks: 90.0" in text and "pool stopped" in text
        images = [output for cell in notebook.cells for output in cell.get("outputs", [])
                  if output.output_type == "display_data" and "image/png" in output.data]
        assert len(images) == 1, "the loss plot"
    if path.name == "04_colab_tpu.ipynb":  # no TPU here: the same cells on the CPU cores
        text = _text(notebook)
        assert "No TPU on this machine" in text and "losses per epoch:" in text
        assert "(2 processes)" in text
    if path.name == "03_config_panel.ipynb":
        text = _text(notebook)
        assert "sanity check passed: True" in text
        every = devices.every_device("cpu", hw)  # the panel's count when the file sets none
        assert f"world size from the saved file: {every}" in text
        assert f"mixed_precision: {devices.best_precision('cpu', hw)}" not in text  # saved as auto
        assert "mixed_precision: auto" in text


def test_demos_hard_code_no_process_count_or_precision():
    """Colab has one GPU, Kaggle two T4s (no bf16), a TPU one or eight chips: a demo asks for
    every device and the best precision, never a count or bf16 of its own (issue 31, part 4)."""
    import json

    hard = re.compile(r"num_processes=[2-9]|\s-n\s*[2-9]|--num-processes\s*[2-9]|\"bf16\"|'bf16'"
                      r"|--mixed-precision\s+bf16|num_processes\.value\s*=")
    for path in (Path(__file__).parents[2] / "demo_notebooks").glob("*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code":
                assert not hard.search(source), (path.name, hard.search(source)[0])
