"""Launch latency: a trivial 2-worker job doing one all_reduce, ours against the peers.

Runs, alternating, in one process: notebook_launcher with start_method "auto"
(fork here), a warm "forkserver" and "spawn"; Hugging Face Accelerate's
notebook_launcher (with ACCELERATE_USE_CPU=yes, so it really distributes); and
torch.multiprocessing.start_processes (fork). Prints medians and ratios.

    python benchmarks/launch_latency.py [--rounds 7] [--no-spawn]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import time

os.environ.setdefault("ACCELERATE_USE_CPU", "yes")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402

from notebook_accel import notebook_launcher  # noqa: E402
from notebook_accel.launch.handoff.ports import free_port  # noqa: E402


def one_allreduce() -> float:
    dist.init_process_group("gloo")
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    dist.destroy_process_group()
    return tensor.item()


def _tmp_worker(rank: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    one_allreduce()


def run_ours(method: str) -> None:
    assert notebook_launcher(one_allreduce, num_processes=2, start_method=method,
                             output="none") == 2.0


def run_peer() -> None:
    from accelerate import notebook_launcher as peer_launcher

    with contextlib.redirect_stdout(io.StringIO()):
        peer_launcher(one_allreduce, num_processes=2, use_port=str(free_port()))


def run_start_processes() -> None:
    tmp.start_processes(_tmp_worker, args=(free_port(),), nprocs=2, start_method="fork")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-spawn", action="store_true", help="skip the (slow) spawn runs")
    options = parser.parse_args()
    contenders = {
        "ours auto (fork)": lambda: run_ours("auto"),
        "ours warm forkserver": lambda: run_ours("forkserver"),
        "peer notebook_launcher": run_peer,
        "torch start_processes (fork)": run_start_processes,
    }
    if not options.no_spawn:
        contenders["ours spawn"] = lambda: run_ours("spawn")
    try:
        import accelerate  # noqa: F401
    except ImportError:
        print("accelerate is not installed (pip install accelerate==1.15.0); skipping the peer")
        contenders.pop("peer notebook_launcher")
    for run in contenders.values():  # warm-up: imports, the forkserver's first start
        run()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(options.rounds):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    peer = medians.get("peer notebook_launcher")
    print(f"\nlaunch latency, 2 workers, one all_reduce, median of {options.rounds} rounds")
    for name, value in medians.items():
        ratio = f"{value / peer:5.2f}x peer" if peer else ""
        print(f"  {name:30s} {value * 1000:8.1f} ms   {ratio}")
    if peer:
        print(f"goal: auto <= 0.8x peer: {medians['ours auto (fork)'] / peer:.2f}; "
              f"warm forkserver <= 1.0x peer: {medians['ours warm forkserver'] / peer:.2f}")


if __name__ == "__main__":
    main()
