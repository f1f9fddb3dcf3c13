"""DeepSpeed ZeRO checks for ``torchrun --nproc-per-node 2`` (gloo, CPU); one launch covers many checks.

Usage: ``deepspeed_checks.py OUT_DIR PHASE`` where PHASE is ``train`` (ZeRO 1/2/3 against a
1-process reference in fp32 and bf16, accumulation + clipping, the plugin from the
environment, full weights, and an uninterrupted ZeRO-3 run that checkpoints half way) or
``resume`` (fresh processes that load that checkpoint and finish the run); ``train`` also
reloads a ZeRO-2 checkpoint in place after more training. Each rank writes
``OUT_DIR/<phase>_rank<r>.json``; the pytest side asserts on them.
"""

from __future__ import annotations

import copy
import faulthandler
import json
import os
import sys
import warnings
from pathlib import Path

import tiny_lm
import torch
from tiny_lm import data, flat, make_model
from torch.utils.data import DataLoader

from notebook_accel import Accelerator, DeepSpeedPlugin

faulthandler.dump_traceback_later(float(os.environ.get("DDP_CHECKS_TIMEOUT", "200")), exit=True)

OUT = Path(sys.argv[1])
PHASE = sys.argv[2]
STEPS, PER_RANK = 8, 4
results: dict = {}


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return tiny_lm.lm_loss(model, x, y, float_logits=True)


def reference(accumulation: int = 1, clip: float | None = None, bf16: bool = False) -> dict:
    """One process, no Accelerator: the same global batches (micro-batches of 2 x PER_RANK).

    ``bf16``: DeepSpeed's arithmetic: bf16 weights compute, fp32 master weights step.
    """
    model = make_model()
    work = copy.deepcopy(model).bfloat16() if bf16 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, micro = [], []
    loader = DataLoader(data(), batch_size=2 * PER_RANK)
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = lm_loss(work, x, y)
        (loss / accumulation).backward()
        micro.append(float(loss.detach()))
        if (i + 1) % accumulation == 0:
            if bf16:
                for master, low in zip(model.parameters(), work.parameters(), strict=True):
                    master.grad = low.grad.float()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
            if bf16:
                work.zero_grad()
                with torch.no_grad():
                    for master, low in zip(model.parameters(), work.parameters(), strict=True):
                        low.copy_(master)
            losses.append(sum(micro) / len(micro))
            micro = []
            if len(losses) == STEPS:
                break
    return {"losses": losses, "params": flat(model)}


def zero_run(acc: Accelerator, clip: float | None = None) -> dict:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data(), batch_size=PER_RANK))
    info: dict = {"type": acc.distributed_type.value, "engine": type(model).__name__,
                  "micro_batch": acc.deepspeed_config["train_micro_batch_size_per_gpu"],
                  "clipping": acc.deepspeed_config["gradient_clipping"],
                  "accumulation": acc.gradient_accumulation_steps, "losses": [], "norms": []}
    local = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in model.parameters())
    total = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    info["param_fraction"] = local / total
    micro = []
    for x, y in loader:
        with acc.accumulate(model):
            loss = lm_loss(model, x, y)
            acc.backward(loss)
            micro.append(acc.reduce(loss.detach(), "mean"))
            if acc.sync_gradients and clip is not None:
                info["norms"].append(float(acc.clip_grad_norm_(model.parameters(), clip)))
            opt.step()
            opt.zero_grad()
        if acc.sync_gradients:
            info["losses"].append(float(torch.stack(micro).mean()))
            micro = []
            if len(info["losses"]) == STEPS:
                break
    plain = acc.unwrap_model(model)
    info["params"] = flat(plain)
    info["plain_type"] = type(plain).__name__
    info["plain_tied"] = plain.head.weight is plain.embed.weight
    info["model"] = model
    return info


def compare(run: dict, ref: dict) -> dict:
    losses, ref_losses = torch.tensor(run["losses"]), torch.tensor(ref["losses"])
    out = {k: v for k, v in run.items() if k not in ("model", "params")}
    out["loss_rel"] = float(((losses - ref_losses).abs() / ref_losses.abs()).max())
    out["param_diff"] = float((run["params"].cpu() - ref["params"]).abs().max())
    return out


def check_stages() -> None:
    # Each run frees its engine: a ZeRO-3 engine swaps torch's F.linear for DeepSpeed's (other bf16
    # rounding in later runs) and free_memory puts torch's back (checked in check_zero3_init...)
    ref = reference()
    ref16 = reference(bf16=True)
    for stage in (2, 3):
        acc = Accelerator(mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
        run = zero_run(acc)
        run["param_dtypes"] = sorted({str(p.dtype) for p in run["model"].parameters()})
        run["master_dtypes"] = sorted({str(t.dtype) for g in run["model"].optimizer.optimizer.param_groups
                                       for t in g["params"]})
        results[f"bf16_zero{stage}"] = {**compare(run, ref16), "fp32_loss_rel": compare(run, ref)["loss_rel"]}
        acc.free_memory()
    for stage in (1, 2, 3):
        acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
        results[f"zero{stage}"] = compare(zero_run(acc), ref)
        acc.free_memory()


def check_accumulation_and_clipping() -> None:
    ref = reference(accumulation=2, clip=0.5)
    acc = Accelerator(gradient_accumulation_steps=2,
                      deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=0.5))
    results["accumulate_clip"] = compare(zero_run(acc, clip=0.5), ref)
    acc.free_memory()


