"""The runtime inside workers started by ``notebook_launcher``, and the same code under ``torchrun``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from notebook_accel import Accelerator, notebook_launcher
from tests.runtime_scripts import same_code
from tests.runtime_support import no_worker_left_behind, torchrun  # noqa: F401  (fixture overrides conftest's)

pytestmark = pytest.mark.slow


def test_an_accelerator_in_the_parent_does_not_stop_a_launch():
    Accelerator()  # as in a kernel that made one first: no process group may exist afterwards
    assert not dist.is_initialized()
    results = notebook_launcher(same_code.train, args=(4, 2, False), num_processes=2, return_all=True)
    assert [r["world"] for r in results] == [2, 2] and results[0]["type"] == "MULTI_CPU"
    assert torch.equal(results[0]["weights"], results[1]["weights"])  # DDP kept the ranks in step


def test_same_function_under_notebook_launcher_and_torchrun_is_bit_identical(tmp_path: Path):
    launched = notebook_launcher(same_code.train, num_processes=2, mixed_precision="no", return_all=True)
    torchrun(Path(same_code.__file__), tmp_path, None)
    by_torchrun = [torch.load(tmp_path / f"same_code_rank{r}.pt", weights_only=True) for r in range(2)]
    for ours, theirs in zip(launched, by_torchrun, strict=True):
        assert torch.equal(ours["weights"], theirs["weights"])
        assert (ours["world"], ours["type"]) == (theirs["world"], theirs["type"]) == (2, "MULTI_CPU")


def test_launcher_mixed_precision_reaches_the_accelerator():
    results = notebook_launcher(same_code.train, args=(8, 1, False), num_processes=2, mixed_precision="bf16",
                                return_all=True)
    assert [r["mp"] for r in results] == ["bf16", "bf16"]


def test_two_workers_match_one_process_reference():
    results = notebook_launcher(same_code.train, args=(4, 2, False, 0.0), num_processes=2, return_all=True)
    ref = same_code.model(dropout=0.0)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        for x, y in DataLoader(same_code.data(), batch_size=16):  # 2 workers x 4 x 2 accumulation steps
            opt.zero_grad()
            torch.nn.functional.mse_loss(ref(x), y).backward()
            opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    for r in results:
        assert (r["weights"] - expected).abs().max() < 1e-5
