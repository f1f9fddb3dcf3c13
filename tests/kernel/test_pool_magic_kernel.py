"""``%accelerate start|status|restart|stop`` and ``%%accelerate`` cells on the pool, in a real kernel."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.kernel_harness import wait_no_workers

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the kernel's pool outlives each test: conftest checks for leaks per module


@pytest.fixture(scope="module")
def k(magic_kernel):
    return magic_kernel


def test_status_without_a_pool_says_how_to_start_one(k):
    assert "no pool is up; %accelerate start -n N" in k.ok("%accelerate status").stdout
    assert "UsageError: no pool is up" in k.run("%accelerate stop").stderr


def test_cells_on_the_pool_keep_their_state(k):
    assert "pool up: 2 ranks on cpu" in k.ok("%accelerate start -n 2").stdout
    k.ok("""%%accelerate
import torch
from notebook_accel import Accelerator
accelerator = Accelerator()
torch.manual_seed(0)
model = accelerator.prepare(torch.nn.Linear(2, 1))
steps = 0
""")
    assert k.value("type(model).__name__") == "Linear"  # rank 0's unwrapped copy came back
    again = k.ok("""%%accelerate
steps += 1
type(model).__name__
""")
    # the workers' own model (the prepared one) was used, not the notebook's copy
    assert "'DistributedDataParallel'" in str(again.outputs)
    assert k.value("steps") == 1


def test_notebook_copies_never_replace_worker_names(k):
    k.ok("lr = 0.5")
    k.ok("%%accelerate\nlr2 = lr * 2")
    k.ok("lr = 0.25\nsteps = 100")  # neither replaces the workers' (said, on stderr)
    kept = k.ok("%%accelerate\nlr3 = lr * 2\nsteps += 1")
    assert "the workers keep their own lr, steps" in kept.stderr
    assert k.value("(lr2, lr3, steps)") == (1.0, 1.0, 2)


def test_a_function_from_one_cell_sees_names_of_later_cells(k):
    k.ok("%%accelerate\nlater = 0\ndef read_later():\n    return later")
    k.ok("%%accelerate\nlater = 7\nseen = read_later()")
    assert k.value("seen") == 7


def test_status_lists_ranks_pids_memory_and_names(k):
    out = k.ok("%accelerate status").stdout
    assert "rank 0: pid" in out and "rank 1: pid" in out and "alive, memory" in out
    names = out.split("names on the workers: ")[1]
    for name in ("accelerator", "model", "steps", "later"):
        assert name in names


def test_a_failing_cell_names_its_rank_and_the_pool_stays(k):
    result = k.run("""%%accelerate
import torch.distributed as dist
if dist.get_rank() == 1:
    raise ValueError("only rank 1 fails")
