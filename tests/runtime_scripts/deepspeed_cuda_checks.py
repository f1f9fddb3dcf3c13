"""DeepSpeed ZeRO-3 on CUDA/NCCL for ``torchrun --nproc-per-node 2`` on a machine with 2+ GPUs.

Usage: ``deepspeed_cuda_checks.py OUT_DIR PHASE``: ``train`` (ZeRO-3 in bf16 with the optimizer
offloaded to pinned CPU memory, against the 1-process reference; a checkpoint half way) or
``resume`` (a fresh launch that loads it). Each rank writes ``OUT_DIR/<phase>_rank<r>.json``.
"""

from __future__ import annotations

import json
import os

import torch.distributed as dist
from deepspeed_checks import OUT, PHASE, compare, reference, resume_run, zero_run

from notebook_accel import Accelerator, DeepSpeedPlugin


def plugin() -> DeepSpeedPlugin:
    return DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu")


def main() -> None:
    results: dict = {}
    if PHASE == "train":
        acc = Accelerator(mixed_precision="bf16", deepspeed_plugin=plugin())
        run = zero_run(acc)
        engine = run["model"]
        results["zero3_offload_bf16"] = {
            **compare(run, reference(bf16=True)), "device": str(acc.device), "backend": dist.get_backend(),
            "param_devices": sorted({str(p.ds_tensor.device) for p in engine.parameters()}),
            "param_dtypes": sorted({str(p.dtype) for p in engine.parameters()}),
        }
        acc.free_memory()
        results["uninterrupted"] = resume_run(Accelerator(deepspeed_plugin=plugin()), save_at=5)
    else:
        results["resumed"] = resume_run(Accelerator(deepspeed_plugin=plugin()), save_at=None, start=5)
    (OUT / f"{PHASE}_rank{os.environ['RANK']}.json").write_text(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
