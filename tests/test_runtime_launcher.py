"""The runtime inside workers started by ``notebook_launcher`` (the way a notebook uses it)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator, notebook_launcher
from tests.runtime_support import no_worker_left_behind  # noqa: F401  (overrides conftest's)

pytestmark = pytest.mark.slow


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(48, 3, generator=g)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]))


def model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Linear(3, 1)


def train(per_rank_batch: int, accumulation: int) -> dict:
    acc = Accelerator(gradient_accumulation_steps=accumulation)
    m = model()
    m, opt, loader = acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                 DataLoader(data(), batch_size=per_rank_batch))
    for x, y in loader:
        with acc.accumulate(m):
            acc.backward(torch.nn.functional.mse_loss(m(x), y))
            opt.step()
            opt.zero_grad()
    weights = torch.cat([p.detach().reshape(-1) for p in acc.unwrap_model(m).parameters()])
    return {"weights": weights, "world": acc.num_processes, "mp": acc.mixed_precision,
            "type": acc.distributed_type.value}


def test_training_in_launched_workers_matches_one_process():
    Accelerator()  # an Accelerator in the kernel first: it must not stop the launch (no process group)
    assert not dist.is_initialized()
    results = notebook_launcher(train, args=(4, 2), num_processes=2, mixed_precision="no", return_all=True)
    ref = model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in DataLoader(data(), batch_size=16):  # 2 workers x 4 x 2 accumulation steps
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    for r in results:
        assert (r["world"], r["mp"], r["type"]) == (2, "no", "MULTI_CPU")
        assert (r["weights"] - expected).abs().max() < 1e-5


def test_launcher_mixed_precision_reaches_the_accelerator():
    results = notebook_launcher(train, args=(8, 1), num_processes=2, mixed_precision="bf16", return_all=True)
    assert [r["mp"] for r in results] == ["bf16", "bf16"]
