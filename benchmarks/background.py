"""Background runs (``WorkerPool.submit``): what they cost a pool's ordinary runs, and how many
lines a second their output takes, this checkout against a baseline revision without them
measured in the same run (each side in its own process, with its own code).

Per side, on a 2-rank pool: ``pool.run(noop)`` latency (median, p99; a background-capable pool
must not make it slower), and the lines a second a run's output pump takes in (2 ranks printing
100k short lines each, the cell's stream discarded). This checkout also: ``submit(noop).result()``
latency, the same printing run in the background (lines a second into every rank's logs, and
those the cell would show, kept for ``watch``), and the buffer alone (``RunOutput``: a writer
thread as the relay writes, 50 lines a write, a watcher thread reading as it goes).

    python benchmarks/background.py [--baseline 7c5e101] [--runs 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
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
    from notebook_accel.launch.run_output import RunOutput

    output = RunOutput()
    block = "".join(f"[rank 0] step {i:7d} loss 0.{i:06d}\n" for i in range(50))
    seen = [0]

    def watcher() -> None:
        number = 0
        while True:
            items, number, _ = output.since(number, 0.5)
            seen[0] += sum(text.count("\n") for _, text in items)
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
    assert seen[0] + output.dropped_lines >= BUFFER_LINES
    return BUFFER_LINES / took


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
    args = parser.parse_args()
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
