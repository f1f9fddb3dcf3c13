"""demo_notebooks/07_debugging.ipynb, cell by cell in a real kernel, its prompts answered.

nbclient cannot answer a kernel's input requests (it runs cells with ``allow_stdin=False``),
so the notebook's code cells run through the kernel harness, which answers pdb's prompts
through Jupyter's stdin channel (as the notebook's input box) and presses the stop button
(a kernel interrupt) once the hung rank's stacks are shown. Two CPU ranks, through the
environment tier, as the other demos' tests run them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kernel_harness import Kernel, wait_no_workers

pytestmark = pytest.mark.slow
DEMO = Path(__file__).parents[2] / "demo_notebooks" / "07_debugging.ipynb"
ANSWERS = {  # cell id -> the lines typed at its prompts
    "debug": ["p x.shape", "p len(x) % BATCH", "q"],
    "bp": ["p [len(b) for b, _ in loader]", "p counts", "c"],
}
STACKS_SHOWN = "every rank's stack now:"


def _cells() -> list[dict]:
    cells = json.loads(DEMO.read_text())["cells"]
    return [cell for cell in cells if cell["cell_type"] == "code"]


def _answering(lines: list[str], prompts: list[str]):
    typed = iter(lines)

    def on_input(prompt, result):
        prompts.append(prompt)
        return next(typed)

    return on_input


def _stop_once_stacks_shown(kernel: Kernel, pressed: list[bool]):
    def on_output(result):
        if STACKS_SHOWN in result.stderr and not pressed:
            pressed.append(True)
            kernel.manager.interrupt_kernel()  # the notebook's stop button

    return on_output


def test_the_debugging_demo_runs_with_its_prompts_answered():
    kernel = Kernel(extra_env={"NOTEBOOK_ACCEL_NUM_PROCESSES": "2"}, history=True)
    results, prompts, pressed = {}, {}, []
    try:
        for cell in _cells():
            name, source = cell["id"], "".join(cell["source"])
            prompts[name] = []
            on_input = _answering(ANSWERS[name], prompts[name]) if name in ANSWERS else None
            on_output = _stop_once_stacks_shown(kernel, pressed) if name == "bug2" else None
            result = kernel.collect(kernel.execute(source), timeout=120, on_input=on_input,
                                    on_output=on_output)
            failing = "raises-exception" in cell["metadata"].get("tags", [])
            assert (result.error is not None) == failing, (name, result.traceback, result.stderr)
            results[name] = result
    finally:
        kernel.shutdown()
    assert not wait_no_workers(), "the demo's pool outlived the kernel"

    assert "[rank 1] rank 1 of 2" in results["world"].stdout
    assert ("rank 1 failed: RuntimeError: shape '[-1, 16, 8]' is invalid"
            in results["bug1"].error["evalue"]), results["bug1"].error
    debug = results["debug"]
    assert prompts["debug"] == ["(Pdb rank 1) "] * 3
    assert "[rank 1] torch.Size([52, 8])" in debug.stdout and "[rank 1] 4\n" in debug.stdout
    assert "[rank 0]" not in debug.stdout
    ranks = results["ranks"]
    assert "[rank 1] rank 1 holds 52 samples: 3 batches and 4 left over" in ranks.stdout
    assert "[rank 0]" not in ranks.stdout and "52" in str(ranks.outputs)

    hang = results["bug2"]
    assert pressed, "the hung rank's stacks were never shown"
    assert "no progress (no output, event or collective) for 5 s on rank 1" in hang.stderr
    stacks = hang.stderr.split(STACKS_SHOWN)[1]
    assert "rank 1: all_reduce <- train <- <module>" in stacks, stacks
    assert "dist.all_reduce(p.grad)" in stacks
    # above the stacks, the ranks' collectives: rank 1 waits in one its peer never reaches
    said = hang.stderr.split("last collectives: ")[1].split(STACKS_SHOWN)[0]
    assert said.startswith("not every rank reached all_reduce #"), said
    assert "rank 1 waits in all_reduce #" in said and "rank 0 never reached it: its run ended" in said
    assert "[rank 0] step 2" in hang.stdout and "[rank 1] step 2" in hang.stdout
    assert "[rank 0] step 3" not in hang.stdout
    assert hang.error["ename"] in ("KeyboardInterrupt", "LaunchInterrupted"), hang.error
    assert "The pool healed: rank 1 was replaced" in hang.stdout  # the rank the stop ended
    assert "ranks 0, 1: idle (no run)" in results["stacks"].stdout

    breakpoint_cell = results["bp"]
    assert prompts["bp"] == ["(Pdb rank 1) "] * 3
    assert "[rank 1] [16, 16, 16, 4]" in breakpoint_cell.stdout
    assert "[rank 1] [3, 4]" in breakpoint_cell.stdout
    assert "[3, 4]" in str(breakpoint_cell.outputs)  # c: the cell's own value

    fix = results["fix"]
    assert "[rank 0] 4 batches" in fix.stdout and "[rank 1] 4 batches" in fix.stdout
    assert "[rank 1] step 3" in fix.stdout
    assert "trained on every rank; final loss" in results["result"].stdout
