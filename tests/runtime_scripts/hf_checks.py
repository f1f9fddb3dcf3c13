"""Hugging Face clients on our Accelerator, for ``torchrun --nproc-per-node 2`` (gloo, CPU).

Usage: ``hf_checks.py OUT_DIR train``. One launch covers: a transformers GPT-2 under DDP
(trains, ranks agree, ``save_model`` / ``save_pretrained`` round trips); GPT-2 and Llama
under FSDP2 with ``auto_wrap_policy="transformer_based_wrap"`` and no class names (the
model's ``_no_split_modules`` are wrapped), matching a one-process reference, and their
full state dicts loading into fresh models; a wrong class name's error; a peft LoRA adapter
under DDP (only the adapter trains; ``save_state`` / ``load_state`` restore it and its
optimizer, also from an adapter-only checkpoint; ``save_pretrained`` / ``PeftModel.from_pretrained``
round trip) and under FSDP2. Tiny models from configs, synthetic tokens: nothing is downloaded.
Each rank writes ``OUT_DIR/train_rank<r>.json``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from hf_models import adapter, gpt2, llama, lora_llama, max_diff, train, weights
from transformers import GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from notebook_accel import Accelerator
from notebook_accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

faulthandler.dump_traceback_later(float(os.environ.get("DDP_CHECKS_TIMEOUT", "100")), exit=True)
hf_logging.set_verbosity_error()

OUT = Path(sys.argv[1])
results: dict = {}


def seq_diff(a: list[float], b: list[float]) -> float:
    return float((torch.tensor(a) - torch.tensor(b)).abs().max())


def rel_diff(a: list[float], b: list[float]) -> float:
    return float(((torch.tensor(a) - torch.tensor(b)).abs() / torch.tensor(b)).max())


def check_ddp() -> None:
    """GPT-2 under DDP: loss falls, matches one process, ranks agree; saved weights load back."""
    _, _, ref_losses, ref_norms = train(ref := gpt2(), None)
    acc = Accelerator()
    model, _, losses, norms = train(gpt2(), acc)
    plain = acc.unwrap_model(model)
    flat = torch.cat([p.detach().reshape(-1) for p in plain.parameters()])
    gathered = acc.gather(flat[None])
    case = {
        "distributed_type": acc.distributed_type.value, "wrapper": type(model).__name__,
        "unwrapped": type(plain).__name__, "losses": losses, "loss_diff": seq_diff(losses, ref_losses),
        "norm_rel": rel_diff(norms, ref_norms), "param_diff": max_diff(weights(plain), weights(ref)),
        "rank_disagreement": float((gathered[0] - gathered[1]).abs().max()),
    }
    if acc.is_main_process:
        torch.save(weights(plain), OUT / "ddp_weights.pt")  # FSDP's run is compared with it
    save_dir, pretrained_dir = OUT / "ddp_save_model", OUT / "ddp_pretrained"
    written = acc.save_model(model, save_dir)
    plain.save_pretrained(pretrained_dir, is_main_process=acc.is_main_process, save_function=acc.save)
    acc.wait_for_everyone()
    case["save_model_file"] = written.name if written else None
    loaded = GPT2LMHeadModel.from_pretrained(pretrained_dir)
    case["from_pretrained_diff"] = max_diff(weights(loaded), weights(plain))
    case["from_pretrained_tied"] = loaded.lm_head.weight is loaded.transformer.wte.weight
    if acc.is_main_process:  # save_model writes the weights only; transformers wants the config beside them
        plain.config.save_pretrained(save_dir)
    acc.wait_for_everyone()
    from_file = GPT2LMHeadModel.from_pretrained(save_dir)
    case["save_model_diff"] = max_diff(weights(from_file), weights(plain))
    results["ddp"] = case


def check_fsdp(name: str, build: Callable[[], torch.nn.Module]) -> None:
    """FSDP2 wrapping the model's own ``_no_split_modules`` by name; a one-process reference;
    the full state dict loads into a fresh model."""
    _, _, ref_losses, ref_norms = train(ref := build(), None)
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap"))
    model = build()
    (block_class,) = model._no_split_modules  # a list or (transformers 5) a set
    model, _, losses, norms = train(model, acc)
    from torch.distributed.fsdp import FSDPModule

    blocks = [m for m in model.modules() if type(m).__name__.endswith(block_class)]
    full = acc.get_state_dict(model)  # rank 0: every weight, on the CPU
    case = {
        "distributed_type": acc.distributed_type.value, "block_class": block_class,
        "blocks_sharded": [isinstance(b, FSDPModule) for b in blocks],
        "root_sharded": isinstance(model, FSDPModule),
        "losses": losses, "loss_diff": seq_diff(losses, ref_losses), "norm_rel": rel_diff(norms, ref_norms),
    }
    if acc.is_main_process:
        fresh = build()
        torch.manual_seed(1)
        for p in fresh.parameters():
            torch.nn.init.normal_(p)  # nothing of the old weights left
        missing, unexpected = fresh.load_state_dict(full, strict=False)
        case["full_state_dict_load"] = {"missing": missing, "unexpected": unexpected}
        case["full_state_dict_diff"] = max_diff(weights(fresh), weights(ref))
    plain = acc.unwrap_model(model)
    case["unwrapped"] = type(plain).__name__
    case["unwrapped_diff"] = max_diff(weights(plain), weights(ref))
    saved = OUT / f"fsdp_{name}_save_model"
    acc.save_model(model, saved)  # gathered on the main process, which writes it
    acc.save_state(OUT / f"fsdp_{name}_state")  # sharded: the pytest side merges it, without processes
    if acc.is_main_process:
        plain.config.save_pretrained(saved)
        plain.config.save_pretrained(OUT / f"fsdp_{name}_merged")
        torch.save(weights(plain), OUT / f"fsdp_{name}_weights.pt")
    acc.wait_for_everyone()
    case["save_model_diff"] = max_diff(weights(type(plain).from_pretrained(saved)), weights(plain))
    results[f"fsdp_{name}"] = case


def check_wrong_block_name() -> None:
    """A class the model does not have is refused, naming it and the model's block classes."""
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                            transformer_cls_names_to_wrap=["GPT2Blok"])
    acc = Accelerator(fsdp_plugin=plugin)
    try:
        acc.prepare(gpt2())
        results["wrong_block_name"] = None
    except ValueError as error:
        results["wrong_block_name"] = str(error)


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v.detach().clone() for state in opt.state_dict()["state"].values()
            for v in state.values() if isinstance(v, torch.Tensor)]


