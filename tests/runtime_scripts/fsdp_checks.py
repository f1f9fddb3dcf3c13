"""FSDP2 checks for ``torchrun --nproc-per-node 2`` (gloo, CPU); one launch covers many checks.

Usage: ``fsdp_checks.py OUT_DIR PHASE`` where PHASE is ``train`` (equivalence with a
1-process reference in fp32 / bf16 / with accumulation and clipping / activation
checkpointing / CPU offload / rank-0 loading, memory while checkpointing, full
weights, and an uninterrupted run that writes a sharded checkpoint half way) or
``resume`` (fresh processes that load it and finish the run). Each rank writes
``OUT_DIR/<phase>_rank<r>.json``; the pytest side asserts on them.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
from pathlib import Path

import psutil
import torch
from tiny_lm import Block, TinyLM, data, flat, lm_loss, make_model
from torch.utils.data import DataLoader

from notebook_accel import Accelerator
from notebook_accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

faulthandler.dump_traceback_later(float(os.environ.get("DDP_CHECKS_TIMEOUT", "100")), exit=True)

OUT = Path(sys.argv[1])
PHASE = sys.argv[2]
results: dict = {}


def reference(batch: int, steps: int, clip: float | None = None) -> tuple[list[float], torch.Tensor, list[float]]:
    """One process, no Accelerator, batches of ``batch``."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, norms = [], []
    for (x, y), _ in zip(DataLoader(data(), batch_size=batch), range(steps), strict=False):
        opt.zero_grad()
        loss = lm_loss(model, x, y)
        loss.backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        losses.append(float(loss))
    return losses, flat(model), norms


def sharded_run(acc: Accelerator, per_rank: int, steps: int, clip: float | None = None,
                model: torch.nn.Module | None = None) -> dict:
    model = make_model() if model is None else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data(), batch_size=per_rank))
    info: dict = {"losses": [], "norms": [], "grads_before_sync": []}
    local = sum(p.to_local().numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    info["shard_fraction"] = local / total
    info["shard_dtypes"] = sorted({str(p.dtype) for p in model.parameters()} | {
        str(p.to_local().dtype) for p in model.parameters()})
    calls = [0]
    for module in model.modules():
        if isinstance(module, Block):
            module.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    micro = []
    for x, y in loader:
        with acc.accumulate(model):
            loss = lm_loss(model, x, y)
            acc.backward(loss)
            micro.append(acc.reduce(loss.detach(), "mean"))
            if not acc.sync_gradients:
                info["grads_before_sync"].append(all(p.grad is None for p in model.parameters()))
            if acc.sync_gradients and clip is not None:
                info["norms"].append(float(acc.clip_grad_norm_(model.parameters(), clip)))
            opt.step()
            opt.zero_grad()
        if acc.sync_gradients:
            info["losses"].append(float(torch.stack(micro).mean()))
            micro = []
            if len(info["losses"]) == steps:
                break
    info["block_calls_per_step"] = calls[0] / steps / acc.gradient_accumulation_steps
    plain = acc.unwrap_model(model)
    info["params"] = flat(plain)
    info["plain_type"] = type(plain).__name__
    info["plain_has_dtensor"] = any(type(p.data).__name__ == "DTensor" for p in plain.parameters())
    info["plain_tied"] = plain.head.weight is plain.embed.weight
    info["model"] = model
    return info


def diff(a: list[float] | torch.Tensor, b: list[float] | torch.Tensor) -> float:
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


def check_equivalence() -> None:
    ref_losses, ref_params, _ = reference(batch=8, steps=10)
    # The plugin from the environment, as the launcher and `accelerate launch` set it.
    os.environ.update({"ACCELERATE_USE_FSDP": "true", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
                       "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block"})
    try:
        acc = Accelerator()
    finally:
        for key in ("ACCELERATE_USE_FSDP", "FSDP_AUTO_WRAP_POLICY", "FSDP_TRANSFORMER_CLS_TO_WRAP"):
            del os.environ[key]
    run = sharded_run(acc, per_rank=4, steps=10)
    results["distributed_type"] = acc.distributed_type.value
    results["fp32"] = {
        "loss_diff": diff(run["losses"], ref_losses), "param_diff": diff(run["params"], ref_params),
        "shard_fraction": run["shard_fraction"], "plain_type": run["plain_type"],
        "plain_has_dtensor": run["plain_has_dtensor"], "plain_tied": run["plain_tied"],
        "blocks_sharded": [type(b).__name__ for b in run["model"].blocks],
        "block_calls_per_step": run["block_calls_per_step"],
    }
    results["ref_losses"] = ref_losses

    bf16 = sharded_run(Accelerator(mixed_precision="bf16", fsdp_plugin=block_plugin()), per_rank=4, steps=10,
                       model=make_model().to(torch.bfloat16))  # loaded in bf16: master weights become fp32
    results["bf16"] = {"loss_rel": max(abs(a - b) / abs(b) for a, b in zip(bf16["losses"], ref_losses, strict=True)),
                       "shard_dtypes": bf16["shard_dtypes"]}

    acc_losses, acc_params, acc_norms = reference(batch=16, steps=5, clip=0.05)
    accum = sharded_run(Accelerator(gradient_accumulation_steps=2, fsdp_plugin=block_plugin()),
                        per_rank=4, steps=5, clip=0.05)
    results["accumulate_clip"] = {
        "loss_diff": diff(accum["losses"], acc_losses), "param_diff": diff(accum["params"], acc_params),
        "norm_diff": diff(accum["norms"], acc_norms), "norms": accum["norms"],
        "grads_before_sync": accum["grads_before_sync"],
    }

    for name, plugin in {
        "activation_checkpointing": block_plugin(activation_checkpointing=True),
        "cpu_offload": block_plugin(cpu_offload=True),
        "size_wrap_zero2": FullyShardedDataParallelPlugin(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=500,
                                                          reshard_after_forward=False),
    }.items():
        run = sharded_run(Accelerator(fsdp_plugin=plugin), per_rank=4, steps=10)
        results[name] = {"loss_diff": diff(run["losses"], ref_losses), "param_diff": diff(run["params"], ref_params),
                         "block_calls_per_step": run["block_calls_per_step"]}


def block_plugin(**kwargs) -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                          transformer_cls_names_to_wrap=["Block"], **kwargs)


