"""Item 4: FSDP2 and DeepSpeed ZeRO-3 on the GPU.

One GPU, so one rank: FSDP2 shards over a group of one (the single-GPU case that matters: CPU
offload of what the GPU cannot hold) and ZeRO-3 runs with its optimizer offloaded to the CPU. The
optimizer is DeepSpeed's CPU Adam, so its op is compiled on the spot (timed), and so is the CUDA
FusedAdam op with the machine's nvcc (timed). Without a GPU the same jobs run on two CPU
processes (gloo), with torch's AdamW, and the items say "N/A".
"""

from __future__ import annotations

import os
import time

from common import GPU, Report

from notebook_accel import notebook_launcher

LAUNCH = {"num_processes": 1} if GPU else {"num_processes": 2, "device": "cpu"}


def make(layers: int):
    """A small MLP (the same weights every time); defined here, it travels to the workers by value."""
    import torch

    torch.manual_seed(0)
    widths = [32] + [64] * (layers - 1)
    body = [m for a, b in zip(widths, widths[1:], strict=False) for m in (torch.nn.Linear(a, b), torch.nn.Tanh())]
    return torch.nn.Sequential(*body, torch.nn.Linear(widths[-1], 8))


def data():
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(80, 32, generator=g), torch.randn(80, 8, generator=g)


def reference_losses(layers: int, optimizer, lr: float) -> list[float]:
    """One process, fp32, no Accelerator: the global batches of 16."""
    import torch

    (xs, ys), model = data(), make(layers)
    opt, losses = optimizer(model.parameters(), lr=lr), []
    for i in range(5):
        loss = torch.nn.functional.mse_loss(model(xs[16 * i:16 * i + 16]), ys[16 * i:16 * i + 16])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def prepared_run(acc, model, opt) -> tuple:
    """Prepare, train on this rank's share of the same batches; the losses averaged over ranks."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(*data()), batch_size=16 // acc.num_processes)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(acc.reduce(loss.detach(), "mean").item())
    return model, opt, losses


def rel(losses: list[float], ref: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(losses, ref, strict=True))


def fsdp_job(offload: bool) -> dict:
    import torch

    from notebook_accel import Accelerator
    from notebook_accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

    torch.backends.cuda.matmul.allow_tf32 = False
    ref = reference_losses(3, torch.optim.SGD, 0.1)
    acc = Accelerator(mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin(cpu_offload=offload))
    model = make(3)
    seen: list = []
    model[0].register_forward_hook(lambda m, i, o: seen.append((o.dtype, str(o.device))))
    model, _, losses = prepared_run(acc, model, torch.optim.SGD(model.parameters(), lr=0.1))
    shards = [p.to_local() for p in model.parameters()]
    return {"type": acc.distributed_type.value, "world": acc.num_processes, "device": str(acc.device),
            "compute": [str(seen[0][0]), seen[0][1]], "shard_devices": sorted({str(s.device) for s in shards}),
            "pinned": all(s.is_pinned() for s in shards), "shard_dtypes": sorted({str(s.dtype) for s in shards}),
            "loss_rel": rel(losses, ref),
            "peak_gpu_mb": torch.cuda.max_memory_allocated() >> 20 if torch.cuda.is_available() else 0}


def zero3_job(cpu_adam: bool) -> dict:
    import time

    import torch
    import torch.distributed as dist

    from notebook_accel import Accelerator, DeepSpeedPlugin

    torch.backends.cuda.matmul.allow_tf32 = False
    ref = reference_losses(2, torch.optim.AdamW, 1e-2)
    acc = Accelerator(mixed_precision="bf16",
                      deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu"))
    model = make(2)
    start = time.perf_counter()
    if cpu_adam:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = DeepSpeedCPUAdam(model.parameters(), lr=1e-2)  # builds (compiles) the cpu_adam op
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optimizer_s = time.perf_counter() - start
    model, opt, losses = prepared_run(acc, model, opt)
    return {"type": acc.distributed_type.value, "backend": dist.get_backend(), "device": str(acc.device),
            "optimizer": type(opt.optimizer if hasattr(opt, "optimizer") else opt).__name__,
            "optimizer_build_s": round(optimizer_s, 2),
            "param_devices": sorted({str(p.ds_tensor.device) for p in model.parameters()}),
            "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "loss_rel": rel(losses, ref), "losses": [round(v, 5) for v in losses]}


def fsdp(offload: bool) -> tuple[bool, dict, str]:
    r = notebook_launcher(fsdp_job, args=(offload,), **LAUNCH)
    want_device = "cuda" if GPU else "cpu"
    passed = (r["type"] == "FSDP" and r["shard_dtypes"] == ["torch.float32"] and r["loss_rel"] < 3e-2
              and r["compute"][0] == "torch.bfloat16" and r["compute"][1].startswith(want_device))
    if offload:
        passed = passed and r["shard_devices"] == ["cpu"] and (r["pinned"] or not GPU)
    else:
        passed = passed and all(d.startswith(want_device) for d in r["shard_devices"])
    return passed, r, ""


def zero3() -> tuple[bool, dict, str]:
    r = notebook_launcher(zero3_job, args=(GPU,), **LAUNCH)
    passed = (r["type"] == "DEEPSPEED" and r["backend"] == ("nccl" if GPU else "gloo")
              and r["param_dtypes"] == ["torch.bfloat16"] and r["loss_rel"] < 5e-2)
    return passed, r, ""


def fused_adam_build() -> tuple[bool, dict, str]:
    import torch
    from deepspeed.ops.op_builder import FusedAdamBuilder

    # DeepSpeed 0.19 cannot parse an arch with a suffix ("9.0a") in TORCH_CUDA_ARCH_LIST: build for
    # this GPU's plain compute capability, and say what the machine had set
    had = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = "{}.{}".format(*torch.cuda.get_device_capability(0))
    start = time.perf_counter()
    try:
        FusedAdamBuilder().load()
    finally:
        if had is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = had
    return True, {"nvcc_build_s": round(time.perf_counter() - start, 1), "machine_arch_list": had}, ""


def main() -> None:
    report = Report()
    report.run("4a", "FSDP2 bf16 mixed precision, fp32 master weights (shards on the GPU)", lambda: fsdp(False))
    report.run("4b", "FSDP2 bf16 with CPU offload in pinned memory", lambda: fsdp(True))
    report.run("4c", "DeepSpeed ZeRO-3 bf16, optimizer offloaded (CPU Adam compiled on the spot)", zero3)
    if GPU:
        report.run("4d", "DeepSpeed FusedAdam compiled with the machine's nvcc", fused_adam_build)
    else:
        report.skip("4d", "DeepSpeed FusedAdam compiled with the machine's nvcc", "nvcc builds need CUDA")
    report.emit()


if __name__ == "__main__":
    main()
