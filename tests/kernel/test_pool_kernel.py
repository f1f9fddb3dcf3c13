"""WorkerPool in a real Jupyter kernel: the stop button, and a kernel that dies."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest

from tests.kernel_harness import Kernel, wait_no_workers, worker_processes

pytestmark = pytest.mark.slow


def test_the_stop_button_interrupts_every_rank_and_the_pool_keeps_its_state(fresh_kernel):
    k = fresh_kernel
    k.ok(textwrap.dedent("""
        from notebook_accel import WorkerPool
        pool = WorkerPool(num_processes=2, return_all=True)
        def work():
            import time
            global answer, stopped_at
            answer = 42
            print("started", flush=True)
            try:
                time.sleep(60)
            except KeyboardInterrupt:
                stopped_at = time.time()
                raise
        def look():
            import os
            return answer, stopped_at, os.getpid()
        pids = [info.pid for info in pool.status()]
    """))
    msg_id = k.execute("pool.run(work)")
    pressed = {}

    def on_output(result):
        if result.stdout.count("started") == 2 and "t" not in pressed:
            pressed["t"], pressed["wall"] = time.monotonic(), time.time()
            k.manager.interrupt_kernel()

    result = k.collect(msg_id, timeout=60, on_output=on_output)
    assert "t" in pressed, result
    assert time.monotonic() - pressed["t"] < 3
    assert result.error is not None and result.error["ename"] == "LaunchInterrupted"
    assert result.error["traceback"] == [
        "KeyboardInterrupt: interrupted the run on 2 ranks at the same point; the pool keeps "
        "its state"]
    looks = k.value("pool.run(look)")
    assert [answer for answer, _, _ in looks] == [42, 42]
    assert all(at - pressed["wall"] < 0.5 for _, at, _ in looks), looks  # each rank's interrupt
    assert [pid for _, _, pid in looks] == k.value("pids")
    k.ok("pool.close()")
    assert not wait_no_workers(timeout=5)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_killed_kernel_takes_its_pool_along(method):
    k = Kernel()
    try:
        k.ok(f"from notebook_accel import WorkerPool\npool = WorkerPool(num_processes=2, "
             f"start_method={method!r})")
        assert len(worker_processes()) == 2
        os.kill(k.pid, signal.SIGKILL)
        left = wait_no_workers(timeout=15)  # the promise: gone within 15 s
    finally:
        k.shutdown()
    assert not left, (method, left)


def test_rich_output_bars_and_the_live_view_are_a_launchs_on_the_pool(fresh_kernel):
    from tests.kernel.test_rich_output_kernel import SETUP, every_iopub_message, sender_pid

    k = fresh_kernel
    k.ok(SETUP)
    k.ok("from notebook_accel import WorkerPool\npool = WorkerPool(num_processes=2)")
    for _ in range(2):  # the second run on the same workers behaves the same
        msg_id = k.execute("print('result', pool.run(job))")
        msgs = every_iopub_message(k, msg_id)
        assert {sender_pid(m) for m in msgs} == {k.pid}
        mine = [m for m in msgs if m["parent_header"].get("msg_id") == msg_id]
        displays = [m["content"]["data"] for m in mine if m["msg_type"] == "display_data"]
        assert [d["text/html"] for d in displays
                if "rich from" in d.get("text/html", "")] == ["<b>rich from rank 0</b>"]
        assert any("image/png" in d for d in displays)
        text = "".join(m["content"]["text"] for m in mine if m["msg_type"] == "stream")
        assert "result 0" in text and "[rank 0] after 0" in text and "[rank 1] after 1" in text
        live = [m["content"]["data"]["text/html"] for m in mine
                if m["msg_type"] in ("display_data", "update_display_data")
                and "notebook-accel-live" in m["content"]["data"].get("text/html", "")]
        assert any("steps" in block for block in live)  # tqdm.auto became the run's bar
    k.ok("pool.close()")
    assert not wait_no_workers(timeout=5)


def test_a_restarted_kernel_leaves_no_pool_behind():
    k = Kernel()
    try:
        k.ok("%load_ext notebook_accel\n%accelerate start -n 2")
        assert len(worker_processes()) == 2
        k.manager.restart_kernel(now=False)  # the notebook's "Restart kernel"
        left = wait_no_workers(timeout=15)
    finally:
        k.shutdown()
    assert not left, left


POOL_TRAINING = """%%accelerate --no-pull
import torch
from notebook_accel import Accelerator
acc = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = acc.prepare(model, opt)
data = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
steps = 0
"""
POOL_STEPS = """%%accelerate --no-pull
print("training", flush=True)
while True:
    index = (torch.arange(4) + steps * 8 + acc.process_index * 4) % 64
    opt.zero_grad()
    acc.backward(model(data[index]).pow(2).mean())
    opt.step()
    steps += 1
"""
POOL_LOOK = """%%accelerate --no-pull
import os
import torch.distributed as dist
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
w = sum(p.detach().sum().item() for p in acc.unwrap_model(model).parameters())
print("look", os.getpid(), id(model), steps, t.item(), repr(w))
"""


def test_the_stop_button_on_training_pool_cells_keeps_every_ranks_state(fresh_kernel):
    """Issue 30 in a real kernel: %%accelerate cells training DDP on the pool, the Jupyter
    interrupt at random moments; every time the same workers keep the same objects, both ranks
    at the same step with equal weights, and all_reduce right."""
    import random

    k = fresh_kernel
    k.ok("%load_ext notebook_accel")
    k.ok("%accelerate start -n 2 --stop-wait 3")
    assert "--stop-wait sets the notebook's pool" in k.run("%%accelerate --stop-wait 2\nx = 1").stderr
    k.ok(POOL_TRAINING)
    rng, first = random.Random(30), None
    for _ in range(5):
        msg_id = k.execute(POOL_STEPS)
        pressed: list[float] = []

        def on_output(result, pressed=pressed):
            if "training" in result.stdout and not pressed:
                time.sleep(rng.uniform(0.05, 0.5))
                pressed.append(time.monotonic())
                k.manager.interrupt_kernel()

        result = k.collect(msg_id, timeout=60, on_output=on_output)
        assert pressed and result.error is not None, result
        assert result.error["traceback"] == [
            "KeyboardInterrupt: interrupted the run on 2 ranks at the same point; the pool keeps "
            "its state"], result.error
        assert time.monotonic() - pressed[0] < 2.0
        looks = sorted(line.split()[3:] for line in k.ok(POOL_LOOK).stdout.splitlines()
                       if " look " in line)
        assert len(looks) == 2 and looks[0][2:] == looks[1][2:], looks  # steps, sum, weights
        assert looks[0][3] == "3.0"
        if first is None:
            first = [look[:2] for look in looks]
        assert [look[:2] for look in looks] == first  # the same processes and objects
    k.ok("%accelerate stop")
    assert not wait_no_workers(timeout=5)