def check_fp16() -> None:
    """fp16 with the GradScaler: trains like fp32; an inf on one rank's shard skips the step on every rank."""
    ref_losses, _, _ = reference(batch=8, steps=10)
    acc = Accelerator(mixed_precision="fp16", fsdp_plugin=block_plugin())
    run = sharded_run(acc, per_rank=4, steps=10)
    model, opt = run["model"], acc._optimizers[0]
    x, y = data()[:4]
    acc.backward(lm_loss(model, x, y))
    if acc.process_index == 1:
        model.embed.weight.grad.to_local()[0, 0] = float("inf")
    before = model.embed.weight.to_local().clone()
    opt.step()
    results["fp16"] = {"loss_rel": max(abs(a - b) / abs(b) for a, b in zip(run["losses"], ref_losses, strict=True)),
                       "skipped": acc.optimizer_step_was_skipped,
                       "unchanged": bool(torch.equal(before, model.embed.weight.to_local()))}


class MixedNet(torch.nn.Module):
    """An fp32 layer feeding a bf16 one: runs as is in one process."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)).to(self.b.weight.dtype)).float()


def mixed_losses(model: torch.nn.Module, acc: Accelerator | None) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if acc is not None:
        model, opt = acc.prepare(model, opt)
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(8, 8, generator=g) for _ in range(3)]
    losses = []
    for x in xs:
        part = x if acc is None else x[4 * acc.process_index: 4 * acc.process_index + 4]
        loss = model(part).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss) if acc is None else float(acc.reduce(loss.detach(), "mean")))
    return losses


def check_mixed_dtypes() -> None:
    """Parameters of two dtypes in one group: kept as they are without mixed precision, fp32 with it."""
    ref = mixed_losses(MixedNet(), None)
    plain = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    losses = mixed_losses(model := MixedNet(), plain)
    results["mixed_dtypes"] = {
        "loss_rel": max(abs(a - b) / abs(b) for a, b in zip(losses, ref, strict=True)),
        "dtypes": {n: str(p.dtype) for n, p in model.named_parameters()},
    }
    upcast = MixedNet()
    mixed_losses(upcast, Accelerator(mixed_precision="bf16", fsdp_plugin=FullyShardedDataParallelPlugin()))
    results["mixed_dtypes"]["bf16_dtypes"] = sorted({str(p.dtype) for p in upcast.parameters()})


def check_ignored_modules() -> None:
    """ignored_modules (a regex): those parameters stay plain tensors, the rest is sharded."""
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(ignored_modules=r"blocks\.0\..*"))
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    x, y = data()[:4]
    acc.backward(lm_loss(model, x, y))
    norm = acc.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    results["ignored"] = {
        "kinds": {n: type(p.data).__name__ for n, p in model.named_parameters()},
        "norm_finite": bool(torch.isfinite(norm)), "plain": type(acc.unwrap_model(model)).__name__,
    }


def check_rank0_loading() -> None:
    """cpu_ram_efficient_loading: rank 1 builds on the meta device and receives rank 0's weights."""
    acc = Accelerator(fsdp_plugin=block_plugin(cpu_ram_efficient_loading=True))
    if acc.is_main_process:
        model = make_model()
    else:
        with torch.device("meta"):
            model = TinyLM()
    model = acc.prepare(model)
    results["rank0_loading_diff"] = diff(flat(acc.unwrap_model(model)), flat(make_model()))


