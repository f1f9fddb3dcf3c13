"""Step overhead: our Accelerator vs a hand-written DDP loop vs the peer's Accelerator.

Same small MLP, same synthetic data, 2 workers, gloo on CPU; the three loops run in the same processes,
in alternating order, and each round's steps/s are compared pairwise, so drift in
machine load cancels out. Run::

    ACCELERATE_USE_CPU=yes torchrun --nproc-per-node 2 benchmarks/step_overhead.py [ROUNDS] [STEPS]

Prints steps/s (median of rounds) and the median per-round ratios
ours/hand-DDP (goal >= 0.97) and ours/peer (goal >= 1.0).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 9
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 60
BATCH = 64  # per worker


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH * 2 * STEPS, 256, generator=g)
    return TensorDataset(x, torch.randint(0, 10, (len(x),), generator=g))


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def timed_epoch(model, opt, loader, backward) -> float:
    steps, start = 0, time.perf_counter()
    for x, y in loader:
        backward(torch.nn.functional.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
        steps += 1
    return steps / (time.perf_counter() - start)


def accelerated(accelerator_class):
    acc = accelerator_class(cpu=True)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, DataLoader(dataset(), batch_size=BATCH, shuffle=True))
    return lambda: timed_epoch(model, opt, loader, acc.backward)


def hand_written_ddp():
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = dataset()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    epoch = [0]

    def run() -> float:
        sampler.set_epoch(epoch[0])
        epoch[0] += 1
        return timed_epoch(model, opt, loader, lambda loss: loss.backward())

    return run


def main() -> None:
    from accelerate import Accelerator as PeerAccelerator

    from notebook_accel import Accelerator

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    loops = {"ours": accelerated(Accelerator), "hand_ddp": hand_written_ddp(), "peer": accelerated(PeerAccelerator)}
    for run in loops.values():
        run()  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in loops}
    for r in range(ROUNDS):
        for name in list(loops) if r % 2 == 0 else list(reversed(loops)):
            dist.barrier()
            rates[name].append(loops[name]())
    if dist.get_rank() == 0:
        for name, values in rates.items():
            print(f"{name:9s} {statistics.median(values):7.1f} steps/s   rounds: "
                  + " ".join(f"{v:.0f}" for v in values))
        for other in ("hand_ddp", "peer"):
            ratios = [a / b for a, b in zip(rates["ours"], rates[other], strict=True)]
            print(f"ours/{other:8s} {statistics.median(ratios):.3f} (median of per-round ratios, "
                  f"min {min(ratios):.3f}, max {max(ratios):.3f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
