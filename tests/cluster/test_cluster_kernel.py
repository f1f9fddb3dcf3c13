"""A real Jupyter kernel drives both nodes: the pool magic and cells on the cluster, the stop button."""

from __future__ import annotations

import re
import time

import psutil
import pytest

from tests.kernel_harness import Kernel

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the cluster and the kernel live for the whole module


@pytest.fixture(scope="module")
def k(cluster):
    kernel = Kernel()
    kernel.ok("%load_ext notebook_accel")
    kernel.ok(f"ADDRESS = {cluster.address!r}")
    yield kernel
    kernel.ok("from notebook_accel.launch.cluster import placement; placement.disconnect()")
    kernel.shutdown()


def test_a_pool_across_both_nodes_from_the_magic(k, cluster):
    started = k.ok(f"%accelerate start -n 1 --nodes 2 --cluster {cluster.address}", timeout=180)
    assert "pool up: 2 ranks" in started.stdout, started.stdout + started.stderr
    k.ok("%%accelerate\nimport os, torch, torch.distributed as dist\n"
         "total = torch.tensor([float(os.environ['RANK']) + 1])\ndist.all_reduce(total)\n"
         "node = os.environ['NODE_RANK']")
    assert k.value("(total.item(), node)") == (3.0, "0")  # rank 0's names came back
    lines = k.ok("%%accelerate\nprint('hello from', os.environ['RANK'])").stdout
    assert "[node 0 rank 0] hello from 0" in lines and "[node 1 rank 1] hello from 1" in lines
    k.ok("%accelerate stop")


def test_the_stop_button_stops_both_nodes_and_keeps_the_kernels_handler(k):
    before = k.value("repr(__import__('signal').getsignal(__import__('signal').SIGINT))")
    k.ok("""
def wait_in_a_collective():
    import os, time, torch, torch.distributed as dist
    print(f"pid={os.getpid()}", flush=True)
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))
    time.sleep(60)
""")
    pids: list[int] = []
    msg_id = k.execute("from notebook_accel import notebook_launcher\n"
                       "notebook_launcher(wait_in_a_collective, num_processes=1, num_nodes=2, "
                       "cluster=ADDRESS)")
    pressed: list[float] = []

    def on_output(result) -> None:
        pids[:] = [int(p) for p in re.findall(r"pid=(\d+)", result.stdout)]
        if len(pids) == 2 and not pressed:
            time.sleep(0.5)
            pressed.append(time.monotonic())
            k.manager.interrupt_kernel()

    result = k.collect(msg_id, timeout=120, on_output=on_output)
    took = time.monotonic() - pressed[0]
    assert result.error is not None and result.error["ename"] == "LaunchInterrupted", result  # a KeyboardInterrupt
    assert took < 2.0, f"{took:.2f} s from the interrupt to the cell's end"
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    assert k.value("repr(__import__('signal').getsignal(__import__('signal').SIGINT))") == before