def check_full_weights() -> None:
    """get_state_dict / save_model give the full weights on rank 0; FULL_STATE_DICT round trip."""
    acc = Accelerator(fsdp_plugin=block_plugin(state_dict_type="FULL_STATE_DICT"))
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    x, y = data()[:8]
    acc.backward(lm_loss(model, x, y))
    acc.clip_grad_value_(model.parameters(), 1e-3)
    results["clipped_value"] = max(float(p.grad.to_local().abs().max()) for p in model.parameters())
    opt.step()
    state = acc.get_state_dict(model)
    results["state_dict_keys"] = sorted(state)
    path = acc.save_model(model, OUT / "saved_model")
    expected = flat(acc.unwrap_model(model))
    if acc.is_main_process:
        from safetensors.torch import load_file

        weights = load_file(str(path))
        results["safetensors_keys"] = sorted(weights)
        plain = make_model()
        plain.load_state_dict(weights, strict=False)  # the tied head comes with the embedding
        results["safetensors_diff"] = diff(flat(plain), expected)
    acc.save_state(OUT / "full_ckpt")
    results["full_ckpt_files"] = sorted(p.name for p in (OUT / "full_ckpt").iterdir())
    again = Accelerator(fsdp_plugin=block_plugin(state_dict_type="FULL_STATE_DICT"))
    fresh = make_model()
    model2, opt2 = again.prepare(fresh, torch.optim.AdamW(fresh.parameters(), lr=0.01))
    again.load_state(OUT / "full_ckpt")
    results["full_ckpt_diff"] = diff(flat(again.unwrap_model(model2)), expected)
    results["full_ckpt_optimizer_steps"] = [float(s["step"]) for s in opt2.state.values()]


class PeakRss:
    """The highest RSS of this process while the block runs, sampled every millisecond."""

    def __enter__(self) -> PeakRss:
        self.proc = psutil.Process()
        self.start = self.peak = self.proc.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.start


def check_checkpoint_memory() -> None:
    """RSS growth while saving a sharded checkpoint, and rank 0's while gathering the full weights."""
    torch.manual_seed(0)
    big = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(16)])
    model_bytes = sum(p.numel() * p.element_size() for p in big.parameters())
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy="SIZE_BASED_WRAP",
                                                                 min_num_params=1_000_000))
    big = acc.prepare(big)
    acc.save_state(OUT / "warmup_ckpt")  # first use imports and allocates what any save needs
    with PeakRss() as saving:
        acc.save_state(OUT / "memory_ckpt")
    with PeakRss() as gathering:
        state = acc.get_state_dict(big)
    results["memory"] = {"model_bytes": model_bytes, "save_growth": saving.growth,
                         "gather_growth": gathering.growth, "gathered": len(state)}


def resume_run(acc: Accelerator, steps: int, save_at: int | None, start: int = 0) -> dict:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    model, opt, loader, sched = acc.prepare(model, opt, DataLoader(data(), batch_size=4, shuffle=True), sched)
    if start:
        acc.load_state(OUT / "sharded_ckpt")
        loader = acc.skip_first_batches(loader, start)
    losses = []
    for step, (x, y) in enumerate(loader, start=start):
        if step == save_at:
            acc.save_state(OUT / "sharded_ckpt")
            torch.save(acc.unwrap_model(model).state_dict(), OUT / f"at_save_rank{acc.process_index}.pt")
        if step == steps:
            break
        loss = lm_loss(model, x, y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean")))
    return {"losses": losses, "params": flat(acc.unwrap_model(model)).tolist()}


def check_one_process_load() -> None:
    """The 2-rank sharded checkpoint in a 1-process job (nothing sharded): weights and optimizer state."""
    acc = Accelerator(fsdp_plugin=block_plugin())
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    model, opt, loader, sched = acc.prepare(model, opt, DataLoader(data(), batch_size=4, shuffle=True), sched)
    acc.load_state(OUT / "sharded_ckpt")
    expected = torch.load(OUT / "at_save_rank0.pt")
    results["one_process"] = {
        "world": acc.num_processes, "type": acc.distributed_type.value,
        "param_diff": max(float((model.state_dict()[k] - v).abs().max()) for k, v in expected.items()),
        "optimizer_steps": sorted({float(s["step"]) for s in opt.state.values()}),
        "moments": len(opt.state), "lr": sched.get_last_lr()[0],
    }
    acc.save_state(OUT / "one_process_ckpt")
    results["one_process"]["files"] = sorted(p.name for p in (OUT / "one_process_ckpt" / "pytorch_model_fsdp_0").iterdir())


def main() -> None:
    torch.set_num_threads(1)
    if PHASE == "train":
        check_equivalence()
        check_fp16()
        check_mixed_dtypes()
        check_rank0_loading()
        check_ignored_modules()
        check_full_weights()
        check_checkpoint_memory()
        results["uninterrupted"] = resume_run(Accelerator(fsdp_plugin=block_plugin()), steps=10, save_at=5)
    elif PHASE == "resume":
        results["resumed"] = resume_run(Accelerator(fsdp_plugin=block_plugin()), steps=10, save_at=None, start=5)
    else:  # one process loads what two wrote
        check_one_process_load()
    rank = int(os.environ["RANK"])
    (OUT / f"{PHASE}_rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