def check_plugin_from_environment() -> None:
    """What the launcher sets for ``distributed_type: DEEPSPEED``: no plugin in the code."""
    os.environ.update(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_ZERO_STAGE="3",
                      ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL="true")
    try:
        acc = Accelerator()
        run = zero_run(acc)
        full = acc.get_state_dict(run["model"])
        plain = acc.unwrap_model(run["model"]).state_dict()
        results["from_env"] = {
            **compare(run, reference()),
            "stage": acc.deepspeed_plugin.zero_stage,
            "full_keys": sorted(full) if acc.is_main_process else [],
            "full_diff": max((float((full[k] - plain[k]).abs().max()) for k in full), default=0.0),
        }
        path = acc.save_model(run["model"], OUT / "zero3_model")
        results["from_env"]["saved"] = None if path is None else Path(path).name
        acc.free_memory()
    finally:
        for name in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE",
                     "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"):
            os.environ.pop(name)
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
    run = zero_run(acc)
    try:
        acc.get_state_dict(run["model"])
        results["no_16bit_message"] = None
    except ValueError as err:
        results["no_16bit_message"] = str(err)
    acc.free_memory()


def check_zero3_init_and_offline_merge() -> None:
    """zero.Init builds straight into bf16 partitions; DeepSpeed's own offline merge reads our checkpoint."""
    acc = Accelerator(mixed_precision="bf16", deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True))
    with acc.deepspeed_plugin.zero3_init_context_manager():
        model = make_model()
    built = sorted({str(p.ds_tensor.dtype) for p in model.parameters()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    acc.save_state(OUT / "init_ckpt")
    acc.wait_for_everyone()
    merged = None
    if acc.is_main_process:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        merged = sorted(get_fp32_state_dict_from_zero_checkpoint(str(OUT / "init_ckpt")))
    results["zero3_init"] = {"built_dtypes": built, "merged_keys": merged,
                             "linear_while_engine": torch.nn.functional.linear.__module__}
    acc.free_memory()
    results["zero3_init"]["linear_after_free"] = torch.nn.functional.linear.__module__


def check_reload_in_place(stage: int) -> None:
    """load_state in the same processes, after more training: the weights and the optimizer go back
    to the checkpoint's (the peer's ``--load_best_model``: train on, then reload the best epoch)."""
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data(), batch_size=4))
    batches = list(loader)

    def train(steps: list) -> float:
        for x, y in steps:
            acc.backward(lm_loss(model, x, y))
            opt.step()
            opt.zero_grad()
        return float(acc.reduce(lm_loss(model, *batches[-1]).detach(), "mean"))

    train(batches[:3])
    saved = flat(acc.unwrap_model(model)).clone()
    acc.save_state(OUT / f"reload_zero{stage}")
    after_save = train(batches[3:6])
    moved = flat(acc.unwrap_model(model)).clone()
    acc.load_state(OUT / f"reload_zero{stage}")
    back = flat(acc.unwrap_model(model)).clone()
    results[f"reload_zero{stage}"] = {
        "moved": float((moved - saved).abs().max()), "after_load": float((back - saved).abs().max()),
        # the optimizer state went back too: the same 3 steps again land where they did
        "again": train(batches[3:6]) - after_save,
    }
    acc.free_memory()


def resume_run(acc: Accelerator, save_at: int | None, start: int = 0, steps: int = 10) -> dict:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    model, opt, loader, sched = acc.prepare(model, opt, DataLoader(data(), batch_size=4, shuffle=True), sched)
    if start:
        acc.load_state(OUT / "zero_ckpt")
        loader = acc.skip_first_batches(loader, start)
    losses = []
    for step, (x, y) in enumerate(loader, start=start):
        if step == save_at:
            acc.save_state(OUT / "zero_ckpt")
        if step == steps:
            break
        loss = lm_loss(model, x, y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean")))
    return {"losses": losses, "params": flat(acc.unwrap_model(model)).cpu().tolist(), "lr": sched.get_last_lr()[0]}


def main() -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)
    plugin = DeepSpeedPlugin(zero_stage=3)
    if PHASE == "train":
        check_stages()
        check_accumulation_and_clipping()
        check_plugin_from_environment()
        check_zero3_init_and_offline_merge()
        check_reload_in_place(stage=2)
        results["uninterrupted"] = resume_run(Accelerator(deepspeed_plugin=plugin), save_at=5)
        results["files"] = sorted(str(p.relative_to(OUT / "zero_ckpt")) for p in (OUT / "zero_ckpt").rglob("*")
                                  if p.is_file())
    else:
        results["resumed"] = resume_run(Accelerator(deepspeed_plugin=plugin), save_at=None, start=5)
    rank = int(os.environ["RANK"])
    for value in results.values():
        if isinstance(value, dict):
            value.pop("model", None)
    (OUT / f"{PHASE}_rank{rank}.json").write_text(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
