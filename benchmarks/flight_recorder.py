"""The flight recorder's cost (always on), and ``check_collectives``' (opt-in), in one run.

Two workers, gloo on CPU, started by notebook_launcher; the variants take turns, round after
round, so drift in machine load falls on all of them:

- ``off``: the recorder switched off (``TORCH_FR_BUFFER_SIZE=0``, the user's choice);
- ``recorder``: the default (torch's flight recorder, a ring of 2048 entries);
- ``check``: the recorder and ``check_collectives=True`` (one descriptor all_gather before
  each collective).

Each launch times a loop of small ``all_reduce`` s (1 float) and steps of a small DDP model
(about 1 ms of compute). A busy machine blurs the 2-worker figures by more than the
recorder costs, so the recorder is also timed alone: the same loop on a group of one process
(no peer to wait for: what is left is the call itself, recorder included). Run::

    python benchmarks/flight_recorder.py [ROUNDS] [COLLECTIVES] [STEPS]

Prints, per variant, the median over rounds of µs per all_reduce and DDP steps/s, and against
``off``: the recorder's cost per collective (target <= 5 µs) and its step throughput (target
>= 0.98), and check_collectives' cost (said, not a target).
"""

from __future__ import annotations

import os
import statistics
import sys

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
COLLECTIVES = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 300
VARIANTS = ("off", "recorder", "check")


def measure(collectives: int, steps: int) -> tuple[float, float, float]:
    """In each worker: µs per small all_reduce (wall, and the main thread's CPU: what the
    recorder adds is CPU on that thread, less blurred by a busy machine than wall time), DDP
    steps/s (rank 0's figures are returned)."""
    import time

    import torch
    import torch.distributed as dist

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    if not dist.is_initialized():  # one process: a group of one, for the recorder alone
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tensor = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(tensor)
    dist.barrier()
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(collectives):
        dist.all_reduce(tensor)
    per_collective = (time.perf_counter() - start) / collectives * 1e6
    cpu_per_collective = (time.thread_time() - cpu) / collectives * 1e6

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = torch.randn(32, 128), torch.randn(32, 8)

    def step() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(20):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return per_collective, cpu_per_collective, steps / (time.perf_counter() - start)


def launch(variant: str, processes: int = 2) -> tuple[float, float, float]:
    from notebook_accel import notebook_launcher

    before = os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    if variant == "off":
        os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    options = {"check_collectives": True} if variant == "check" else {}
    try:
        return notebook_launcher(measure, (COLLECTIVES, STEPS), num_processes=processes,
                                 output="none", **options)
    finally:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        if before is not None:
            os.environ["TORCH_FR_BUFFER_SIZE"] = before


def main() -> None:
    os.environ.setdefault("ACCELERATE_USE_CPU", "yes")
    figures: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
    alone: dict[str, list[tuple[float, float, float]]] = {"off": [], "recorder": []}
    for round_ in range(ROUNDS):
        for variant in VARIANTS if round_ % 2 == 0 else reversed(VARIANTS):
            figures[variant].append(launch(variant))
        for variant in ("off", "recorder") if round_ % 2 == 0 else ("recorder", "off"):
            alone[variant].append(launch(variant, processes=1))
    med = {v: tuple(statistics.median(f[i] for f in figures[v]) for i in range(3)) for v in VARIANTS}
    print(f"{ROUNDS} rounds, {COLLECTIVES} all_reduces of 1 float and {STEPS} DDP steps per launch, "
          "2 workers, gloo on CPU (medians)")
    for variant in VARIANTS:
        wall, cpu, rate = med[variant]
        print(f"  {variant:9s} {wall:8.1f} us/all_reduce (main thread CPU {cpu:6.1f} us)  "
              f"{rate:8.1f} DDP steps/s")
    base_wall, base_cpu, base_rate = med["off"]
    solo = {v: (min(f[0] for f in alone[v]), min(f[1] for f in alone[v])) for v in alone}
    print(f"a group of one (best of {ROUNDS}): {solo['off'][0]:.1f} us/all_reduce off (CPU "
          f"{solo['off'][1]:.1f} us), {solo['recorder'][0]:.1f} us with the recorder (CPU "
          f"{solo['recorder'][1]:.1f} us): {solo['recorder'][1] - solo['off'][1]:+.1f} us CPU, "
          f"{solo['recorder'][0] - solo['off'][0]:+.1f} us wall per collective (target <= 5)")
    for variant, target in (("recorder", " (targets <= 5 us, >= 0.98)"), ("check", "")):
        wall, cpu, rate = med[variant]
        print(f"{variant}: {cpu - base_cpu:+.1f} us CPU, {wall - base_wall:+.1f} us wall per "
              f"collective; step throughput x{rate / base_rate:.3f}{target}")


if __name__ == "__main__":
    main()
