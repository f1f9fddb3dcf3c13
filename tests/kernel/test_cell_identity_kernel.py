"""A cell never runs with another rank's identity (issue 36), in a real kernel with numbered
cells: what ``%%accelerate`` sends to the workers and brings back is safe, visible and current.

The tests run in order on one kernel and one pool, as a user's notebook does: the training cell,
the stop button inside a collective, the cells after it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.kernel_harness import Kernel, wait_no_workers

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the kernel's pool outlives each test: conftest checks for leaks per module

TRAIN_SETUP = """%%accelerate
import time
import torch
import torch.distributed as dist
from notebook_accel import Accelerator
accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.arange(16.0).reshape(8, 2), batch_size=2)
model, opt, loader = accelerator.prepare(model, opt, loader)
"""
TRAIN = """%%accelerate
for batch in loader:
    loss = model(batch).pow(2).mean()
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
print("rank", accelerator.process_index, "main:", accelerator.is_main_process,
      "first batch", next(iter(loader)).tolist())
"""
REDUCE = """%%accelerate
t = torch.tensor([accelerator.process_index + 1.0])
dist.all_reduce(t)
print("process_index", accelerator.process_index, "sum:", t.item())
"""


@pytest.fixture(scope="module")
def k(module_config_dirs):
    kernel = Kernel(history=True)
    kernel.ok("%load_ext notebook_accel")
    yield kernel
    kernel.shutdown()


def _interrupt_inside_a_collective(k: Kernel) -> object:
    """Rank 0 waits in an all_reduce that rank 1 (asleep) never joins; press stop."""
    msg_id = k.execute("""%%accelerate
if accelerator.process_index == 1:
    time.sleep(30)
print("waiting in all_reduce", flush=True)
dist.all_reduce(torch.ones(1))
""")
    pressed = []

    def on_output(result):
        if "waiting in all_reduce" in result.stdout and not pressed:
            pressed.append(time.monotonic())
            time.sleep(0.3)  # rank 0 is inside the collective now
            k.manager.interrupt_kernel()

    result = k.collect(msg_id, timeout=60, on_output=on_output)
    assert pressed, result
    return result


CELLS = {}


def test_step_1_a_training_cell_says_what_came_back_from_rank_0(k):
    # --no-heal: these steps follow a pool whose workers were all replaced (with the heal, the
    # rank the stop ended is healed instead: tests/runtime/test_pool_heal.py)
    k.ok("%accelerate start -n 2 --no-heal")
    CELLS["build"] = k.value("get_ipython().execution_count")  # the next cell's number
    out = k.ok(TRAIN_SETUP).stdout
    line = next(line for line in out.splitlines() if "back from rank 0" in line)
    assert "accelerator, model, opt, loader" in line, line
    assert "copies: the live objects stay on the workers" in line
    assert "accelerator, opt, loader: rank 0's, to look at here; never sent to the workers" in line
    assert "torch" not in line.split("back from rank 0: ")[1].split(" (")[0]  # modules unnamed
    first = k.ok(TRAIN).stdout
    assert "[rank 0] rank 0 main: True" in first and "[rank 1] rank 1 main: False" in first


def test_step_2_the_stop_button_inside_a_collective_replaces_the_workers_and_says_so(k):
    result = _interrupt_inside_a_collective(k)
    assert result.error is not None and result.error["ename"] == "LaunchInterrupted"
    # rank 1 sleeps 30 s before the collective: no common point within stop_wait, so every
    # rank is stopped at once, and rank 0, inside the all_reduce, is ended
    assert result.error["evalue"] == (
        "interrupted the run (ranks 0, 1 did not reach the common stopping point within 5 s (stop_wait), so "
        "every rank was stopped at once); rank 0 was ended; what the pool did then is said above")
    said = result.stderr
    # what we did comes first, in our words; no SIGKILL reported as if it came from outside
    assert ("the pool's workers were replaced (rank 0 did not stop within 1.5 s of the "
            "interrupt") in said, said
    assert "so we ended it" in said and "SIGKILL" not in said
    lost = said.split("their state was lost: ")[1].splitlines()[0]
    assert set(lost.split(", ")) == {"accelerator", "batch", "loader", "loss", "model", "opt"}, lost  # no torch, time, Accelerator
    status = k.ok("%accelerate status").stdout
    assert "names on the workers: (none yet)" in status
    snapshots = status.split("snapshots, not live): ")[1]
    for name in ("accelerator (cell [", "model (cell [", "opt (cell [", "loader (cell ["):
        assert name in snapshots, status
    assert "torch (cell" not in snapshots


def test_step_3_rank_0s_accelerator_is_never_sent_to_every_rank(k):
    build_cell = CELLS["build"]
    result = k.run(REDUCE)
    assert result.error is not None and result.error["ename"] == "UnshippableNamesError"
    message = result.error["evalue"]
    assert "accelerator: rank 0's copy of an Accelerator, brought back by cell " \
        f"[{build_cell}]" in message, message
    assert f"run the cell that builds it (In [{build_cell}]) again" in message
    assert "no worker was started" in message
    assert "process_index" not in result.stdout  # nothing ran


def test_step_4_the_training_cell_is_refused_instead_of_training_rank_0s_snapshot(k):
    result = k.run(TRAIN)
    assert result.error is not None and result.error["ename"] == "UnshippableNamesError"
    message = result.error["evalue"]
    for name, kind in (("accelerator", "an Accelerator"), ("opt", "a prepared optimizer"),
                       ("loader", "a prepared data loader")):
        assert f"{name}: rank 0's copy of {kind}" in message, message
    assert "main: True" not in result.stdout


def test_step_5_fresh_cells_refuse_it_too_and_build_their_own(k):
    refused = k.run("%%accelerate --fresh -n 2\nprint(accelerator.process_index)")
    assert refused.error is not None and "rank 0's copy of an Accelerator" in refused.error["evalue"]
    out = k.ok("""%%accelerate --fresh -n 2
