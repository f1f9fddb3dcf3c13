"""``%%accelerate`` and ``%accelerate`` in a real Jupyter kernel."""

from __future__ import annotations

import textwrap
import time

import pytest

from tests.kernel_harness import Kernel, wait_no_workers


def run_with_reply(kernel: Kernel, code: str):
    """Run a cell; also return its execute_reply (status, payloads such as ``?`` help)."""
    msg_id = kernel.execute(code)
    result = kernel.collect(msg_id)
    while True:
        reply = kernel.client.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return result, reply["content"]


def usage_error(kernel: Kernel, code: str) -> str:
    """Run a cell that must fail with IPython's UsageError (printed, not a traceback)."""
    result, reply = run_with_reply(kernel, code)
    assert reply["status"] == "error" and reply["ename"] == "UsageError", (reply, result)
    return result.stderr


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    """The kernel's default config file (absent unless a test writes it)."""
    return tmp_path_factory.mktemp("magic_config") / "default_config.yaml"


@pytest.fixture(scope="module")
def kernel(config_path, module_config_dirs):
    k = Kernel(extra_env={"NOTEBOOK_ACCEL_CONFIG_FILE": str(config_path)})
    k.ok("%load_ext notebook_accel")
    yield k
    k.shutdown()


NOTEBOOK_DEFINITIONS = """
import torch as T
scale = 3
def helper(v):
    return v * scale          # a global of the notebook, found through the function
class Box:
    def __init__(self, value):
        self.value = value
"""

USES_NOTEBOOK_NAMES = """%%accelerate -n 2
import os
rank = int(os.environ["RANK"])
box = Box(helper(T.ones(2) * (rank + 1)))
print("rank", rank, "world", os.environ["WORLD_SIZE"], "value", box.value.tolist())
"""


def test_cell_uses_notebook_variables_functions_and_classes_on_two_workers(kernel):
    kernel.ok(NOTEBOOK_DEFINITIONS)
    result = kernel.ok(USES_NOTEBOOK_NAMES)
    assert "[rank 0] rank 0 world 2 value [3.0, 3.0]\n" in result.stdout
    assert "[rank 1] rank 1 world 2 value [6.0, 6.0]\n" in result.stdout
    ours = [line for line in result.stdout.splitlines()
            if not line.startswith(("[rank 0] ", "[rank 1] ", "[notebook_accel] starting "))]
    # one line of ours (past the cold start's): the names that crossed (modules go by name, unlisted)
    assert ours == ["[notebook_accel] sent from the notebook: Box, helper · "
                    "back from rank 0: rank, box"], ours


def test_assigned_names_come_back_from_rank_zero_and_serve_the_next_cell(kernel):
    kernel.ok(NOTEBOOK_DEFINITIONS + "untouched = 'kernel value'\nlog = []")
    kernel.ok(textwrap.dedent("""\
        %%accelerate -n 2
        import os, threading
        rank = int(os.environ["RANK"])
        box = Box(T.full((2,), 10.0 * (rank + 1)))
        def double(v):
            return 2 * v
        weights = T.nn.Linear(2, 1)
        pair = (weights, weights.weight)       # shared objects stay shared
        log = log + [rank]
        guard = threading.Lock()               # cannot come back
        print(untouched)
        """))
    assert kernel.value("(rank, box.value.tolist(), log)") == (0, [10.0, 10.0], [0])
    assert kernel.value("(type(box).__name__, double(21), untouched)") == ("Box", 42, "kernel value")
    assert kernel.value("pair[0] is weights and pair[1] is weights.weight") is True
    assert kernel.value("'guard' in globals()") is False
    result = kernel.ok("%%accelerate -n 2\nvalue = double(box.value)\nguard = __import__('threading').Lock()")
    assert kernel.value("value.tolist()") == [20.0, 20.0]
    notice = [line for line in result.stderr.splitlines() if "not brought back" in line]
    assert notice == [
        "[notebook_accel] not brought back from rank 0: guard (TypeError: cannot pickle "
        "'_thread.lock' object)"], result.stderr


