"""Event overhead: 2-worker training that logs every step (metrics + a progress bar) vs not.

Each worker trains a small MLP with DDP on gloo for ``--steps`` steps; rank 0 times
the steps after a warm-up. The "logged" variant calls ``accelerator.log(...)``
every step (when ``Accelerator.log`` does not yet stream to the kernel, it sends
the same ``"metrics"`` event itself with ``events.emit``) and iterates through
``notebook_accel.tqdm``; the "plain" variant does neither. Both call
``loss.item()``. Variants alternate, in swapped order each round; prints each
round, the medians and the throughput ratio (goal: >= 0.99).

    python benchmarks/event_overhead.py [--rounds 5] [--steps 3000] [--width 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

from notebook_accel import notebook_launcher
from notebook_accel.launch.record import last_launch


def _log_streams(accelerator) -> bool:
    """Whether ``accelerator.log`` already sends an event (counted, not delivered)."""
    from notebook_accel.launch import events

    channel = events._channel
    sent = []
    original = channel.emit
    channel.emit = lambda *args, **kwargs: sent.append(args) or True
    try:
        accelerator.log({"probe": 0.0}, step=-1)
    finally:
        channel.emit = original
    return bool(sent)


def train(logged: bool, steps: int, width: int, warmup: int = 200) -> dict:
    """One run; rank 0 returns its steps per second and how it logged."""
    import torch

    from notebook_accel import Accelerator
    from notebook_accel.launch import events
    from notebook_accel.progress import tqdm

    torch.manual_seed(0)
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    inputs, targets = torch.randn(32, width), torch.randn(32, 1)
    via_log = _log_streams(accelerator)

    def log(values: dict, step: int) -> None:
        if via_log:
            accelerator.log(values, step=step)
        elif accelerator.is_main_process:
            events.emit("metrics", {"step": step, "values": values})

    def step_once() -> float:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        return loss.item()

    for _ in range(warmup):
        step_once()
    accelerator.wait_for_everyone()
    start = time.perf_counter()
    if logged:
        for step in tqdm(range(steps), desc="train"):
            log({"loss": step_once()}, step)
    else:
        for _ in range(steps):
            step_once()
    accelerator.wait_for_everyone()
    elapsed = time.perf_counter() - start
    return {"rate": steps / elapsed, "via_log": via_log}


def run(logged: bool, steps: int, width: int) -> tuple[float, bool, int, int]:
    result = notebook_launcher(train, (logged, steps, width), num_processes=2, output="main")
    record = last_launch()
    return result["rate"], result["via_log"], record.events, sum(record.dropped.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    rates: dict[bool, list[float]] = {False: [], True: []}
    ratios = []
    for round_ in range(args.rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        this = {}
        for logged in order:
            rate, via_log, count, dropped = run(logged, args.steps, args.width)
            rates[logged].append(rate)
            this[logged] = rate
            if logged:
                how = "accelerator.log" if via_log else "events.emit (Accelerator.log does not stream yet)"
                detail = f", {count} events, {dropped} dropped, via {how}"
            else:
                detail = ""
            print(f"round {round_ + 1}: {'logged' if logged else 'plain '} "
                  f"{rate:8.1f} steps/s{detail}", flush=True)
        ratios.append(this[True] / this[False])
    plain, logged = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"median steps/s: plain {plain:.1f}, logged {logged:.1f} "
          f"(= {logged:.0f} metric events/s from rank 0, plus ~10 progress events/s)")
    print(f"throughput ratio logged/plain: {logged / plain:.4f} (median of rounds; "
          f"paired median {statistics.median(ratios):.4f}; goal >= 0.99)")


if __name__ == "__main__":
    main()
