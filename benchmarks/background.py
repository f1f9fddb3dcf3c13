"""Background runs (``WorkerPool.submit``): what they cost a pool's ordinary runs, and how many
lines a second their output takes, this checkout against a baseline revision without them
measured in the same run (each side in its own process, with its own code).

Per side, on a 2-rank pool: ``pool.run(noop)`` latency (median, p99; a background-capable pool
must not make it slower), and the lines a second a run's output pump takes in (2 ranks printing
100k short lines each, the cell's stream discarded). This checkout also: ``submit(noop).result()``
latency, the same printing run in the background (lines a second into every rank's logs, and
those the cell would show, kept for ``watch``), and the buffer alone (``RunOutput``: a writer
thread as the relay writes, 50 lines a write, a watcher thread reading as it goes).

``--detached``: a detached pool (its keeper runs every run) against a kernel-owned one, both
of this checkout, alternated in one process: ``pool.run(noop)`` latency (target <= 1.5x), a
training step's throughput (a 2-rank DDP step of a small MLP, a line printed per step, 400 steps
in one run; target >= 0.98x), and the lines a second into a run's rings on disk
(``RingOutput``, as the buffer above).

    python benchmarks/background.py [--baseline 7c5e101] [--runs 300] [--rounds 3]
    python benchmarks/background.py --detached [--runs 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import threading
import time

from revision_sides import ROOT, baseline_worktree, run_side

LINES = 100_000  # per rank, for the pump's throughput
BUFFER_LINES = 1_000_000


def noop() -> None:
    return None


def printer(lines: int) -> int:
    import sys

    for start in range(0, lines, 1000):  # the lines as a training loop's, a block at a time
        sys.stdout.write("".join(f"step {i:7d} loss 0.{i:06d}\n" for i in range(start, start + 1000)))
    sys.stdout.flush()
    return lines


def latency(function, runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    times.sort()
    return statistics.median(times) * 1e3, times[int(len(times) * 0.99)] * 1e3


def buffer_lines_per_s() -> float:
    """Lines a second through a background run's watch buffer (every line read by a watcher)."""
    from notebook_accel.launch.views.run_output import RunOutput

    block = "".join(f"[rank 0] step {i:7d} loss 0.{i:06d}\n" for i in range(50))
    return _lines_per_s(RunOutput(), block, lambda items, dropped: sum(text.count("\n") for _, text in items),
                        exact=False)


def _lines_per_s(output, block: str, counted, exact: bool) -> float:
    """Write BUFFER_LINES lines (``block`` at a time) into ``output`` while a thread reads them back
    with ``output.since``; ``counted(items, dropped)``: the lines one read accounts for."""
    seen = [0]

    def watcher() -> None:
        number = 0
        while True:
            items, number, dropped = output.since(number, 0.5)
            seen[0] += counted(items, dropped)
            if output.ended and number == output.count:
                return

    reader = threading.Thread(target=watcher)
    reader.start()
    began = time.perf_counter()
    for _ in range(BUFFER_LINES // 50):
        output.stdout.write(block)
    output.end()
    reader.join()
    took = time.perf_counter() - began
    assert seen[0] == BUFFER_LINES if exact else seen[0] + output.dropped_lines >= BUFFER_LINES, seen
    return BUFFER_LINES / took


def train(steps: int) -> float:
    """``steps`` DDP steps of a small MLP (a line printed per step); steps a second."""
    import torch

    from notebook_accel import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    batch, target = torch.randn(64, 256), torch.randn(64, 1)
    began = time.perf_counter()
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(batch), target)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    return steps / (time.perf_counter() - began)


def ring_lines_per_s(folder) -> float:
    """Lines a second into a detached run's rings (written on disk, read back by a watcher)."""
    from notebook_accel.launch.detached.output_ring import RingOutput

    block = "".join(f"[rank {i % 2}] step {i:7d} loss 0.{i:06d}\n" for i in range(50))
    return _lines_per_s(RingOutput(folder), block, lambda items, dropped: len(items) + dropped, exact=True)


