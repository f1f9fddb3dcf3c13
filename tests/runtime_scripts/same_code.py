"""One training function, run both by ``notebook_launcher`` and by ``torchrun`` (unchanged).

``python -m torch.distributed.run --nproc-per-node 2 same_code.py OUT_DIR`` writes
``OUT_DIR/same_code_rank<r>.pt``; ``tests/runtime/test_runtime_launcher.py`` launches
``train`` from a notebook-like parent and compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(48, 3, generator=g)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]))


def model(dropout: float = 0.2) -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(dropout), torch.nn.Linear(4, 1))


def train(per_rank_batch: int = 4, accumulation: int = 2, shuffle: bool = True, dropout: float = 0.2) -> dict:
    """A small training loop: shuffling, dropout, momentum, accumulation."""
    torch.manual_seed(0)
    acc = Accelerator(gradient_accumulation_steps=accumulation)
    m = model(dropout)
    m, opt, loader = acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                 DataLoader(data(), batch_size=per_rank_batch, shuffle=shuffle))
    for _ in range(2):
        for x, y in loader:
            with acc.accumulate(m):
                acc.backward(torch.nn.functional.mse_loss(m(x), y))
                opt.step()
                opt.zero_grad()
    weights = torch.cat([p.detach().reshape(-1) for p in acc.unwrap_model(m).parameters()])
    return {"weights": weights, "world": acc.num_processes, "rank": acc.process_index,
            "mp": acc.mixed_precision, "type": acc.distributed_type.value}


if __name__ == "__main__":
    result = train()
    torch.save(result, Path(sys.argv[1]) / f"same_code_rank{result['rank']}.pt")
