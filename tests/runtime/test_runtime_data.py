"""Data loading with real DataLoader worker processes (tests/unit/test_runtime_data.py has the rest)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from notebook_accel import Accelerator
from tests.unit.test_runtime_data import NoisyDataset


def test_worker_processes_are_seeded_from_the_checkpointed_generator():
    def epochs(resume_from=None):
        torch.manual_seed(0)
        acc = Accelerator()
        loader = acc.prepare(DataLoader(NoisyDataset(), batch_size=4, shuffle=True, num_workers=2))
        if resume_from is not None:
            loader.load_state_dict(resume_from)
        out = [torch.cat(list(loader)).tolist() for _ in range(2)]
        return out, loader.state_dict()

    first, _ = epochs()
    again, _ = epochs()
    assert first == again  # same seed, same samples, workers included
    assert first[0] != first[1]
    torch.manual_seed(0)
    acc = Accelerator()
    loader = acc.prepare(DataLoader(NoisyDataset(), batch_size=4, shuffle=True, num_workers=2))
    list(loader)
    resumed, _ = epochs(resume_from=loader.state_dict())
    assert resumed[0] == first[1]  # restoring the generator replays the next epoch exactly