import torch
import torch.distributed as dist
from notebook_accel import Accelerator
mine = Accelerator()
t = torch.tensor([mine.process_index + 1.0])
dist.all_reduce(t)
print("process_index", mine.process_index, "sum:", t.item())
""").stdout
    assert "[rank 0] process_index 0 sum: 3.0" in out and "[rank 1] process_index 1 sum: 3.0" in out


def test_after_rebuilding_on_the_new_workers_each_rank_is_itself_again(k):
    k.ok(TRAIN_SETUP)
    out = k.ok(REDUCE).stdout
    assert "[rank 0] process_index 0 sum: 3.0" in out and "[rank 1] process_index 1 sum: 3.0" in out
    trained = k.ok(TRAIN).stdout
    assert "[rank 0] rank 0 main: True first batch [[0.0, 1.0], [2.0, 3.0]]" in trained
    assert "[rank 1] rank 1 main: False first batch [[4.0, 5.0], [6.0, 7.0]]" in trained


def test_a_name_sent_from_the_notebook_stays_on_the_workers_with_their_changes(k):
    k.ok("import torch\nw = torch.zeros(1)")
    first = k.ok("%%accelerate --no-pull\nw.add_(1.0)\nprint('w', w.item())")
    assert "[notebook_accel] sent from the notebook: w" in first.stdout
    again = k.ok("%%accelerate --no-pull\nw.add_(1.0)\nprint('w', w.item())").stdout
    assert "[rank 0] w 2.0" in again and "[rank 1] w 2.0" in again  # not undone by the notebook's
    assert "sent from the notebook" not in again
    assert k.value("w.item()") == 0.0  # the notebook's own, untouched
    status = k.ok("%accelerate status").stdout
    workers = status.split("names on the workers: ")[1]
    assert "w" in workers.split("\n")[0].split(", ")
    assert "the notebook's copies (sent, not assigned on the workers): w (cell [" in status


def test_a_changed_notebook_value_is_kept_off_the_workers_and_said_push_sends_it(k):
    k.ok("lr = 0.5")
    k.ok("%%accelerate\nlr2 = lr * 2")
    k.ok("lr = 0.25")
    kept = k.ok("%%accelerate\nlr3 = lr * 2")
    assert "the workers keep their own lr (the notebook's differs" in kept.stderr
    assert "--push lr" in kept.stderr
    assert k.value("(lr2, lr3)") == (1.0, 1.0)
    pushed = k.ok("%%accelerate --push lr\nlr4 = lr * 2")
    assert "lr (replacing the workers')" in pushed.stdout
    assert k.value("lr4") == 0.5


def test_a_function_redefined_in_the_notebook_is_sent_again_and_said(k):
    k.ok("def scale(x):\n    return x * 2")
    k.ok("%%accelerate\ns1 = scale(1)")
    k.ok("def scale(x):\n    return x * 3")
    again = k.ok("%%accelerate\ns2 = scale(1)")
    assert "scale (redefined in the notebook)" in again.stdout
    assert k.value("(s1, s2)") == (2, 3)


def test_after_a_pool_cell_trains_the_notebooks_model_is_a_named_snapshot(k):
    before = k.value("model.weight.detach().flatten().tolist()")
    out = k.ok(TRAIN).stdout
    assert "back from rank 0: batch, loss (" in out  # what the cell assigned; model is not
    assert k.value("model.weight.detach().flatten().tolist()") == before  # a stale snapshot...
    status = k.ok("%accelerate status").stdout
    assert "model (cell [" in status.split("snapshots, not live): ")[1]  # ...and said to be one
    live = k.ok("%%accelerate\nweights = accelerator.unwrap_model(model).weight.detach().flatten().tolist()")
    assert "back from rank 0: weights" in live.stdout
    assert k.value("weights") != before


def test_pool_and_fresh_cells_see_the_same_world(k):
    code = "import torch.distributed as dist\nprint('group', dist.is_initialized(), dist.get_world_size())"
    assert "[rank 1] group True 2" in k.ok("%%accelerate\n" + code).stdout
    assert "[rank 1] group True 2" in k.ok("%%accelerate --fresh -n 2\n" + code).stdout


def test_a_worker_killed_while_idle_follows_the_same_rule_as_mid_run(k):
    """Without the heal (this module's pool: --no-heal), a worker gone while idle costs every
    rank's state, as one gone mid-run (the heal: tests/kernel/test_pool_heal_kernel.py)."""
    k.ok("%%accelerate --no-pull\nkept = 1")
    status = k.ok("%accelerate status").stdout
    pid = int(status.split("rank 1: pid ")[1].split(",")[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while "gone (exit code" not in status and time.monotonic() < deadline:
        time.sleep(0.1)
        status = k.ok("%accelerate status").stdout
    # status is truthful: no names are listed as living on workers that are gone
    assert "names on the workers: none: rank 1 is gone, so the workers' state is lost (" in status
    assert "kept" in status.split("state is lost (")[1] and "the next cell replaces" in status
    result = k.ok("%%accelerate\nimport os\nprint('pid', os.getpid())")
    assert "the pool's workers were replaced (rank 1 was killed by SIGKILL while idle" in result.stderr
    assert "kept" in result.stderr.split("their state was lost: ")[1]
    assert "[rank 1] pid" in result.stdout and f"pid {pid}" not in result.stdout
    assert "names on the workers: none:" not in k.ok("%accelerate status").stdout
    k.ok("%accelerate stop")
    assert not wait_no_workers(timeout=5)


def test_notebook_launcher_refuses_a_kernel_accelerator_naming_its_path(k):
    result = k.run("""from notebook_accel import Accelerator, notebook_launcher
here = Accelerator()
def use(config):
    return config["acc"].process_index
notebook_launcher(use, args=({"acc": here},), num_processes=2)""")
    assert result.error is not None and result.error["ename"] == "TypeError"
    assert "cannot send args[0]['acc'] to the workers: it is an Accelerator, which belongs to " \
        "one process" in result.error["evalue"], result.error["evalue"]