def test_pull_narrows_and_no_pull_keeps_the_notebook_as_it_was(kernel):
    kernel.ok("a = b = c = 'before'")
    result = kernel.ok("%%accelerate -n 2 --pull a,c,nowhere\na = 1\nb = 2\nc = 3")
    assert kernel.value("(a, b, c)") == (1, "before", 3)
    assert "nowhere (not defined on rank 0)" in result.stderr
    kernel.ok("%%accelerate -n 2 --no-pull\na = b = c = 'worker'")
    assert kernel.value("(a, b, c)") == (1, "before", 3)


def test_unshippable_names_are_refused_before_any_worker_starts(kernel, tmp_path):
    marker = tmp_path / "started"
    kernel.ok("import threading, types\nlock = threading.Lock()\ngen = (i for i in range(3))\n"
              "fake = types.ModuleType('made_up_module')\nfine = 1")
    result = kernel.run(f"%%accelerate -n 2\nopen({str(marker)!r}, 'w').close()\n"
                        "print(lock, gen, fake, fine)")
    assert result.error is not None and result.error["ename"] == "UnshippableNamesError"
    text = result.traceback
    assert "cannot send 3 name(s)" in text and "no worker was started" in text
    assert "lock: TypeError: cannot pickle '_thread.lock' object" in text
    assert "gen: TypeError: cannot pickle 'generator' object" in text
    assert "fake: module 'made_up_module' cannot be imported by name" in text
    assert "fine" not in text.replace("define", "")
    assert "[rank" not in result.stdout + result.stderr and not marker.exists()


FAILING_CELL = """%%accelerate -n 2
import os
rank = int(os.environ["RANK"])
partial = "should not come back"
if rank == 1:
    check_positive(-rank)
"""


def test_failing_rank_shows_its_frames_in_the_cell_and_the_kernel_carries_on(kernel):
    kernel.ok("def check_positive(v):\n    if v < 0:\n        raise ValueError(f'negative: {v}')\n"
              "partial = 'kernel value'")
    result = kernel.run(FAILING_CELL)
    assert result.error is not None and result.error["ename"] == "WorkerError"
    text = result.traceback
    assert "rank 1 failed: ValueError: negative: -1" in text
    cell_frame = text.index(", line 6, in <module>")
    assert text[cell_frame:].splitlines()[1].strip() == "check_positive(-rank)"
    helper_frame = text.index(", line 3, in check_positive")
    assert text[helper_frame:].splitlines()[1].strip() == "raise ValueError(f'negative: {v}')"
    assert cell_frame < helper_frame
    assert kernel.value("partial") == "kernel value"  # nothing comes back from a failed cell
    assert not wait_no_workers(timeout=5)
    assert kernel.value("1 + 1") == 2
    kernel.ok("%%accelerate -n 2\nagain = 'fine'")
    assert kernel.value("again") == "fine"


def test_syntax_error_and_bad_flags_are_reported_without_starting_workers(kernel):
    result = kernel.run("%%accelerate -n 2\nx = 1\ny = (\n")
    assert result.error["ename"] == "CellSyntaxError"
    assert "line 3" in result.traceback and "'(' was never closed" in result.traceback
    result = kernel.run("%%accelerate -n 2\nx = 1\n!ls\n")
    assert "line 3" in result.traceback and "does not run on the workers" in result.traceback
    assert "num_processes=0" in usage_error(kernel, "%%accelerate -n 0\nx = 1")
    assert "invalid choice: 'fp32'" in usage_error(kernel, "%%accelerate --mixed-precision fp32\nx")
    assert "%accelerate env" in usage_error(kernel, "%%accelerate env\nx = 1")
    assert "[rank" not in result.stdout


