"""The flight recorder's cost (always on), and ``check_collectives``' (opt-in), in one run.

Warm pools of two workers (gloo on CPU), one per variant, kept for the whole run; rounds
alternate the variants in one process (the order reversed every other round), so drift in
machine load falls on all of them alike:

- ``off``: the recorder switched off (``TORCH_FR_BUFFER_SIZE=0``, the user's choice);
- ``recorder``: the default (torch's flight recorder, a ring of 2048 entries);
- ``check``: the recorder and ``check_collectives=True`` (one descriptor all_gather before
  each collective).

Each round times, on each pool, a loop of small ``all_reduce`` s (1 float) and steps of a
small DDP model (about 1 ms of compute), each call and step on its own, and keeps their
medians (a step a preemption hit is an outlier, not part of the figure). The figures are medians over the rounds, and the
recorder's and the check's against ``off`` are medians of each round's own ratio (paired:
a slow moment hits both sides of a ratio), with a 95% interval of that median, which says
whether the figure can be quoted (within 2%). Step throughput is said twice: by the median
step's wall time (what a user sees) and by the main thread's CPU time per step (where the
recorder's cost lands). The recorder is also timed alone: the same loop
on groups of one process (no peer to wait for: what is left is the call itself). Run::

    python benchmarks/flight_recorder.py [ROUNDS] [COLLECTIVES] [STEPS]

Targets: the recorder's cost per collective <= 5 µs, its DDP step throughput >= 0.98 of
``off``; check_collectives' cost is said, not a target.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 100
COLLECTIVES = int(sys.argv[2]) if len(sys.argv) > 2 else 300
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 60
STABLE = 0.02  # the median ratio's 95% interval within this of it: a figure to quote
VARIANTS = ("off", "recorder", "check")


def measure(collectives: int, steps: int) -> tuple[float, float, float, float]:
    """In each worker (rank 0's figures are returned): the median µs of one small all_reduce
    and the main thread's CPU µs per all_reduce (what the recorder adds is CPU on that
    thread); the median µs of one DDP step and the main thread's CPU µs per step. Each call
    and step is timed on its own and the median taken: on a shared machine the ones a
    preemption hits are outliers, which a mean would take in. The model is prepared at the
    first call and kept in the worker (a pool's) for the next."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

    from notebook_accel import Accelerator

    if not dist.is_initialized():  # one process: a group of one, for the recorder alone
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tensor = torch.ones(1)
    dist.barrier()
    clock, times = time.perf_counter, []
    cpu = time.thread_time()
    for _ in range(collectives):
        start = clock()
        dist.all_reduce(tensor)
        times.append(clock() - start)
    cpu_per_collective = (time.thread_time() - cpu) / collectives * 1e6
    per_collective = statistics.median(times) * 1e6
    if not steps:
        return per_collective, cpu_per_collective, 0.0, 0.0

    kept = getattr(dist, "_flight_recorder_benchmark", None)  # (kept across a pool's calls)
    if kept is None:
        accelerator = Accelerator()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 8))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        kept = (accelerator, *accelerator.prepare(model, optimizer),
                torch.randn(32, 128), torch.randn(32, 8))
        dist._flight_recorder_benchmark = kept
    accelerator, model, optimizer, x, y = kept

    def step() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    step()
    dist.barrier()
    times = []
    cpu = time.thread_time()
    for _ in range(steps):
        start = clock()
        step()
        times.append(clock() - start)
    cpu_per_step = (time.thread_time() - cpu) / steps * 1e6
    return per_collective, cpu_per_collective, statistics.median(times) * 1e6, cpu_per_step


@contextlib.contextmanager
def _recorder_setting(variant: str):
    """``TORCH_FR_BUFFER_SIZE=0`` for ``off`` while its pool's workers start (the workers
    read it when their group is made); the default otherwise."""
    before = os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    if variant == "off":
        os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    try:
        yield
    finally:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        if before is not None:
            os.environ["TORCH_FR_BUFFER_SIZE"] = before