def measure_detached(runs: int, rounds: int) -> None:
    """A detached pool against a kernel-owned one (this checkout), alternated ``rounds`` times."""
    import tempfile

    from notebook_accel import WorkerPool

    steps = 400
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="na-bench-") as runtime:
        os.environ["XDG_RUNTIME_DIR"] = runtime  # a runtime directory of the benchmark's own
        owned = WorkerPool(num_processes=2)
        detached = WorkerPool(num_processes=2, detach=True, name="bench")
        try:
            for pool in (owned, detached):
                pool.run(noop)
            for round_ in range(rounds):
                for side, pool in ((("kernel", owned), ("detached", detached))[::-1] if round_ % 2
                                   else (("kernel", owned), ("detached", detached))):
                    median, p99 = latency(lambda pool=pool: pool.run(noop), runs)
                    figures.setdefault(f"{side}_noop_ms", []).append(median)
                    figures.setdefault(f"{side}_noop_p99_ms", []).append(p99)
                    with contextlib.redirect_stdout(io.StringIO()):  # the cell's lines, discarded
                        began = time.perf_counter()
                        in_worker = pool.run(train, steps)
                        took = time.perf_counter() - began
                    figures.setdefault(f"{side}_steps_per_s", []).append(steps / took)
                    figures.setdefault(f"{side}_steps_per_s_in_worker", []).append(in_worker)
            ring = ring_lines_per_s(__import__("pathlib").Path(runtime) / "ring")
        finally:
            detached.close()
            owned.close()
    f = {key: statistics.median(values) for key, values in figures.items()}
    print(f"2-rank pools on {os.cpu_count()} CPUs, {runs} runs, median of {rounds} alternated "
          "rounds; a detached pool (runs through its keeper) vs a kernel-owned one")
    for key, label, target in (
            ("noop_ms", "pool.run(noop) median, ms", "<= 1.5x"),
            ("noop_p99_ms", "pool.run(noop) p99, ms", ""),
            ("steps_per_s", f"a training run, steps/s ({steps})", ">= 0.98x"),
            ("steps_per_s_in_worker", "the same, timed in rank 0", ">= 0.98x")):
        kernel, far = f[f"kernel_{key}"], f[f"detached_{key}"]
        print(f"  {label:<36} kernel {kernel:9.2f}  detached {far:9.2f}  ratio {far / kernel:.2f}"
              + (f"  (target {target})" if target else ""))
    print(f"  {'lines/s into the rings (and read)':<36} {ring:10.0f}")


def measure(runs: int) -> dict:
    from notebook_accel import WorkerPool

    figures = {}
    with WorkerPool(num_processes=2) as pool:
        pool.run(noop)
        figures["run_noop_ms"], figures["run_noop_p99_ms"] = latency(lambda: pool.run(noop), runs)
        with contextlib.redirect_stdout(io.StringIO()):  # the cell's stream, discarded
            began = time.perf_counter()
            pool.run(printer, LINES)
            figures["foreground_lines_per_s"] = 2 * LINES / (time.perf_counter() - began)
        if hasattr(pool, "submit"):
            submit = lambda: pool.submit(noop).result()  # noqa: E731
            with contextlib.redirect_stderr(io.StringIO()):  # its one line saying how to watch
                figures["submit_noop_ms"], figures["submit_noop_p99_ms"] = latency(submit, runs)
                began = time.perf_counter()
                run = pool.submit(printer, LINES)
                run.result()
            took = time.perf_counter() - began
            logged = sum(run.logs(rank).count("\n") + 1 for rank in (0, 1))
            figures["background_lines_per_s"] = logged / took
            shown = sum(text.count("\n") for _, text in run.output.since(0, 0)[0])
            figures["background_kept_for_watch"] = shown + run.output.dropped_lines
            figures["buffer_lines_per_s"] = buffer_lines_per_s()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="7c5e101", help="a revision without background runs")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs of each side")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--detached", action="store_true",
                        help="a detached pool against a kernel-owned one (this checkout only)")
    args = parser.parse_args()
    if args.detached:
        measure_detached(args.runs, args.rounds)
        return
    if args.measure:
        print("FIGURES", json.dumps(measure(args.runs)), flush=True)
        return
    rounds: dict[str, list[dict]] = {"baseline": [], "this": []}
    with baseline_worktree(args.baseline) as base:
        order = [("baseline", base), ("this", ROOT)]
        for round_ in range(args.rounds):  # alternated, each side first in turn: a loaded
            for side, directory in order[::-1] if round_ % 2 else order:  # machine drifts
                figures = run_side(__file__, directory, ["--measure", "--runs", str(args.runs)],
                                   timeout=900)
                if "error" in figures:
                    raise SystemExit(f"{side}: no figures\n{figures['error']}")
                rounds[side].append(figures)
    base, this = ({key: statistics.median(f[key] for f in rounds[side]) for key in rounds[side][0]}
                  for side in ("baseline", "this"))
    print(f"2-rank pool, {args.runs} runs, median of {args.rounds} alternated rounds; baseline "
          f"{args.baseline} vs this checkout")
    for key, label in (("run_noop_ms", "pool.run(noop) median, ms"),
                       ("run_noop_p99_ms", "pool.run(noop) p99, ms"),
                       ("foreground_lines_per_s", "a run's pump, lines/s")):
        print(f"  {label:<34} baseline {base[key]:10.2f}  this {this[key]:10.2f}  "
              f"ratio {this[key] / base[key]:.2f}")
    print(f"  {'submit(noop).result() median, ms':<34} {this['submit_noop_ms']:10.2f}  "
          f"(p99 {this['submit_noop_p99_ms']:.2f})")
    print(f"  {'a background run pump, lines/s':<34} {this['background_lines_per_s']:10.0f}  "
          f"(lines kept for watch, within the cell's budget: {this['background_kept_for_watch']})")
    print(f"  {'the watch buffer alone, lines/s':<34} {this['buffer_lines_per_s']:10.0f}")


if __name__ == "__main__":
    main()