def check_peft() -> None:
    """LoRA under DDP: only the adapter trains; save_state/load_state and save_pretrained round trip."""
    from peft import PeftModel

    acc = Accelerator()
    model = lora_llama(seed=1)
    base_before = {k: v for k, v in weights(model).items() if "lora_" not in k}
    adapter_before = adapter(model)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    model, opt, losses, _ = train(model, acc, lr=5e-2)
    peft_model = acc.unwrap_model(model)
    after = weights(peft_model)
    case = {
        "wrapper": type(model).__name__, "unwrapped": type(peft_model).__name__, "losses": losses,
        "trainable_all_lora": bool(trainable) and all("lora_" in n for n in trainable),
        "base_changed": max(float((after[k] - v).abs().max()) for k, v in base_before.items()),
        "adapter_changed": max_diff(adapter(peft_model), adapter_before),
    }
    results["peft"] = case
    state_dir = OUT / "peft_state"
    acc.save_state(state_dir)
    saved_adapter, saved_opt = adapter(peft_model), optimizer_tensors(opt)

    again = Accelerator()
    fresh = lora_llama(seed=2)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=5e-2)
    fresh, fresh_opt = again.prepare(fresh, fresh_opt)
    case["fresh_adapter_differs"] = max_diff(adapter(again.unwrap_model(fresh)), saved_adapter)
    again.load_state(state_dir)
    case["load_state_adapter_diff"] = max_diff(adapter(again.unwrap_model(fresh)), saved_adapter)
    restored = optimizer_tensors(fresh_opt)
    case["load_state_optimizer_diff"] = (
        max(float((a - b).abs().max()) for a, b in zip(restored, saved_opt, strict=True))
        if len(restored) == len(saved_opt) and restored else None)

    check_adapter_only_checkpoint(acc, saved_adapter)

    adapter_dir = OUT / "peft_adapter"
    peft_model.save_pretrained(adapter_dir, is_main_process=acc.is_main_process, save_function=acc.save)
    acc.wait_for_everyone()
    case["adapter_files"] = sorted(p.name for p in adapter_dir.iterdir())
    loaded = PeftModel.from_pretrained(llama(), adapter_dir)
    case["from_pretrained_adapter_diff"] = max_diff(adapter(loaded), saved_adapter)


