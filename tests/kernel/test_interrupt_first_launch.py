"""The stop button during a kernel's first launch never breaks the kernel (real kernels).

A first launch imports torch, ``torch._dynamo`` and sympy lazily; an interrupt
landing inside one of those imports used to leave half-initialised modules
behind, and every later launch failed until the kernel was restarted.
"""

from __future__ import annotations

import time

import pytest

from tests.kernel_harness import Kernel, wait_no_workers

JOB = """
from notebook_accel import notebook_launcher
def job():
    import torch
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # imports torch._dynamo
    return torch.ones(1) * 7
"""
AFTERWARDS = """
import sympy, torch
print(notebook_launcher(job, num_processes=2).tolist())
print(type(sympy.core).__name__, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1).__class__.__name__)
"""
POINTS = [round(0.07 * i, 2) for i in range(22)]  # 0 .. 1.47 s into the first launch


@pytest.mark.slow
def test_interrupting_the_first_launch_anywhere_leaves_the_kernel_working():
    outcomes, failures = [], []
    for delay in POINTS:
        k = Kernel()
        try:
            k.ok(JOB)
            msg_id = k.execute("notebook_launcher(job, num_processes=2)")
            time.sleep(delay)
            k.manager.interrupt_kernel()
            first = k.collect(msg_id, timeout=120)
            outcome = first.error["ename"] if first.error else "finished"
            if first.error and len(first.error["traceback"]) != 1:
                failures.append((delay, "traceback of the interrupt", first.traceback[:6000]))
            after = k.run(AFTERWARDS, timeout=120)
            if after.error or "[7.0]" not in after.stdout or "module SGD" not in after.stdout:
                failures.append((delay, outcome, after.traceback[-2000:] + after.stdout))
            outcomes.append((delay, outcome))
        finally:
            k.shutdown()
        assert not wait_no_workers(timeout=5), f"workers left after the interrupt at {delay} s"
    interrupted = [d for d, outcome in outcomes if outcome == "LaunchInterrupted"]
    print(f"interrupt sweep: {len(POINTS)} points, {len(interrupted)} interrupted, "
          f"{len(failures)} failures")
    assert not failures, "\n\n".join(f"at {delay} s, {what}:\n{text}" for delay, what, text in failures)
    assert len(interrupted) >= len(POINTS) // 2, outcomes  # the sweep really hit the launch
