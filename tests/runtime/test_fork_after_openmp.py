"""A kernel that has run torch's CPU threads (GNU OpenMP's pool) cannot fork a worker that uses
more than one: its first parallel op would wait forever for threads that did not survive the fork.
The launch sees it (a forked probe) and starts such workers from the forkserver, saying why; a
worker with one thread is still forked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch
    from notebook_accel import notebook_launcher
    from notebook_accel.launch.planning import start_method

    def work():
        import torch
        return torch.get_num_threads(), float(torch.ones(1 << 20).sqrt().sum())

    assert not start_method.openmp_pool_started()
    torch.set_num_threads(2)
    torch.ones(1 << 22).sqrt()  # the kernel's own CPU work starts OpenMP's pool
    assert start_method.openmp_pool_started()
    assert start_method.choose_start_method("auto", lambda: 1).method == "fork"
    choice = start_method.choose_start_method("auto", lambda: 2)
    assert choice.method == "forkserver" and "OpenMP" in choice.reason, choice
    print("RESULT", notebook_launcher(work, num_processes=1, start_method="auto"))
""")


def test_a_kernel_whose_openmp_pool_started_starts_multithreaded_workers_from_the_forkserver():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "2"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "RESULT (2, 1048576.0)" in run.stdout
    assert "OpenMP" in run.stdout + run.stderr  # the starting line says why
