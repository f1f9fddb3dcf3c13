"""DeepSpeed ZeRO-3 on 2 GPUs with NCCL: bf16 with the optimizer offloaded to the CPU, and a resume.

Marked ``gpu``; skipped (saying why) without 2 CUDA devices or without deepspeed. About a minute
on 2 GPUs (DeepSpeed may compile nothing here: the optimizer is the user's torch one).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.runtime_support import torchrun

SCRIPT = Path(__file__).parents[1] / "runtime_scripts" / "deepspeed_cuda_checks.py"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL: one GPU per rank)"),
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("deepspeed_cuda")
    return {"train": torchrun(SCRIPT, out, "train", timeout=170), "resume": torchrun(SCRIPT, out, "resume")}


def test_zero3_bf16_with_cpu_offload_matches_one_process(runs):
    for rank in runs["train"]:
        case = rank["zero3_offload_bf16"]
        assert case["device"].startswith("cuda") and case["backend"] == "nccl", case
        assert case["loss_rel"] <= 3e-3 and case["param_fraction"] == 0.5, case
        assert case["param_devices"] == [case["device"]] and case["param_dtypes"] == ["torch.bfloat16"], case


def test_zero3_resume_on_gpus_is_bit_exact(runs):
    for train, resume in zip(runs["train"], runs["resume"], strict=True):
        full, resumed = train["uninterrupted"], resume["resumed"]
        assert resumed == {"losses": full["losses"][5:], "params": full["params"], "lr": full["lr"]}