SHOW_SETTINGS = """{magic}
import os
from notebook_accel import Accelerator
accelerator = Accelerator()
settings = (accelerator.num_processes, str(accelerator.mixed_precision))
accelerator.wait_for_everyone()  # no rank leaves while another still connects
"""


def test_flags_override_the_config_file(kernel, config_path, tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("num_processes: 3\nmixed_precision: fp16\nuse_cpu: true\n")
    config_path.write_text("num_processes: 1\nmixed_precision: bf16\nuse_cpu: true\n")
    try:
        kernel.ok(SHOW_SETTINGS.format(magic="%%accelerate"))
        assert kernel.value("settings") == (1, "bf16")  # the default file
        kernel.ok(SHOW_SETTINGS.format(magic=f"%%accelerate --config {other}"))
        assert kernel.value("settings") == (3, "fp16")  # --config
        kernel.ok(SHOW_SETTINGS.format(magic=f"%%accelerate --config {other} -n 2 --mixed-precision no"))
        assert kernel.value("settings") == (2, "no")  # flags beat the file
    finally:
        config_path.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_cells_run_under_clean_start_methods(kernel, method):
    kernel.ok(NOTEBOOK_DEFINITIONS)
    result = kernel.ok(USES_NOTEBOOK_NAMES.replace("-n 2", f"-n 2 --start-method {method}"),
                       timeout=180)
    assert "[rank 1] rank 1 world 2 value [6.0, 6.0]\n" in result.stdout
    assert kernel.value("box.value.tolist()") == [3.0, 3.0]
    result = kernel.run(FAILING_CELL.replace("-n 2", f"-n 2 --start-method {method}"),
                        timeout=180)
    assert ", line 6, in <module>" in result.traceback


def test_output_of_rank_zero_only(kernel):
    result = kernel.ok("%%accelerate -n 2 --main-only\nimport os\nprint('from', os.environ['RANK'])")
    assert result.stdout == "[rank 0] from 0\n"


def test_help_and_line_magic_usage(kernel):
    _, reply = run_with_reply(kernel, "%%accelerate?")
    text = reply["payload"][0]["data"]["text/plain"]
    for expected in ("Run this cell on every worker", "--num-processes", "--mixed-precision",
                     "--start-method", "--timeout", "--pull NAMES", "--no-pull", "--main-only",
                     "--config FILE", "%accelerate env", "%accelerate test"):
        assert expected in text, expected
    assert "env, test or config" in usage_error(kernel, "%accelerate")
    count = "len(get_ipython().events.callbacks['pre_run_cell'])"
    before = kernel.value(count)
    kernel.ok("%load_ext magics")  # the other name works too, and registers nothing twice
    assert kernel.value(count) == before
    assert kernel.value("'AccelerateMagics' in get_ipython().magics_manager.registry") is True


def test_env_reports_versions_devices_and_config(kernel, config_path):
    result = kernel.ok("%accelerate env")
    for expected in ("notebook_accel: ", "PyTorch: ", "Hardware: ", "CPU cores",
                     f"Config file: none (defaults; `notebook-accel config --default` writes "
                     f"{config_path})", "num_processes: auto", "IPython: ",
                     "Start method 'auto' in this kernel: fork"):
        assert expected in result.stdout, expected


def test_sanity_check_passes_and_can_fail(kernel):
    result = kernel.ok("%accelerate test -n 2")
    assert result.stdout.count("  PASS  ") == 4, result.stdout
    assert "the weights match a single-process run" in result.stdout
    assert "Test is a success!" in result.stdout
    result = kernel.run("%accelerate test -n 2 --timeout 0.01")
    assert result.error["ename"] == "SanityCheckFailed"
    assert "  FAIL  the workers trained" in result.stdout
    assert "num_processes=0" in usage_error(kernel, "%accelerate test -n 0")


def test_interrupt_stops_the_workers(kernel):
    msg_id = kernel.execute("%%accelerate -n 2\nimport time\nprint('started', flush=True)\n"
                            "time.sleep(120)")
    started = {}

    def on_output(result):
        if result.stdout.count("started") == 2 and "t" not in started:
            started["t"] = time.monotonic()
            kernel.manager.interrupt_kernel()

    result = kernel.collect(msg_id, timeout=60, on_output=on_output)
    assert "t" in started, result
    assert result.error is not None and result.error["ename"] == "LaunchInterrupted"
    assert result.error["traceback"] == ["KeyboardInterrupt: stopped 2 workers"]  # no frames of ours
    assert not wait_no_workers(timeout=5)
    assert kernel.value("1 + 1") == 2


TRAINING_CELL = """
import torch
from notebook_accel import Accelerator

accelerator = Accelerator()
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(dataset, batch_size=16)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
steps = 0
for epoch in range(40):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
accelerator.print(f"{accelerator.num_processes} process(es), final loss {loss.item():.4f}")
"""


@pytest.mark.slow
def test_single_process_training_cell_trains_on_two_workers_with_the_magic(fresh_kernel):
    k = fresh_kernel
    k.ok("%load_ext notebook_accel\nimport torch\ntorch.manual_seed(0)\n"
         "X = torch.randn(256, 3)\ntrue_w = torch.tensor([[2.0], [-1.0], [0.5]])\n"
         "dataset = torch.utils.data.TensorDataset(X, X @ true_w + 0.3)\n"
         "def make_model():\n    return torch.nn.Linear(3, 1)")
    alone = k.ok(TRAINING_CELL)
    assert "1 process(es)" in alone.stdout and k.value("steps") == 40 * 16
    k.ok("model = None")
    together = k.ok("%%accelerate -n 2" + TRAINING_CELL)
    assert "[rank 0] 2 process(es), final loss" in together.stdout
    assert "[rank 1]" not in together.stdout  # accelerator.print: the main process only
    assert k.value("steps") == 40 * 16 // 2  # each rank saw half the batches
    assert k.value("type(model).__name__") == "Linear"  # unwrapped from DDP
    assert k.value("float((model.weight.T - true_w).abs().max())") < 0.05
    assert k.value("abs(float(model.bias) - 0.3)") < 0.05
    assert k.value("loss.item()") < 1e-3


def test_run_cell_magic_from_code_keeps_its_own_line_numbers(kernel):
    result = kernel.run("x = 1\nget_ipython().run_cell_magic('accelerate', '-n 2', "
                        "'a = 1\\nb = 2\\nraise KeyError(\"from code\")\\n')")
    assert result.error["ename"] == "WorkerError"
    frame = result.traceback.index(", line 4, in <module>")
    assert 'raise KeyError("from code")' in result.traceback[frame:].splitlines()[1]


def test_config_shows_the_panel(kernel):
    result = kernel.ok("%accelerate config")
    widgets = [m for m in result.outputs
               if "application/vnd.jupyter.widget-view+json" in m["content"].get("data", {})]
    assert widgets, result


def test_last_expression_is_the_cells_value_from_rank_zero(kernel):
    result = kernel.ok("%%accelerate -n 2\nimport os\nrank = int(os.environ['RANK'])\n"
                       "{'rank': rank, 'world': os.environ['WORLD_SIZE']}")
    shown = [m["content"]["data"]["text/plain"] for m in result.outputs
             if m["msg_type"] == "execute_result"]
    assert shown == ["{'rank': 0, 'world': '2'}"]
    assert kernel.value("'_accelerate_cell_value_' in globals()") is False
    result = kernel.ok("%%accelerate -n 2\nprint('only printed')")
    assert not [m for m in result.outputs if m["msg_type"] == "execute_result"]
    result = kernel.ok("%%accelerate -n 2\n__import__('threading').Lock()")
    assert "the cell's value (TypeError: cannot pickle '_thread.lock' object)" in result.stderr
