"""Scripts using our Accelerator end cleanly under torchrun, even on a busy machine.

torch's gloo worker threads can race interpreter finalisation and abort a finished
rank ("terminate called without an active exception"); ``notebook_accel.runtime.exit_teardown``
closes that race. See docs/torch_gloo_exit_abort.md.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime_support import run_torchrun

SCRIPT = Path(__file__).parents[1] / "runtime_scripts" / "exit_checks.py"
ABORT_MESSAGE = "terminate called without an active exception"


@pytest.fixture
def busy_cores() -> Iterator[None]:
    """Keep both cores busy with two spinning processes while the test runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


def test_user_atexit_handlers_and_buffered_output_survive_the_teardown():
    returncode, output = run_torchrun([str(SCRIPT), "atexit"])
    assert returncode == 0, output[-4000:]
    for rank in (0, 1):
        assert f"unflushed tail of rank {rank}" in output
        assert f"user atexit ran on rank {rank}" in output


def test_a_failing_rank_still_fails_the_job_promptly_with_its_traceback():
    start = time.monotonic()
    returncode, output = run_torchrun([str(SCRIPT), "raise"], timeout=90)
    assert returncode not in (0, None), output[-4000:]
    assert "RuntimeError: rank 1 failed on purpose" in output
    assert time.monotonic() - start < 60, "the teardown must not wait on a rank that died"


@pytest.mark.slow
@pytest.mark.timeout(900)  # 20 launches on deliberately overloaded cores
def test_twenty_torchrun_runs_on_busy_cores_all_exit_zero(busy_cores):
    """Four torchruns at a time beside the spinners: the cores are busier than with one at a
    time (what makes the race likely), and the 20 runs end sooner (about 2 min, not 3.7)."""
    def run(number: int) -> str | None:
        returncode, output = run_torchrun([str(SCRIPT), "train"], timeout=200)
        if returncode == 0:
            return None
        aborted = ABORT_MESSAGE in output
        return f"run {number}: exit {returncode}{' (gloo exit abort)' if aborted else ''}\n{output[-1500:]}"

    with concurrent.futures.ThreadPoolExecutor(4) as runs:
        failures = [failure for failure in runs.map(run, range(20)) if failure is not None]
    assert not failures, f"{len(failures)}/20 runs failed:\n" + "\n".join(failures)
