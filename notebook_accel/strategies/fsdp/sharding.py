"""Shard a model with FSDP2 (``fully_shard``) as a ``FullyShardedDataParallelPlugin`` says.

In order: fp32 master weights (floating parameters upcast when computing in
bf16/fp16), activation checkpointing of the wrapped layers, ``fully_shard`` on each
layer the wrap policy picks (children first) and then on the root, and, with
``cpu_ram_efficient_loading``, rank 0's weights sent to every rank.

A layer is never wrapped on its own when one of its parameters is shared with a
module outside it (a tied embedding and head): the tie then lives in the enclosing
group, so it survives sharding.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from notebook_accel.runtime.precision import autocast_dtype
from notebook_accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin
from notebook_accel.strategies.fsdp.state_dict import clean_name as _clean


def mixed_precision_policy(plugin: FullyShardedDataParallelPlugin, mixed_precision: str) -> MixedPrecisionPolicy:
    """The plugin's policy (an object or a dict of its fields), else one for ``mixed_precision``:
    compute in bf16/fp16, reduce gradients and return outputs in fp32."""
    policy = plugin.mixed_precision_policy
    if isinstance(policy, MixedPrecisionPolicy):
        return policy
    if isinstance(policy, dict):
        dtypes = {k: getattr(torch, v) if isinstance(v, str) else v for k, v in policy.items()}
        dtypes.pop("buffer_dtype", None)  # FSDP1 only
        return MixedPrecisionPolicy(**dtypes)
    if policy is not None:
        raise TypeError(f"mixed_precision_policy must be a MixedPrecisionPolicy or a dict, not {policy!r}")
    low = autocast_dtype(mixed_precision)
    if low is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32, output_dtype=torch.float32)


def _wrap_predicate(plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module) -> Callable[[torch.nn.Module], bool]:
    policy = plugin.auto_wrap_policy
    if callable(policy):
        return _module_predicate(policy)
    if policy == "TRANSFORMER_BASED_WRAP":
        names = set(block_class_names(plugin, model))
        return lambda m: any(cls.__name__ in names for cls in type(m).__mro__)
    if policy == "SIZE_BASED_WRAP":
        return lambda m: sum(p.numel() for p in m.parameters()) >= plugin.min_num_params
    return lambda m: False


def _module_predicate(policy: Callable[..., bool]) -> Callable[[torch.nn.Module], bool]:
    """``policy(module) -> bool`` as it is; torch's FSDP1 policies (``transformer_auto_wrap_policy``,
    ``size_based_auto_wrap_policy``, usually a ``functools.partial`` of one, as the peer's plugin holds
    after ``set_auto_wrap_policy``) asked as FSDP1 asks about one module: ``recurse=False``."""
    try:
        fsdp1 = "recurse" in inspect.signature(policy).parameters
    except (TypeError, ValueError):  # a builtin or a C callable: no signature to read
        fsdp1 = False
    if not fsdp1:
        return policy
    return lambda m: bool(policy(module=m, recurse=False, nonwrapped_numel=sum(p.numel() for p in m.parameters())))


def block_class_names(plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module) -> list[str]:
    """The layer classes ``TRANSFORMER_BASED_WRAP`` shards one by one: the plugin's
    ``transformer_cls_names_to_wrap``, else the model's own ``_no_split_modules`` (what every
    transformers model declares: ``GPT2Block``, ``LlamaDecoderLayer``...), as the peer does.
    A module is wrapped when its class or one of its base classes has one of these names.

    Raises:
        ValueError: no names from either, or a name no module of the model has; the message
            names it, where it came from, the model's block classes and its module classes.
    """
    declared = sorted(getattr(model, "_no_split_modules", None) or [])  # a list, or a set in transformers 5
    given = plugin.transformer_cls_names_to_wrap
    names, source = (given, "transformer_cls_names_to_wrap (fsdp_transformer_layer_cls_to_wrap)") if given else (
        declared, f"{type(model).__name__}._no_split_modules")
    found = {cls.__name__ for m in model.modules() for cls in type(m).__mro__}
    classes = sorted({type(m).__name__ for m in model.modules()})
    if not names:
        raise ValueError(f"auto_wrap_policy TRANSFORMER_BASED_WRAP needs layer classes to wrap: give "
                         f"transformer_cls_names_to_wrap (fsdp_transformer_layer_cls_to_wrap), since "
                         f"{type(model).__name__} declares no _no_split_modules; its module classes are {classes}")
    missing = sorted(set(names) - found)
    if missing:
        raise ValueError(f"{source} names {missing}, which the model does not contain; its block classes "
                         f"(_no_split_modules) are {declared}, its module classes {classes}")
    return list(names)


def _layers_to_wrap(model: torch.nn.Module, wants: Callable[[torch.nn.Module], bool]) -> list[torch.nn.Module]:
    """Modules below the root to shard as their own groups, innermost first: those the policy
    picks, plus those needed so each group's parameters have one dtype (FSDP2 requires it).
    A module whose parameters are shared with a module outside it is never picked.

    Raises:
        ValueError: one module's own parameters mix dtypes (no split can separate them).
    """
    owners: dict[int, set[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), set()).add(name)
    names = {id(m): name for name, m in model.named_modules()}

    def movable(module: torch.nn.Module) -> bool:
        name = names[id(module)]
        return bool(name) and all(o == name or o.startswith(name + ".")
                                  for p in module.parameters() for o in owners[id(p)])

    chosen = {id(m) for m in model.modules() if movable(m) and wants(m)}

    def dtypes(group: torch.nn.Module) -> set[torch.dtype]:
        found, stack = set(), [group]
        while stack:
            module = stack.pop()
            found |= {p.dtype for p in module.parameters(recurse=False)}
            stack.extend(c for c in module.children() if id(c) not in chosen)
        return found

    def split(group: torch.nn.Module) -> None:
        if len(dtypes(group)) <= 1:
            return
        for child in group.children():
            if id(child) in chosen:
                continue
            if len(dtypes(child)) == 1 and movable(child):
                chosen.add(id(child))
            else:
                split(child)

    for group in [m for m in model.modules() if id(m) in chosen] + [model]:
        split(group)
        if len(dtypes(group)) > 1:
            raise ValueError(f"module {names[id(group)] or type(group).__name__!r} holds parameters of dtypes "
                             f"{sorted(map(str, dtypes(group)))} that FSDP2 cannot shard together; use one dtype, "
                             "or mixed_precision='bf16'/'fp16' (fp32 master weights)")
    return [m for _, m in reversed(list(model.named_modules())) if id(m) in chosen]


def _upcast(model: torch.nn.Module) -> None:
    """fp32 master weights: floating parameters in bf16/fp16 become float32 (same Parameter objects)."""
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != torch.float32:
            param.data = param.data.float()


def _checkpoint_activations(model: torch.nn.Module, layers: list[torch.nn.Module]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    if not layers:
        raise ValueError("activation_checkpointing needs auto_wrap_policy TRANSFORMER_BASED_WRAP or "
                         "SIZE_BASED_WRAP, to choose which layers to recompute")
    targets = {id(m) for m in layers}
    apply_activation_checkpointing(model, check_fn=lambda m: id(m) in targets)


def _offload_policy(plugin: FullyShardedDataParallelPlugin, device: torch.device) -> OffloadPolicy:
    if not plugin.cpu_offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device.type == "cuda")  # pinning needs an accelerator


def shard_model(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, mixed_precision: str,
                device: torch.device) -> dict[int, torch.nn.Parameter]:
    """Shard ``model`` in place over the default process group.

    Returns:
        ``id(old parameter) -> new parameter`` (``fully_shard`` replaces them with DTensor
        parameters), for optimizers built before ``prepare``.
    """
    before = dict(model.named_parameters(remove_duplicate=False))
    policy = mixed_precision_policy(plugin, mixed_precision)
    if policy.param_dtype is not None:
        _upcast(model)
    rank0_weights = None
    if plugin.cpu_ram_efficient_loading and dist.get_rank() == 0:
        rank0_weights = model.state_dict()
    layers = _layers_to_wrap(model, _wrap_predicate(plugin, model))
    if plugin.activation_checkpointing:
        _checkpoint_activations(model, layers)
    ignored = {p for m in plugin.ignored_module_list(model) for p in m.parameters()}
    options: dict[str, Any] = {
        "reshard_after_forward": plugin.reshard_after_forward, "mp_policy": policy,
        "offload_policy": _offload_policy(plugin, device), "ignored_params": ignored or None,
    }
    # Only the root returns output_dtype: inner layers hand low-precision activations to the next one.
    inner = {**options, "mp_policy": dataclasses.replace(policy, output_dtype=None)}
    for layer in layers:
        fully_shard(_checkpointed(model, layer), **inner)
    fully_shard(model, **options)
    if plugin.cpu_ram_efficient_loading:
        _receive_rank0_weights(model, rank0_weights, device)
    after = {_clean(name): p for name, p in model.named_parameters(remove_duplicate=False)}
    return {id(old): after[name] for name, old in before.items() if name in after}


def _checkpointed(model: torch.nn.Module, layer: torch.nn.Module) -> torch.nn.Module:
    """The activation-checkpoint wrapper around ``layer`` when there is one (shard that), else ``layer``."""
    for module in model.modules():
        if getattr(module, "_checkpoint_wrapped_module", None) is layer:
            return module
    return layer


def _receive_rank0_weights(model: torch.nn.Module, weights: dict[str, Any] | None, device: torch.device) -> None:
    """Ranks whose model lives on the meta device get storage, then everyone gets rank 0's weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        model.to_empty(device=device)
    set_model_state_dict(model, weights or {}, options=StateDictOptions(full_state_dict=True,
                                                                        broadcast_from_rank0=True))
    persistent = set(model.state_dict().keys())
    for name, buffer in model.named_buffers():
        if name not in persistent:
            dist.broadcast(buffer, src=0)
