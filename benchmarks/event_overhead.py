"""Event overhead: 2-worker training that logs every step (metrics + a progress bar) vs not.

Both workers train a small MLP with DDP on gloo. The run alternates blocks of
``--steps`` steps in the order plain, logged, logged, plain (so a slow drift of the
machine cancels out), ``--rounds`` times, in one launch; rank 0 times every block.
In a logged block every step calls ``accelerator.log({"loss": ...}, step=...)``
(which streams a "metrics" event to the kernel) and advances a ``notebook_accel.tqdm``
bar; a plain block does neither. Both call ``loss.item()``. The kernel side (this
process) reads and records every event as it would in a notebook.

Prints the throughput ratio logged/plain (total time, and the median of rounds with
its quartiles; goal >= 0.99) and, as figures that depend less on a busy machine,
the cost of one event in the worker and in the kernel against the time of a step.
A launch killed from outside (SIGKILL) is repeated, up to twice.

    python benchmarks/event_overhead.py [--rounds 15] [--steps 150] [--width 64] [--launches 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

from notebook_accel import WorkerError, notebook_launcher
from notebook_accel.launch.views.record import last_launch


def train(rounds: int, steps: int, width: int, warmup: int = 200) -> dict:
    """The whole alternating run; rank 0 returns its block times and the event cost."""
    import torch

    from notebook_accel import Accelerator, events
    from notebook_accel.observe.progress import tqdm

    torch.manual_seed(0)
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    inputs, targets = torch.randn(32, width), torch.randn(32, 1)

    def log(values: dict, step: int) -> None:
        accelerator.log(values, step=step)

    def step_once() -> float:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        return loss.item()

    for _ in range(warmup):
        step_once()
    bar = tqdm(total=rounds * 2 * steps, desc="logged steps")
    times: dict[bool, list[float]] = {False: [], True: []}
    logged_step = 0
    for _ in range(rounds):
        for logged in (False, True, True, False):
            accelerator.wait_for_everyone()
            start = time.perf_counter()
            if logged:
                for _ in range(steps):
                    log({"loss": step_once()}, logged_step)
                    bar.update(1)
                    logged_step += 1
            else:
                for _ in range(steps):
                    step_once()
            times[logged].append(time.perf_counter() - start)
    bar.close()
    accelerator.wait_for_everyone()
    emits = 5000
    start = time.perf_counter()
    for i in range(emits):  # after the timed blocks: only the channel's cost
        events.emit("metrics", {"step": i, "values": {"loss": 0.5}})
    emit_cost = (time.perf_counter() - start) / emits
    return {"times": times, "emit_cost": emit_cost}


def launch(rounds: int, steps: int, width: int) -> dict:
    for attempt in range(3):
        try:
            return notebook_launcher(train, (rounds, steps, width), num_processes=2,
                                     output="main")
        except WorkerError as error:
            if "SIGKILL" not in str(error) or attempt == 2:
                raise
            # e.g. another test session's "no worker left behind" clean-up
            print(f"(launch killed from outside: {error.args[0]}; repeating it)", flush=True)
    raise AssertionError("unreachable")


def kernel_cost(count: int = 20_000) -> float:
    """Seconds the kernel spends per metrics event: read, unpickle, fold into the record."""
    import os

    from notebook_accel.events import EventChannel
    from notebook_accel.launch.views.record import LaunchRecord, RankStatus
    from notebook_accel.launch.worker.main import enlarge_pipe
    from notebook_accel.wire import FrameReader

    read_fd, write_fd = os.pipe()
    enlarge_pipe(write_fd)
    os.set_blocking(read_fd, False)
    channel, reader = EventChannel(write_fd), FrameReader(read_fd)
    record = LaunchRecord(world_size=2, num_processes=2, device_type="cpu",
                          start_method="fork", mixed_precision="no")
    record.ranks[0] = RankStatus(rank=0)
    spent = 0.0
    for first in range(0, count, 2000):
        for step in range(first, first + 2000):
            channel.emit("metrics", {"step": step, "values": {"loss": 0.5}})
        start = time.perf_counter()
        got, _ = reader.read()
        for message in got:
            record.apply(0, message)
        spent += time.perf_counter() - start
    os.close(read_fd)
    os.close(write_fd)
    assert len(record.history["loss"]) == count
    return spent / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="plain/logged/logged/plain rounds")
    parser.add_argument("--steps", type=int, default=150, help="steps per block")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--launches", type=int, default=2)
    args = parser.parse_args()
    plain_total = logged_total = 0.0
    ratios, costs = [], []
    for number in range(args.launches):
        result = launch(args.rounds, args.steps, args.width)
        record = last_launch()
        plain, logged = result["times"][False], result["times"][True]
        plain_total += sum(plain)
        logged_total += sum(logged)
        ratios += [(plain[2 * i] + plain[2 * i + 1]) / (logged[2 * i] + logged[2 * i + 1])
                   for i in range(args.rounds)]
        costs.append(result["emit_cost"])
        step_time = sum(plain) / len(plain) / args.steps
        print(f"launch {number + 1}: plain {args.steps / (sum(plain) / len(plain)):.1f} steps/s, "
              f"logged {args.steps / (sum(logged) / len(logged)):.1f} steps/s "
              f"({1 / step_time:.0f} metric events/s from rank 0 + ~10 progress events/s); "
              f"{record.events} events, {sum(record.dropped.values())} dropped",
              flush=True)
    step_time = plain_total / (args.launches * args.rounds * 2 * args.steps)
    cost, kernel = statistics.median(costs), kernel_cost()
    print(f"one event costs the worker {cost * 1e6:.1f} us and the kernel {kernel * 1e6:.1f} us; "
          f"one step takes {step_time * 1e3:.2f} ms: expected slowdown "
          f"{cost / step_time:.2%} ({(cost + kernel) / step_time:.2%} where the kernel shares "
          "the workers' cores)")
    print(f"throughput ratio logged/plain: {plain_total / logged_total:.4f} (total time); "
          f"median of {len(ratios)} rounds {statistics.median(ratios):.4f} "
          f"[quartiles {statistics.quantiles(ratios, n=4)[0]:.3f}-"
          f"{statistics.quantiles(ratios, n=4)[2]:.3f}]; goal >= 0.99")


if __name__ == "__main__":
    main()