def start_pool(variant: str, processes: int):
    from notebook_accel import WorkerPool

    with _recorder_setting(variant):
        pool = WorkerPool(num_processes=processes, output="none",
                          check_collectives=variant == "check")
        pool.run(measure, 100, 20)  # started, its group made and its model prepared
    return pool


def _median_interval(values: list[float]) -> tuple[float, float]:
    """A 95% interval for the median of ``values`` (order statistics: no distribution
    assumed)."""
    ordered = sorted(values)
    half = 1.96 * len(ordered) ** 0.5 / 2
    low = max(0, int(len(ordered) / 2 - half))
    high = min(len(ordered) - 1, int(len(ordered) / 2 + half + 0.5))
    return ordered[low], ordered[high]


def main() -> None:
    os.environ.setdefault("ACCELERATE_USE_CPU", "yes")
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    pools = {v: start_pool(v, 2) for v in VARIANTS}
    alone = {v: start_pool(v, 1) for v in ("off", "recorder")}
    figures: dict[str, list[tuple[float, ...]]] = {v: [] for v in VARIANTS}
    solo: dict[str, list[tuple[float, ...]]] = {v: [] for v in alone}
    try:
        for round_ in range(ROUNDS):
            order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                figures[variant].append(pools[variant].run(measure, COLLECTIVES, STEPS))
            for variant in ("off", "recorder") if round_ % 2 == 0 else ("recorder", "off"):
                solo[variant].append(alone[variant].run(measure, COLLECTIVES, 0))
    finally:
        for pool in (*pools.values(), *alone.values()):
            pool.close()
    med = {v: tuple(statistics.median(f[i] for f in figures[v]) for i in range(4)) for v in VARIANTS}
    print(f"{ROUNDS} rounds, each: {COLLECTIVES} all_reduces of 1 float and {STEPS} DDP steps "
          "per variant, 2 warm workers per variant, gloo on CPU (medians over rounds)")
    for variant in VARIANTS:
        wall, cpu, step, step_cpu = med[variant]
        print(f"  {variant:9s} {wall:7.1f} us/all_reduce (main thread CPU {cpu:6.1f} us)  "
              f"{1e6 / step:7.1f} DDP steps/s (a step {step:6.1f} us; main thread CPU "
              f"{step_cpu:6.1f} us)")
    base = figures["off"]
    for variant, target in (("recorder", " (targets: <= 5 us; a step x0.98 or better)"),
                            ("check", "")):
        ratios = [b[2] / f[2] for f, b in zip(figures[variant], base, strict=True)]
        step_cpu = [b[3] / f[3] for f, b in zip(figures[variant], base, strict=True)]
        cpu = [f[1] - b[1] for f, b in zip(figures[variant], base, strict=True)]
        wall = [f[0] - b[0] for f, b in zip(figures[variant], base, strict=True)]
        print(f"{variant}: {statistics.median(cpu):+.1f} us CPU, {statistics.median(wall):+.1f} us "
              f"wall per collective{target}")
        for name, values in (("a step's wall time", ratios), ("the main thread's CPU", step_cpu)):
            middle = statistics.median(values)
            low, high = _median_interval(values)
            quotable = max(middle - low, high - middle) <= STABLE * middle
            print(f"  step throughput by {name}: x{middle:.3f} (95% interval of the median "
                  f"[{low:.3f}, {high:.3f}]{'' if quotable else f': wider than {STABLE:.0%}, not a figure to quote'})")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    cpu = [r[1] - o[1] for r, o in zip(solo["recorder"], solo["off"], strict=True)]
    wall = [r[0] - o[0] for r, o in zip(solo["recorder"], solo["off"], strict=True)]
    print(f"a group of one: {statistics.median(r[0] for r in solo['off']):.1f} us/all_reduce off, "
          f"{statistics.median(r[0] for r in solo['recorder']):.1f} us with the recorder: "
          f"{statistics.median(cpu):+.1f} us CPU, {statistics.median(wall):+.1f} us wall per "
          "collective (target <= 5; medians of the rounds' differences)")


if __name__ == "__main__":
    main()
