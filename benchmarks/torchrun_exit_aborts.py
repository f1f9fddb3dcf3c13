"""How often a finished `torchrun --nproc-per-node 2` job aborts at exit, on busy cores.

Runs, interleaved, the same 50-step DDP loop four ways: plain torch, plain torch with
`destroy_process_group()` at the end, Hugging Face Accelerate's Accelerator, and ours
(notebook_accel's Accelerator). Two spinning processes keep the cores busy meanwhile.
Prints, per variant, the runs that failed and how many of those were torch's gloo exit
abort ("terminate called without an active exception"; see docs/torch_gloo_exit_abort.md),
and the median wall time of a run.

    python benchmarks/torchrun_exit_aborts.py [--runs 10] [--no-load]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from notebook_accel.launch.handoff.ports import free_port

REPRO = Path(__file__).resolve().parent.parent / "docs" / "repro" / "gloo_exit_abort.py"
ABORT = "terminate called without an active exception"

LOOP = """
for _ in range(50):
    optimizer.zero_grad()
    {backward}(model(torch.randn(4, 10)).sum())
    optimizer.step()
"""
ACCELERATOR_SCRIPT = """
import torch
from {package} import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(10, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
""" + LOOP.format(backward="accelerator.backward")


def run_once(script: Path, extra_env: dict[str, str]) -> tuple[int, bool, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra_env}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, ABORT in proc.stdout + proc.stderr, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per variant")
    parser.add_argument("--no-load", action="store_true", help="do not keep the cores busy")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ours, peer = Path(tmp, "ours.py"), Path(tmp, "peer.py")
        ours.write_text(ACCELERATOR_SCRIPT.format(package="notebook_accel"))
        peer.write_text(ACCELERATOR_SCRIPT.format(package="accelerate"))
        variants = {
            "plain torch": (REPRO, {}),
            "plain torch + destroy_process_group": (REPRO, {"DESTROY": "1"}),
            "accelerate.Accelerator (peer)": (peer, {"ACCELERATE_USE_CPU": "yes"}),
            "notebook_accel.Accelerator": (ours, {}),
        }
        spinners = [] if args.no_load else [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)
        ]
        results: dict[str, list[tuple[int, bool, float]]] = {name: [] for name in variants}
        try:
            for run in range(args.runs):
                for name, (script, extra_env) in variants.items():
                    results[name].append(run_once(script, extra_env))
                print(f"round {run + 1}/{args.runs} done", file=sys.stderr, flush=True)
        finally:
            for proc in spinners:
                proc.kill()
    load = "no load" if args.no_load else f"{len(spinners)} spinning processes"
    print(f"{args.runs} runs per variant, torchrun --nproc-per-node 2, {load}")
    print(f"{'variant':40} {'failed':>8} {'aborts':>8} {'median s':>9}")
    for name, rows in results.items():
        failed = sum(rc != 0 for rc, _, _ in rows)
        aborts = sum(aborted for _, aborted, _ in rows)
        median = statistics.median(t for _, _, t in rows)
        print(f"{name:40} {failed:>5}/{len(rows):<2} {aborts:>5}/{len(rows):<2} {median:9.2f}")


if __name__ == "__main__":
    main()
