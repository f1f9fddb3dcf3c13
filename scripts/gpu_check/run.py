"""Run every GPU check, each in its own process under a time limit; print PASS / FAIL / N/A lines.

Usage: ``run.py [--out DIR] [--only NAME ...] [--budget SECONDS]``. Writes ``gpu_check.log`` (every
line of every check) and ``summary.json`` (the machine, each item's status and figures) to DIR
(default: ``$OUT``, else a new temporary folder). Exits 1 if any item FAILs; "N/A" (no GPU here)
is not a failure, so on a CPU machine this is a dry run that proves the checks still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MARKER = "GPU_CHECK_RESULT "
# (script, seconds it may take on the GPU machine); in the order of the list
CHECKS = [("check_kernel", 150), ("check_training", 90), ("check_two_ranks", 90), ("check_sharding", 240),
          ("check_big_model", 90), ("check_failure_memory", 90), ("check_throughput", 200),
          ("check_pool_compile", 120), ("check_hardware_truth", 60)]


def machine() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    for name in ("accelerate", "deepspeed", "transformers"):
        try:
            from importlib import metadata

            info[name] = metadata.version(name)
        except Exception:  # noqa: BLE001 - not installed
            info[name] = None
    return info


def _kill_tree(pid: int) -> None:
    """Kill a check and everything under it: its process group, and its workers, which the
    launcher starts in sessions of their own (a rank stuck in a collective must not outlive it)."""
    import psutil

    try:
        tree = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for process in tree:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(pid, 9)
    except ProcessLookupError:
        pass


def run_check(name: str, limit: float, log) -> tuple[list[dict], float]:
    """One check script; its items, or one FAIL item when it crashed or ran out of time."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(HERE), os.environ.get("PYTHONPATH")]))}
    start = time.monotonic()
    log.write(f"===== {name} (limit {limit:.0f} s)\n")
    proc = subprocess.Popen([sys.executable, str(HERE / f"{name}.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, _ = proc.communicate()
    finally:
        _kill_tree(proc.pid)
    lines = out.splitlines()
    log.write(out)
    log.flush()
    seconds = time.monotonic() - start
    result = [line for line in lines if line.startswith(MARKER)]
    if result:
        for line in lines:
            if line.startswith("[") and line[1:2].isdigit():
                print(line, flush=True)
        return json.loads(result[-1][len(MARKER):]), seconds
    why = f"timed out after {limit:.0f} s" if proc.returncode in (-9, None) else f"exit code {proc.returncode}"
    tail = "\n".join(lines[-40:])
    print(f"[{name}] FAIL {why}\n{tail}", flush=True)
    return [{"item": name, "title": name, "status": "FAIL", "figures": {"seconds": round(seconds, 1)},
             "detail": f"{why}; last lines:\n{tail}"}], seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or None)
    parser.add_argument("--only", nargs="*", default=None, help="check scripts to run (e.g. check_sharding)")
    parser.add_argument("--budget", type=float, default=520, help="seconds for all checks together")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="gpu_check_"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    summary = {"machine": machine(), "items": [], "check_seconds": {}}
    print(f"gpu_check on {summary['machine']}; writing to {out}", flush=True)
    with open(out / "gpu_check.log", "w") as log:
        for name, limit in CHECKS:
            if args.only and name not in args.only:
                continue
            left = args.budget - (time.monotonic() - started)
            if left < 15:
                summary["items"].append({"item": name, "title": name, "status": "FAIL", "figures": {},
                                         "detail": f"not run: the {args.budget:.0f} s budget was spent"})
                print(f"[{name}] FAIL not run: out of time", flush=True)
                continue
            items, seconds = run_check(name, min(limit, left), log)
            summary["items"].extend(items)
            summary["check_seconds"][name] = round(seconds, 1)
    counts = {s: sum(i["status"] == s for i in summary["items"]) for s in ("PASS", "FAIL", "N/A")}
    summary.update(counts=counts, seconds=round(time.monotonic() - started, 1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"gpu_check: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['N/A']} N/A "
          f"in {summary['seconds']} s; summary in {out / 'summary.json'}", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
