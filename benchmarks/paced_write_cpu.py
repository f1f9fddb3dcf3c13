"""What a snapshot's paced write costs in CPU: ``paced_writes`` with ``O_DIRECT`` against the same
write through the page cache, alternated round after round in one process.

Writes MB megabytes of random float32 (a tensor, as a snapshot's host copy holds) with
``save_safetensors_paced`` into a temporary folder on the disk (``--dir``), fsynced, and prints per
variant the median wall time, the writing thread's CPU time, and the whole machine's CPU time over the write
(``/proc/stat``, Linux: it includes the kernel's writeback threads, which a page-cache write leaves
work to). Run on a quiet machine::

    python benchmarks/paced_write_cpu.py [--mb 96] [--rounds 5] [--dir .]

Measured here (2 CPUs, ext4 on a virtual disk, ``--mb 96 --rounds 7``, two runs): wall 163-164 ms with
``O_DIRECT`` against 165-169; the writing thread 19-21 ms of CPU against 33-34; the machine 10-20 ms
against 30-50 (``/proc/stat`` counts in 10 ms ticks).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from notebook_accel.checkpoint import paced_writes


def machine_cpu_s() -> float:
    """Seconds of CPU the whole machine has spent, not idle (user, system, interrupts, ...)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # less idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def one_write(state: dict[str, torch.Tensor], path: Path) -> tuple[float, float, float]:
    machine, wall, thread = machine_cpu_s(), time.perf_counter(), time.thread_time()
    paced_writes.save_safetensors_paced(state, path)
    result = (time.perf_counter() - wall, time.thread_time() - thread, machine_cpu_s() - machine)
    path.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=".", help="where the files go (a folder on the disk to measure)")
    args = parser.parse_args()
    state = {"weight": torch.randn(args.mb * 2**20 // 4)}
    flag = paced_writes.DIRECT
    variants = {"O_DIRECT": flag, "page cache": 0}
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="nbaccel-paced-cpu-") as tmp:
        for round_ in range(args.rounds):
            for name in (list(variants) if round_ % 2 == 0 else list(variants)[::-1]):
                paced_writes.DIRECT = variants[name]
                figures[name].append(one_write(state, Path(tmp) / "model.safetensors"))
    paced_writes.DIRECT = flag
    if not flag:
        print("this platform has no O_DIRECT: both variants go through the page cache")
    print(f"{args.mb} MB written {paced_writes.PIECE >> 20} MiB at a time, fsynced; medians of {args.rounds} rounds (ms)")
    print(f"{'variant':<12}{'wall':>8}{'thread CPU':>12}{'machine CPU':>13}")
    for name, rows in figures.items():
        wall, thread, machine = (1000 * statistics.median(column) for column in zip(*rows, strict=True))
        print(f"{name:<12}{wall:>8.0f}{thread:>12.0f}{machine:>13.0f}")


if __name__ == "__main__":
    main()
