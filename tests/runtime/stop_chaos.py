"""The stop button pressed at random moments of a warm pool's DDP or FSDP2 training (shared by
the chaos test and ``benchmarks/stop_button.py``).

A press is SIGINT to this process (what the notebook's stop button sends the kernel). After
each press every rank must still be the same process holding the same objects, with the same
step count as its peer, replicas equal, and a correct ``all_reduce``; at the end the training
must equal an uninterrupted run of as many steps.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import textwrap
import threading
import time
from dataclasses import dataclass, field

from notebook_accel import WorkerError, WorkerPool

SOURCE = textwrap.dedent("""
    import os, time

    def setup(seed):
        global acc, model, opt, data, steps
        import torch
        from notebook_accel import Accelerator
        acc = Accelerator()
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        model, opt = acc.prepare(model, opt)
        data = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed))
        steps = 0

    def train(until):
        global steps
        import torch
        while steps < until:
            index = (torch.arange(4) + steps * 8 + acc.process_index * 4) % 64
            opt.zero_grad()
            loss = model(data[index]).pow(2).mean()
            acc.backward(loss)
            opt.step()
            steps += 1
        return steps

    def look():
        import torch
        import torch.distributed as dist
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        weights = [p.detach().clone() for p in acc.unwrap_model(model).parameters()]
        return os.getpid(), id(model), steps, t.item(), [w.flatten().tolist() for w in weights]
""")


def notebook() -> dict:
    scope = {"__name__": "__main__"}
    exec(compile(SOURCE, "<notebook cell>", "exec"), scope)  # noqa: S102 - notebook functions
    return scope


@dataclass
class ChaosResult:
    presses: int = 0
    stop_seconds: list[float] = field(default_factory=list)
    replaced: int = 0
    kills: int = 0  # events that SIGKILLed a rank instead of pressing stop
    healed: int = 0  # kills after which the pool healed in place
    problems: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # presses stopped at once, workers replaced
    steps: int = 0
    final_diff: float | None = None


def _press_after(seconds: float, pressed: list[float]) -> threading.Timer:
    def press() -> None:
        pressed.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(seconds, press)
    timer.start()
    return timer


def run_chaos(presses: int, options: dict, seed: int = 0, delays: tuple[float, float] = (0.02, 0.4),
              on_stderr=None, kills: float = 0.0) -> ChaosResult:
    """Press stop ``presses`` times at random moments of ``train``; check after each. With
    ``kills``, that share of the events SIGKILLs a random rank instead (the pool must heal:
    the other rank the same process, the killed one new, the state kept)."""
    cells, rng, result = notebook(), random.Random(seed), ChaosResult()
    with WorkerPool(num_processes=2, return_all=True, **options) as pool:
        pool.run(cells["setup"], 0)
        first = pool.run(cells["look"])
        pids, ids = [r[0] for r in first], [r[1] for r in first]
        for press in range(presses):
            victim = rng.randrange(2) if rng.random() < kills else None
            if victim is not None:
                said = _kill_during(pool, cells, pids[victim], rng.uniform(*delays), result, press)
                looks = pool.run(cells["look"])
                if "The pool healed" not in said:
                    result.problems.append(f"kill {press}: not healed: {said}")
                elif [r[0] == p for r, p in zip(looks, pids, strict=True)] != [r != victim for r in range(2)]:
                    result.problems.append(f"kill {press}: pids {pids} -> {[r[0] for r in looks]}")
                else:
                    result.healed += 1
                pids = [r[0] for r in looks]
                ids = [r[1] for r in looks]  # the new rank's objects are its own
                _check(result, f"kill {press}", looks)
                continue
            pressed: list[float] = []
            timer = _press_after(rng.uniform(*delays), pressed)
            said = ""
            try:
                pool.run(cells["train"], 10**9)
                result.problems.append(f"press {press}: the run was not interrupted")
            except KeyboardInterrupt as error:
                said = str(error)
            timer.join()
            if pressed:
                result.stop_seconds.append(time.monotonic() - pressed[0])
            result.presses += 1
            try:
                looks = pool.run(cells["look"])
            except WorkerError:  # the state is gone: the workers were replaced (and said so)
                looks = None
            if looks is None or [r[0] for r in looks] != pids or [r[1] for r in looks] != ids:
                result.replaced += 1  # said, never silent; the series goes on from a fresh state
                result.fallbacks.append(f"press {press}: {said}")
                pool.run(cells["setup"], 0)
                first = pool.run(cells["look"])
                pids, ids = [r[0] for r in first], [r[1] for r in first]
                continue
            if "keeps its state" not in said:
                result.problems.append(f"press {press}: kept, but said {said!r}")
            _check(result, f"press {press}", looks)
        if result.replaced or result.problems:  # the comparison needs one unbroken series;
            return result  # ranks out of step would also hang a further run
        result.steps = pool.run(cells["look"])[0][2]
        pool.run(cells["train"], result.steps + 20)  # and it trains on
        result.steps += 20
        interrupted = pool.run(cells["look"])[0][4]
    with WorkerPool(num_processes=2, return_all=True, **options) as reference:
        reference.run(cells["setup"], 0)
        reference.run(cells["train"], result.steps)
        uninterrupted = reference.run(cells["look"])[0][4]
    result.final_diff = max(abs(a - b) for wa, wb in zip(interrupted, uninterrupted, strict=True)
                            for a, b in zip(wa, wb, strict=True))
    return result


def _kill_during(pool: WorkerPool, cells: dict, pid: int, after: float, result: ChaosResult,
                 event: int) -> str:
    """SIGKILL ``pid`` ``after`` seconds into a training run; what the pool said it did."""
    timer = threading.Timer(after, os.kill, (pid, signal.SIGKILL))
    timer.start()
    said = ""
    try:
        pool.run(cells["train"], 10**9)
        result.problems.append(f"kill {event}: the run was not stopped")
    except WorkerError as error:
        said = error.recovery
    timer.join()
    result.kills += 1
    return said


def _check(result: ChaosResult, event: str, looks: list) -> None:
    """After an event: the same step on both ranks, one group, equal replicas."""
    if looks[0][2] != looks[1][2]:
        result.problems.append(f"{event}: steps differ {looks[0][2]} vs {looks[1][2]}")
    if [r[3] for r in looks] != [3.0, 3.0]:
        result.problems.append(f"{event}: all_reduce gave {[r[3] for r in looks]}")
    if looks[0][4] != looks[1][4]:
        result.problems.append(f"{event}: the replicas differ")


def summary(result: ChaosResult) -> str:
    stops = sorted(result.stop_seconds) or [float("nan")]
    diff = "n/a" if result.final_diff is None else f"{result.final_diff:.2e}"
    return (f"{result.presses} presses, {result.steps} steps: stop after the press median "
            f"{statistics.median(stops):.3f} s, max {stops[-1]:.3f} s; workers replaced "
            f"{result.replaced}; ranks killed {result.kills}, healed {result.healed}; final "
            f"weights vs an uninterrupted run: max diff "
            f"{diff}")
