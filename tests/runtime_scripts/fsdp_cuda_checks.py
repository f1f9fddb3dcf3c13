"""FSDP2 on CUDA/NCCL for ``torchrun --nproc-per-node 2`` on a machine with 2+ GPUs.

Usage: ``fsdp_cuda_checks.py OUT_DIR PHASE``: ``train`` (bf16 with pinned CPU offload against
the 1-process fp32 reference; a sharded checkpoint half way) or ``resume`` (a fresh launch
that loads it). Each rank writes ``OUT_DIR/<phase>_rank<r>.json``.
"""

from __future__ import annotations

import json
import os

import torch
from fsdp_checks import OUT, PHASE, block_plugin, data, reference, resume_run, sharded_run

from notebook_accel import Accelerator


def main() -> None:
    results: dict = {}
    if PHASE == "train":
        ref_losses, _, _ = reference(batch=8, steps=10)
        acc = Accelerator(mixed_precision="bf16", fsdp_plugin=block_plugin(cpu_offload=True))
        run = sharded_run(acc, per_rank=4, steps=10)
        shards = [p.to_local() for p in run["model"].parameters()]
        results["offload_bf16"] = {
            "device": str(acc.device),
            "loss_rel": max(abs(a - b) / abs(b) for a, b in zip(run["losses"], ref_losses, strict=True)),
            "shard_devices": sorted({str(s.device) for s in shards}),
            "pinned": all(s.is_pinned() for s in shards), "shard_dtypes": run["shard_dtypes"],
            "shard_fraction": run["shard_fraction"],
        }
        x, _ = data()[:4]
        results["output_device"] = str(run["model"](x.to(acc.device)).device)
        results["uninterrupted"] = resume_run(Accelerator(fsdp_plugin=block_plugin()), steps=10, save_at=5)
    else:
        results["resumed"] = resume_run(Accelerator(fsdp_plugin=block_plugin()), steps=10, save_at=None, start=5)
    (OUT / f"{PHASE}_rank{os.environ['RANK']}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    main()