def check_adapter_only_checkpoint(acc: Accelerator, saved_adapter: dict[str, torch.Tensor]) -> None:
    """A save hook keeps only the adapter's weights; ``load_state(strict=False)`` restores them into
    a fresh model, ``strict=True`` refuses the checkpoint naming what is missing."""
    def adapter_only(models, weights, output_dir):
        for i, state in enumerate(weights):
            weights[i] = {k: v for k, v in state.items() if "lora_" in k}

    handle = acc.register_save_state_pre_hook(adapter_only)
    folder = OUT / "peft_adapter_state"
    acc.save_state(folder)
    handle.remove()
    again = Accelerator()
    fresh = lora_llama(seed=3)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=5e-2)
    fresh, fresh_opt = again.prepare(fresh, fresh_opt)
    case = results["peft"]
    again.load_state(folder, strict=False)
    case["adapter_only_diff"] = max_diff(adapter(again.unwrap_model(fresh)), saved_adapter)
    try:
        again.load_state(folder)
        case["strict_refusal"] = None
    except RuntimeError as error:
        case["strict_refusal"] = str(error)[:20000]  # the whole list of missing keys


def check_peft_fsdp(policy: str) -> None:
    """The LoRA model under FSDP2, wrapped by ``policy``: ``transformer_based_wrap`` (the PeftModel's
    ``_no_split_modules``: its base model's), or ``peft`` (peft's own ``fsdp_auto_wrap_policy``, an
    FSDP1 policy that also wraps each trainable LoRA layer, set on ``accelerator.state.fsdp_plugin`` as
    peft's examples do). It trains like under DDP, only the adapter; ``save_pretrained`` of the
    unwrapped copy loads with ``PeftModel.from_pretrained``."""
    from peft import PeftModel
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FSDPModule

    model = lora_llama(seed=1)
    if policy == "peft":
        acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
        acc.state.fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)
    else:
        acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy=policy))
    base_before = {k: v for k, v in weights(model).items() if "lora_" not in k}
    model, _, losses, _ = train(model, acc, lr=5e-2)
    plain = acc.unwrap_model(model)
    folder = OUT / f"peft_fsdp_{policy}_adapter"
    plain.save_pretrained(folder, is_main_process=acc.is_main_process, save_function=acc.save)
    acc.wait_for_everyone()
    after = weights(plain)
    results[f"peft_fsdp_{policy}"] = {
        "sharded": sorted({type(m).__name__ for m in model.modules() if isinstance(m, FSDPModule)}),
        "blocks_sharded": [isinstance(m, FSDPModule) for m in model.modules()
                           if type(m).__name__.endswith("LlamaDecoderLayer")],
        "unwrapped": type(plain).__name__, "loss_diff_to_ddp": seq_diff(losses, results["peft"]["losses"]),
        "base_changed": max(float((after[k] - v).abs().max()) for k, v in base_before.items()),
        "from_pretrained_adapter_diff": max_diff(adapter(PeftModel.from_pretrained(llama(), folder)), adapter(plain)),
    }


def main() -> None:
    torch.set_num_threads(1)
    check_ddp()
    check_fsdp("gpt2", gpt2)
    check_fsdp("llama", llama)
    check_wrong_block_name()
    check_peft()
    check_peft_fsdp("transformer_based_wrap")
    check_peft_fsdp("peft")
    rank = int(os.environ["RANK"])
    (OUT / f"train_rank{rank}.json").write_text(json.dumps(results, default=list))


if __name__ == "__main__":
    main()
