"""A detached pool's run outlives the kernel that started it: kernel A starts the pool and a
background cell, and is SIGKILLed mid-run; kernel B attaches (within 3 s), sees every numbered
line exactly once and the run's names, lists and stops the pool; nothing is left running.
Interrupting B's watch stops the watch, not the run (two real kernels)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time

import psutil
import pytest

from notebook_accel.launch.detached.client import detached_pools
from tests.kernel_harness import Kernel

pytestmark = pytest.mark.slow

STEPS = 60


@pytest.fixture
def runtime_dir(monkeypatch):
    """A runtime directory of the test's own (short: a socket's path has 108 bytes); the
    kernels started in the test inherit it."""
    base = tempfile.mkdtemp(prefix="na-run-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", base)
    yield base
    for info in detached_pools():  # a failed test's keeper: ended, not left behind
        os.kill(info["pid"], signal.SIGTERM)
    shutil.rmtree(base, ignore_errors=True)


def _gone(pids: list[int], seconds: float = 30) -> list[int]:
    deadline = time.monotonic() + seconds
    while True:
        left = [pid for pid in pids if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_a_detached_run_outlives_a_killed_kernel_and_another_kernel_sees_every_line_once(runtime_dir):
    a = Kernel()
    try:
        a.ok("%load_ext notebook_accel")
        started = a.ok("%accelerate start -n 2 --detach --name exp1", timeout=180)
        assert "detached pool 'exp1'" in started.stdout and "%accelerate attach exp1" in started.stdout
        (info,) = detached_pools()
        keeper = psutil.Process(info["pid"])
        assert keeper.ppid() != a.pid and os.getsid(keeper.pid) != os.getsid(a.pid)
        pids = [keeper.pid, *(child.pid for child in keeper.children(recursive=True))]
        cell = a.ok(f"""%%accelerate --background
import time
for step in range({STEPS}):
    print(f"numbered {{step}}", flush=True)
    time.sleep(0.2)
trained = {STEPS}
""")
        assert "runs in the background on detached pool 'exp1'" in cell.stdout + cell.stderr
        time.sleep(1.5)  # some lines printed while A lives, the rest after it died
        os.kill(a.pid, signal.SIGKILL)
    finally:
        a.shutdown()

    b = Kernel()
    try:
        b.ok("%load_ext notebook_accel")
        attached = b.ok("%accelerate attach")
        assert attached.elapsed < 3, attached.elapsed
        assert "attached to detached pool 'exp1': 2 ranks on cpu; running cell [" in attached.stdout, \
            attached.stdout
        listed = b.ok("%accelerate pools").stdout
        assert listed.startswith("exp1: 2/2 ranks on cpu, running cell ["), listed

        pressed: list[bool] = []

        def press_stop_once(result):
            if "numbered 3\n" in result.stdout and not pressed:
                pressed.append(True)
                b.manager.interrupt_kernel()

        first = b.collect(b.execute("%accelerate watch"), timeout=60, on_output=press_stop_once)
        assert pressed and first.error is None, first  # the stop button stopped the watch...
        assert "stopped watching cell [" in first.stderr and "it runs on" in first.stderr, first.stderr
        assert b.value("__import__('magics.pool').pool.current().background.done()") is False

        watched = b.ok("%accelerate watch", timeout=120)  # from its first line, then live, to its end
        for rank in (0, 1):
            counts = [watched.stdout.count(f"[rank {rank}] numbered {i}\n") for i in range(STEPS)]
            assert counts == [1] * STEPS, (rank, counts, watched.stdout)
        assert b.value("__import__('magics.pool').pool.current().background.state()") == "finished"
        b.ok("%%accelerate\nresult = trained")  # the run's names, on the keeper's workers
        assert b.value("result") == STEPS
        status = b.ok("%accelerate status").stdout
        assert "detached pool 'exp1'" in status and "trained" in status, status
        refused = b.run("%accelerate stop nosuch")
        assert "UsageError: no detached pool named 'nosuch' is up (up: 'exp1')" in refused.stderr, \
            refused.stderr
        b.ok("%accelerate stop exp1")
        assert detached_pools() == [] and _gone(pids) == []
        assert "no detached pool is up" in b.ok("%accelerate pools").stdout
    finally:
        b.shutdown()
