"""FSDP2 on 2 GPUs with NCCL: bf16 with pinned CPU offload, and a sharded resume.

Marked ``gpu``; skipped (saying why) without 2 CUDA devices. About a minute on 2 GPUs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.runtime_support import torchrun

SCRIPT = Path(__file__).parents[1] / "runtime_scripts" / "fsdp_cuda_checks.py"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2,
                                                   reason="needs 2 CUDA devices (NCCL: one GPU per rank)")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("fsdp_cuda")
    return {"train": torchrun(SCRIPT, out, "train"), "resume": torchrun(SCRIPT, out, "resume")}


def test_bf16_with_pinned_cpu_offload_matches_fp32_on_one_process(runs):
    for rank in runs["train"]:
        case = rank["offload_bf16"]
        assert case["device"].startswith("cuda") and case["loss_rel"] <= 2e-2, case
        assert case["shard_devices"] == ["cpu"] and case["pinned"] and case["shard_dtypes"] == ["torch.float32"]
        assert case["shard_fraction"] <= 0.51
        assert rank["output_device"].startswith("cuda")


def test_sharded_resume_on_gpus_is_bit_exact(runs):
    for train, resume in zip(runs["train"], runs["resume"], strict=True):
        assert resume["resumed"] == {"losses": train["uninterrupted"]["losses"][5:],
                                     "params": train["uninterrupted"]["params"]}