""")
    assert result.error is not None and "rank 1 failed: ValueError: only rank 1 fails" in result.error["evalue"]
    # the cell's own line, quoted: its source reached the workers (each cell's is sent once)
    assert 'raise ValueError("only rank 1 fails")' in "\n".join(result.error["traceback"])
    k.ok("%%accelerate\nsteps += 1")
    assert k.value("steps") == 3


def test_flags_on_a_pool_cell_are_refused_and_fresh_runs_apart(k):
    refused = k.run("%%accelerate -n 1\nx = 1")
    assert "UsageError: --num-processes: this cell would run on the pool" in refused.stderr
    assert "--fresh" in refused.stderr
    k.ok("%%accelerate\nimport os\npool_pid = os.getpid()")
    k.ok("%%accelerate --fresh -n 2\nimport os\nfresh_pid = os.getpid()\nfresh_steps = steps")
    assert k.value("pool_pid != fresh_pid")
    assert k.value("fresh_steps") == 3  # the notebook's, shipped as for any fresh cell


def test_a_cell_on_a_pool_whose_worker_is_gone_heals_it_and_says_what_it_did(k):
    status = k.ok("%accelerate status").stdout
    pid = int(status.split("rank 1: pid ")[1].split(",")[0])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while "gone (exit code" not in k.ok("%accelerate status").stdout and time.monotonic() < deadline:
        time.sleep(0.1)
    result = k.ok("%%accelerate\nsteps += 1")
    assert "rank 1 was killed by SIGKILL while idle. The pool healed: rank 1 was replaced" \
        in result.stdout
    assert "rebuilt for the new group: accelerator, model" in result.stdout
    assert k.value("steps") == 4  # the workers' own (3), copied to the new rank 1, plus one


def test_restart_and_stop(k):
    out = k.ok("%accelerate restart").stdout
    # the heal above kept every name: a restart drops them all (the notebook keeps its copies)
    assert "pool restarted: 2 fresh ranks; names dropped: accelerator, later, lr, lr2, lr3, " \
        "model, pool_pid, read_later, seen, steps" in out, out
    assert k.run("%%accelerate\nsteps += 1").error is None  # the notebook's steps shipped again
    assert "pool stopped" in k.ok("%accelerate stop").stdout
    assert not wait_no_workers(timeout=5)


def test_restart_with_launch_flags_applies_them_and_other_commands_refuse_flags_by_name(k):
    k.ok("%accelerate start -n 2 --stop-wait 3")
    k.ok("%%accelerate\nsteps = 1")
    out = k.ok("%accelerate restart -n 3 --hang-after 7").stdout
    assert "pool restarted with new --num-processes, --hang-after: 3 ranks on cpu" in out, out
    assert "names dropped: steps" in out
    plan = "__import__('magics.pool').pool.current().plan"
    assert k.value(f"({plan}.world_size, {plan}.hang_after, {plan}.stop_wait)") == (3, 7.0, 3.0)
    ranks = k.ok("%%accelerate\nimport torch.distributed as dist\nprint('world', dist.get_world_size())")
    assert ranks.stdout.count("world 3") == 3, ranks.stdout
    bad = k.run("%accelerate restart --mixed-precision fp17")  # refused while the pool is up
    assert "UsageError" in bad.stderr and "fp17" in bad.stderr
    assert k.value(f"{plan}.world_size") == 3
    for line, flag in (("status -n 2", "--num-processes"), ("stacks --hang-after 1", "--hang-after"),
                       ("stop --fresh", "--fresh"), ("env -n 2", "--num-processes")):
        refused = k.run(f"%accelerate {line}")
        assert f"UsageError: %accelerate {line.split()[0]} does not use {flag}" in refused.stderr, \
            refused.stderr
    gone = k.run("%accelerate restart --device cuda")  # refused only by the plan: said so
    assert "the pool was stopped to restart it, so none is up now" in gone.stderr, gone.stderr
    assert "no pool is up" in k.ok("%accelerate status").stdout
    assert not wait_no_workers(timeout=5)


def test_underscore_names_and_iterators_stay_on_rank_0_without_a_word(k):
    k.ok("_ = 'the notebook s own'")  # as IPython's last value would be
    result = k.ok("""%%accelerate -n 2
for _ in range(3):
    pass
_private = 1
it = iter(range(3))
numbers = (i for i in range(3))
kept = 5
""")
    assert "not brought back" not in result.stdout + result.stderr, result.stderr
    assert "back from rank 0: kept" in result.stdout
    assert k.value("(_, 'it' in dir(), 'numbers' in dir(), '_private' in dir(), kept)") == (
        "the notebook s own", False, False, False, 5)
    status = k.ok("%accelerate status").stdout
    assert ("left on rank 0, not brought back: _ (an underscore name, cell [") in status, status
    for said in ("_private (an underscore name", "it (an iterator", "numbers (a generator"):
        assert said in status, status
    asked = k.run("%%accelerate -n 2 --pull numbers\nnumbers = (i for i in range(3))")
    assert "not brought back from rank 0: numbers (TypeError: cannot pickle 'generator'" in \
        asked.stderr, asked.stderr  # named with --pull: tried, and what failed is said


def test_a_stopped_cell_says_which_names_it_did_not_bring_back(k):
    k.ok("%accelerate start -n 2")
    k.ok("%%accelerate\nstep = 200")
    msg_id = k.execute("""%%accelerate
import time
for step in range(200, 100000):
    if step == 280:
        print("at 280", flush=True)
    time.sleep(0.01)
""")

    def on_output(result):
        if result.stdout.count("at 280") == 2 and not on_output.pressed:
            on_output.pressed = True
            k.manager.interrupt_kernel()

    on_output.pressed = False
    result = k.collect(msg_id, timeout=60, on_output=on_output)
    assert result.error is not None, result
    assert result.error["traceback"] == [
        "KeyboardInterrupt: interrupted the run on 2 ranks at the same point; the pool keeps its "
        "state; not brought back to the notebook: step (the notebook's step is older than the "
        "workers')"], result.error
    assert k.value("step") == 200  # the notebook's own, as said
    k.ok("%accelerate stop")
    assert not wait_no_workers(timeout=5)
