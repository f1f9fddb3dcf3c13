"""``%%accelerate --background`` in a real kernel: the notebook stays free while the pool
trains, nothing of the run lands in another cell, and ``%accelerate watch`` shows every line
once, then the outcome."""

from __future__ import annotations

import re

import pytest

from tests.kernel_harness import wait_no_workers

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the kernel's pool outlives each test: conftest checks for leaks per module

STEPS = 40


def test_a_background_cell_leaves_the_notebook_free_and_watch_shows_every_line_once(magic_kernel):
    k = magic_kernel
    k.ok("%accelerate start -n 2")
    started = k.ok(f"""%%accelerate --background
import time
from notebook_accel import Accelerator
accelerator = Accelerator()
for step in range({STEPS}):
    accelerator.log({{"loss": 1.0}}, step=step)
    print(f"numbered {{step}}", flush=True)
    time.sleep(0.1)
trained = True
""")
    assert started.elapsed < 5 and "runs in the background on the pool; %accelerate watch" in started.stdout
    handle = str(started.outputs[0]["content"]["data"]["text/plain"])
    assert re.match(r"<RunHandle cell \[\d+\]: running", handle), handle

    meanwhile = k.ok("print('free', 1 + 1)")  # the kernel is free: this cell runs and ends now
    assert meanwhile.stdout == "free 2\n" and meanwhile.elapsed < 2
    refused = k.run("%%accelerate\nother = 1")  # the pool is not (a usage error: no traceback)
    assert re.search(r"UsageError: the pool is running cell \[\d+\] \(\d+\.\d s(, step \d+)?\); "
                     r"%accelerate watch, or Out\[\d+\]\.cancel\(\)", refused.stderr), refused.stderr
    status = k.ok("%accelerate status").stdout
    assert "in the background: cell [" in status and "%accelerate watch shows it" in status
    for cell in (started, meanwhile, refused):  # nothing of the run printed into another cell
        assert "numbered" not in cell.stdout + cell.stderr

    pressed: list[bool] = []

    def press_stop_once(cell):
        if "numbered 3\n" in cell.stdout and not pressed:
            pressed.append(True)
            k.manager.interrupt_kernel()

    first = k.collect(k.execute("%accelerate watch"), timeout=30, on_output=press_stop_once)
    assert pressed and first.error is None, first  # the stop button stopped the watch...
    assert re.search(r"stopped watching cell \[\d+\]; it runs on", first.stderr), first.stderr
    assert k.value("Out[sorted(Out)[-1]].done()") is False  # ...not the run

    watched = k.ok("%accelerate watch", timeout=60)  # from the start again, then live, to its end
    for rank in (0, 1):
        counts = [watched.stdout.count(f"[rank {rank}] numbered {i}\n") for i in range(STEPS)]
        assert counts == [1] * STEPS, (rank, counts, watched.stdout)
    assert k.value("Out[sorted(Out)[-1]].state()") == "finished"  # the handle, as the cell's value
    k.ok("%%accelerate --no-pull\nassert trained")  # its names stayed on the workers
    k.ok("%accelerate stop")
    assert wait_no_workers() == []
