"""Snapshots' cost on the training path: step time with ``snapshot_every`` against without, and
against blocking saves (ours and the peer's ``save_state``) at the same interval, in the same run.

One process on CPU; a model of two 2048x2048 layers trained with AdamW is ~100 MB of state
(weights and two moments); WIDTH 6600 makes it ~1 GB. The variants take turns, round after round, so drift in machine load
falls on all of them. Run::

    python benchmarks/snapshot.py [ROUNDS] [STEPS] [EVERY] [WIDTH] [THREADS]

Prints each variant's mean and longest step (ms), its mean step against no snapshots (target for
``snapshot_every``: <= 1.05 at one snapshot every 50 steps), the host copy's time (the only part
of a snapshot on the training path; the longest step's stall should be about that), the
background write's time, the blocking saves' stall, and each snapshot's stall (its worst step of
the ``WINDOW`` from its step on; the same steps of the runs without snapshots are the machine's
noise). ``snapshot_every_fresh`` copies into fresh memory each time (the last written snapshot's host
copy not kept for the next), ``snapshot_every_cached`` writes through the page cache (no ``O_DIRECT``,
as on a file system that refuses it), ``snapshot_every_unpaced`` writes the same files without
``paced_writes``' pauses.

Measured (2 shared CPUs, training on both; two runs each): ``3 200 50`` (96 MB), 2026-12-07: host
copy 6 ms (the first too: its memory is made ahead; 15-20 ms into fresh memory), each snapshot's
stall 10-11 ms in the median snapshot, 17-51 ms in the worst (page cache 34-52 / 80-117, fresh 25-31
/ 78-106, unpaced 22-89 / 92-153, the peer's blocking save 212-223 / 224-232; the same steps without
snapshots 5 / 12-13), mean step x1.05-1.10, within the runs' noise (fresh x1.03-1.04); 2026-12-06,
a slower disk, before the first write stopped importing ``torch.distributed.checkpoint``: stall
15-19 / 53-54 ms, the peer's save 478-571 / 579-778. ``1 100 50 6600`` (1 GB): mean step
x1.007-1.008 (page cache x1.11-1.56), host copy 43-57 ms (the first 62 ms made ahead, 231 ms
without), write 1.8-1.9 s (page cache 6.4-7.5 s), each snapshot's stall 101 ms in the median
snapshot (none 48, a noisy run; the peer's blocking save 4.7-6.6 s).
``3 200 50 2048 1`` (training on one thread, a core left to the write as on a GPU): each snapshot's
stall 18 ms in the median snapshot (host copy 10 ms; without snapshots 16 ms, a noisy run), 39 ms
in the worst (without snapshots 46 ms).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from notebook_accel.checkpoint import paced_writes

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 150
EVERY = int(sys.argv[3]) if len(sys.argv) > 3 else 50
WIDTH = int(sys.argv[4]) if len(sys.argv) > 4 else 2048
THREADS = int(sys.argv[5]) if len(sys.argv) > 5 else None  # training's CPU threads (1: a core left to the write, as with a GPU)
BATCH = 32
DIRECT = paced_writes.DIRECT  # the paced writes' O_DIRECT flag (the page-cache variant sets 0)
WINDOW = 15  # steps from a snapshot's step on (its host copy, then its write) where its stall is looked for


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))


def run(variant: str, workdir: Path) -> tuple[list[float], dict[str, float]]:
    """Step times (s) of one variant: "none", "snapshot_every", "save_state" (ours, blocking) or "peer"."""
    if variant == "peer":
        from accelerate import Accelerator as PeerAccelerator

        acc = PeerAccelerator(cpu=True)
    else:
        from notebook_accel import Accelerator

        acc = Accelerator(cpu=True)
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    net, opt = acc.prepare(net, opt)
    if variant.startswith("snapshot_every"):
        from notebook_accel.checkpoint import copy_memory, snapshots

        snapshots.PACED_WRITES = variant != "snapshot_every_unpaced"
        paced_writes.DIRECT = 0 if variant == "snapshot_every_cached" else DIRECT
        copy_memory.SPARE_SHARE = 0.0 if variant == "snapshot_every_fresh" else 0.5  # 0: no copy kept for the next
        acc.snapshot_every(steps=EVERY, dir=workdir / "snapshots", keep=2)
    x = torch.randn(BATCH, WIDTH)
    times, extra = [], {}
    for step in range(1, STEPS + 1):
        start = time.perf_counter()
        loss = net(x).pow(2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if variant in ("save_state", "peer") and step % EVERY == 0:
            acc.save_state(str(workdir / f"{variant}_{step}"))
        times.append(time.perf_counter() - start)
    if variant.startswith("snapshot_every"):
        acc.wait_for_snapshots()
        snaps = acc._snapshots
        extra = {"first_copy_ms": 1000 * snaps.host_copy_s[0],
                 "host_copy_ms": 1000 * statistics.median(snaps.host_copy_s[1:] or snaps.host_copy_s),
                 "write_ms": 1000 * (snaps.writer.last_write_s or 0.0)}
    state_mb = sum(p.numel() * p.element_size() for p in net.parameters()) * 3 / 2**20  # weights + 2 moments
    extra["state_mb"] = state_mb
    return times, extra


def main() -> None:
    if THREADS is not None:
        torch.set_num_threads(THREADS)
    variants = ("none", "snapshot_every", "snapshot_every_fresh", "snapshot_every_cached", "snapshot_every_unpaced",
                "save_state", "peer")
    steps: dict[str, list[float]] = {v: [] for v in variants}
    windows: dict[str, list[float]] = {v: [] for v in variants}  # each snapshot's worst step over the median
    extras: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="nbaccel-snapshot-bench-") as tmp:
        run("none", Path(tmp))  # warm up: imports, allocator
        for round_ in range(ROUNDS):
            order = variants if round_ % 2 == 0 else variants[::-1]
            for variant in order:
                times, extra = run(variant, Path(tmp) / f"{variant}-{round_}")
                steps[variant] += times[1:]  # the first step of a run warms its optimizer state up
                median = statistics.median(times[1:])
                windows[variant] += [max(times[due - 1:due - 1 + WINDOW]) - median
                                     for due in range(EVERY, STEPS + 1, EVERY)]
                extras[variant].append(extra)
    base = statistics.mean(steps["none"])
    state_mb = extras["none"][0]["state_mb"]
    print(f"state: {state_mb:.0f} MB (weights + AdamW moments), {ROUNDS} rounds x {STEPS} steps, "
          f"a snapshot or save every {EVERY} steps; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'variant':<34}{'mean step ms':>14}{'longest ms':>12}{'vs none':>9}")
    names = {"none": "no snapshots", "snapshot_every": "snapshot_every (ours, async)",
             "snapshot_every_fresh": "snapshot_every, fresh host copies",
             "snapshot_every_cached": "snapshot_every, via page cache",
             "snapshot_every_unpaced": "snapshot_every, writes unpaced",
             "save_state": "save_state (ours, blocking)", "peer": "save_state (peer 1.x, blocking)"}
    for variant in variants:
        mean = statistics.mean(steps[variant])
        print(f"{names[variant]:<34}{1000 * mean:>14.1f}{1000 * max(steps[variant]):>12.1f}{mean / base:>9.3f}")
    for variant in ("snapshot_every", "snapshot_every_fresh", "snapshot_every_cached", "snapshot_every_unpaced"):
        copy_ms = statistics.median(e["host_copy_ms"] for e in extras[variant])
        first_ms = statistics.median(e["first_copy_ms"] for e in extras[variant])
        write_ms = statistics.mean(e["write_ms"] for e in extras[variant])
        print(f"{names[variant]}: host copy {copy_ms:.0f} ms on the training path (the first {first_ms:.0f} ms); "
              f"background write {write_ms:.0f} ms")
    stall = {v: (max(steps[v]) - statistics.median(steps[v])) * 1000 for v in variants}
    print(f"longest step's stall over the median step: snapshot_every {stall['snapshot_every']:.0f} ms "
          f"(fresh copies {stall['snapshot_every_fresh']:.0f} ms, page cache {stall['snapshot_every_cached']:.0f} ms, unpaced {stall['snapshot_every_unpaced']:.0f} ms), none {stall['none']:.0f} ms, "
          f"save_state {stall['save_state']:.0f} ms, peer {stall['peer']:.0f} ms "
          f"(peer/snapshot_every: {stall['peer'] / max(stall['snapshot_every'], 1e-9):.1f}x)")
    print(f"each snapshot's stall (its worst step of the {WINDOW} from its step on, over the run's median; "
          "'none': the same steps without snapshots, the machine's noise), median / largest of "
          f"{len(windows['none'])}:")
    print("  " + ", ".join(f"{v} {1000 * statistics.median(windows[v]):.0f} / {1000 * max(windows[v]):.0f} ms"
                           for v in variants))


if __name__ == "__main__":
    main()
