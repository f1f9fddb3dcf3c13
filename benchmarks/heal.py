"""A rank's death in a warm pool: the heal in place against replacing every rank, measured in one run.

For each model size (parameters in float32, one DDP model with an SGD optimizer with momentum,
trained one step so that its buckets and optimizer state exist) and rank count, rank 1 is
SIGKILLed while the pool is idle and the next run recovers. Printed per case: the heal's time
(start of the new rank, the new group, fingerprints, the copy, the rebuilt wrappers), replacing
every rank (heal=False) and that plus running the setup again (what a user would do to get back:
here seconds, in a notebook the hours that built the state), and the kernel's resident memory
during each (sampled every 5 ms: the kernel never holds a copy of the model).

    python benchmarks/heal.py [--sizes 10,100,1000] [--ranks 2,4] [--also 3x100]

Targets (issue 44, this 2-core machine): 100 MB with 3 ranks healed in <= 5 s; the kernel's
resident memory grows by < 50 MB.
"""

from __future__ import annotations

import argparse
import os
import signal
import textwrap
import threading
import time

import psutil

from notebook_accel import WorkerPool

SOURCE = textwrap.dedent("""
    def setup(megabytes):
        global acc, model, opt, step
        import math, torch
        from notebook_accel import Accelerator
        acc = Accelerator()
        torch.manual_seed(0)
        side = int(math.sqrt(megabytes * 1024 * 1024 / 4))
        model = torch.nn.Linear(side, side, bias=False)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        model, opt = acc.prepare(model, opt)
        opt.zero_grad()
        acc.backward(model(torch.ones(1, side)).sum())
        opt.step()
        step = 1

    def ready():
        import torch
        import torch.distributed as dist
        t = torch.ones(1)
        dist.all_reduce(t)
        mine = torch.stack([p.detach().sum(dtype=torch.float64) for p in model.parameters()]
                           + [s["momentum_buffer"].sum(dtype=torch.float64) for s in opt.state.values()])
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        assert all(torch.equal(every[0], other) for other in every), "the replicas differ"
        return t.item()
""")


def notebook() -> dict:
    scope = {"__name__": "__main__"}
    exec(compile(SOURCE, "<notebook cell>", "exec"), scope)  # noqa: S102 - notebook functions
    return scope


class PeakRss:
    """The kernel's resident memory, sampled every 5 ms while the block runs: its growth."""

    def __enter__(self) -> PeakRss:
        self._me = psutil.Process()
        self.base = self.peak = self._me.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._me.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def grew_mb(self) -> float:
        return (self.peak - self.base) / 1e6


def _kill_rank_1(pool: WorkerPool) -> None:
    pid = pool.status()[1].pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pool.status()[1].alive and time.monotonic() < deadline:
        time.sleep(0.01)


def measure(megabytes: int, ranks: int, cells: dict) -> dict:
    """One case: the heal, then replace-all (and the setup again), each after killing rank 1."""
    figures: dict = {}
    for heal in (True, False):
        with WorkerPool(num_processes=ranks, output="none", heal=heal) as pool:
            pool.run(cells["setup"], megabytes)
            _kill_rank_1(pool)
            with PeakRss() as rss:
                start = time.perf_counter()
                pool.revive()
                recovered = time.perf_counter() - start
            if heal:
                assert pool.run(cells["ready"]) == float(ranks)  # one group, equal replicas
                assert set(pool.names) >= {"acc", "model", "opt", "step"}, pool.names
                healed = pool.last_heal
                figures.update(heal=recovered, heal_rss=rss.grew_mb, phases={
                    "start": healed.start, **healed.report.seconds})
            else:
                start = time.perf_counter()
                pool.run(cells["setup"], megabytes)  # what a user runs again to get back
                assert pool.run(cells["ready"]) == float(ranks)
                figures.update(replace=recovered, replace_rss=rss.grew_mb,
                               replace_setup=recovered + time.perf_counter() - start)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000", help="model sizes in MB")
    parser.add_argument("--ranks", default="2,4", help="rank counts")
    parser.add_argument("--also", default="3x100", help="extra RANKSxMB cases (the target's)")
    args = parser.parse_args()
    cases = [(int(r), int(s)) for s in args.sizes.split(",") for r in args.ranks.split(",")]
    cases += [tuple(int(x) for x in case.split("x")) for case in args.also.split(",") if case]
    cells = notebook()
    print(f"{'ranks':>5} {'MB':>6} | {'heal s':>7} {'kernel +MB':>10} | {'replace s':>9} "
          f"{'kernel +MB':>10} {'+setup s':>8} | heal / (replace+setup)")
    for ranks, megabytes in cases:
        f = measure(megabytes, ranks, cells)
        print(f"{ranks:>5} {megabytes:>6} | {f['heal']:>7.2f} {f['heal_rss']:>10.1f} | "
              f"{f['replace']:>9.2f} {f['replace_rss']:>10.1f} {f['replace_setup']:>8.2f} | "
              f"{f['heal'] / f['replace_setup']:.2f}x", flush=True)
        print("        the heal's parts (rank 0): " + ", ".join(
            f"{phase} {seconds:.2f} s" for phase, seconds in f["phases"].items()), flush=True)


if __name__ == "__main__":
    main()
