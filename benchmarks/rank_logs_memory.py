"""What keeping every rank's lines costs the kernel (``launch/views/rank_logs.py``), this checkout
against a baseline revision measured in the same run.

One million lines of about 40 characters go into a launch's logs (8 ranks), as a long run's
output would. Printed per side: the kernel's memory over the lines' own text, the time per
kept line, and one full garbage-collector pass with the lines kept (what a kernel pays now and
then while it holds them). Each side runs in its own process, with its own code.

    python benchmarks/rank_logs_memory.py --baseline abd64e4
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from revision_sides import ROOT, baseline_worktree, run_side

LINES = 1_000_000


def measure() -> dict:
    import psutil

    from notebook_accel.launch.views.rank_logs import RankLogs

    process = psutil.Process()
    texts = [f"epoch {i % 90:2d} step {i:8d} loss 0.{i:08d}" for i in range(LINES)]
    text_bytes = sum(len(text) for text in texts)
    logs = RankLogs(8)
    gc.collect()
    before = process.memory_info().rss
    began = time.perf_counter()
    for i, text in enumerate(texts):
        logs.add(i % 8, "stdout", text)
    took = time.perf_counter() - began
    del texts  # the logs alone hold the lines now
    gc.collect()
    began = time.perf_counter()
    gc.collect()
    collect = time.perf_counter() - began
    return {"memory_over_text_mb": (process.memory_info().rss - before) / 1e6,
            "text_mb": text_bytes / 1e6, "ns_per_line": took / LINES * 1e9,
            "full_gc_ms": collect * 1e3, "kept": sum(len(logs.text(r).splitlines()) for r in range(8))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="abd64e4", help="the revision to compare against")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print("FIGURES", json.dumps(measure()), flush=True)
        return
    with baseline_worktree(args.baseline) as base:
        sides = {side: run_side(__file__, directory, ["--measure"], timeout=300)
                 for side, directory in (("baseline", base), ("this", ROOT))}
    for side, figures in sides.items():
        if "error" in figures:
            raise SystemExit(f"{side}: no figures\n{figures['error']}")
    print(f"{LINES} kept lines ({sides['this']['text_mb']:.0f} MB of text), baseline "
          f"{args.baseline} vs this checkout; ratio = this / baseline")
    for key, label in (("memory_over_text_mb", "kernel memory over the text, MB"),
                       ("ns_per_line", "time to keep a line, ns"),
                       ("full_gc_ms", "one full garbage-collector pass, ms"),
                       ("kept", "lines kept")):
        before, after = sides["baseline"][key], sides["this"][key]
        print(f"  {label:<38} baseline {before:10.1f}  this {after:10.1f}  "
              f"ratio {after / before:.2f}")


if __name__ == "__main__":
    main()
