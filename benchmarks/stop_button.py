"""The warm pool's stop button: what a press costs and what it keeps, against a baseline revision.

For each side (this checkout, and BASELINE in a throwaway git worktree), in one run, alternating:
- presses: a 2-rank pool trains a small model (DDP, and FSDP2) and the stop button is pressed at
  random moments; after each: same processes and objects, equal steps and replicas on both ranks,
  a right all_reduce (the baseline's first loss ends its series);
- no cost when nothing is pressed: the latency of an empty pool run, and the time of a DDP
  training step on the pool.

    python benchmarks/stop_button.py [--baseline REV] [--presses 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from revision_sides import ROOT, baseline_worktree, run_side


def measure(presses: int) -> dict:
    """One side's figures (run in a subprocess with that side's code on PYTHONPATH)."""
    import importlib.util

    from notebook_accel import WorkerPool  # this side's (PYTHONPATH)

    spec = importlib.util.spec_from_file_location("stop_chaos", ROOT / "tests/runtime/stop_chaos.py")
    chaos = sys.modules["stop_chaos"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    notebook, run_chaos = chaos.notebook, chaos.run_chaos

    figures: dict = {}
    cells = notebook()
    with WorkerPool(num_processes=2, output="none") as pool:
        pool.run(cells["setup"], 0)
        pool.run(len, ())  # warm
        runs = []
        for _ in range(200):
            began = time.perf_counter()
            pool.run(len, ())
            runs.append(time.perf_counter() - began)
        figures["empty_run_ms"] = statistics.median(runs) * 1e3
        pool.run(cells["train"], 20)
        began = time.perf_counter()
        pool.run(cells["train"], 520)
        figures["ddp_step_ms"] = (time.perf_counter() - began) / 500 * 1e3
    for name, options in (("ddp", {}), ("fsdp2", {"fsdp": True})):
        result = run_chaos(presses, {**options, "output": "none"}, seed=1)
        stops = sorted(result.stop_seconds) or [float("nan")]
        out_of_step = {problem.split(":")[0] for problem in result.problems  # "press N"
                       if "differ" in problem or "all_reduce" in problem}
        figures[name] = {"presses": result.presses, "kept": result.presses - result.replaced,
                         "out_of_step": len(out_of_step), "stop_median_s": statistics.median(stops),
                         "stop_max_s": stops[-1]}
    return figures


def _side(directory: Path, presses: int) -> dict:
    figures = run_side(__file__, directory, ["--measure", str(presses)], timeout=1800)
    if "error" in figures:
        raise RuntimeError(f"{directory}: no figures\n{figures['error']}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD~1", help="the revision to compare against")
    parser.add_argument("--presses", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--measure", type=int, metavar="PRESSES", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:  # one side, in its own process
        print("FIGURES", json.dumps(measure(args.measure)), flush=True)
        return
    with baseline_worktree(args.baseline) as base:
        sides: dict[str, list[dict]] = {"baseline": [], "this": []}
        for _ in range(args.rounds):
            sides["baseline"].append(_side(base, args.presses))
            sides["this"].append(_side(ROOT, args.presses))
    print(f"baseline {args.baseline} vs this checkout, {args.presses} presses per series, "
          f"{args.rounds} round(s), medians of rounds:")
    for key, unit in (("empty_run_ms", "ms"), ("ddp_step_ms", "ms")):
        before = statistics.median(r[key] for r in sides["baseline"])
        after = statistics.median(r[key] for r in sides["this"])
        print(f"  {key}: baseline {before:.3f} {unit}, this {after:.3f} {unit} "
              f"(ratio {after / before:.2f})")
    for name in ("ddp", "fsdp2"):
        for side in ("baseline", "this"):
            r = sides[side][-1][name]
            print(f"  {name} {side}: {r['presses']} presses, {r['kept']} kept the workers, "
                  f"{r['out_of_step']} of those left the ranks out of step (steps, weights or "
                  f"all_reduce); stop median {r['stop_median_s']:.3f} s, max "
                  f"{r['stop_max_s']:.3f} s")


if __name__ == "__main__":
    main()
