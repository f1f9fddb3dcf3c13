"""Full weights out of a sharded model: full state dicts, plain modules, merged checkpoints.

``full_state_dict`` gathers every parameter (a collective: all ranks call it) and
restores weight ties, so safetensors stores a tied tensor once. ``plain_module``
builds an ordinary ``nn.Module`` (no DTensors, no FSDP hooks, no process group)
from a meta-device skeleton taken before sharding plus the gathered weights: the
thing a notebook can receive from a worker. ``merge_fsdp_weights`` turns a sharded
``save_state`` checkpoint into one weights file without any process group.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor, Shard

MODEL_DIR = "pytorch_model_fsdp"  # the peer's name for a sharded model checkpoint
OPTIMIZER_DIR = "optimizer"
MODEL_KEY, OPTIMIZER_KEY = "model", "optimizer"  # top-level keys inside those folders, as the peer writes


def meta_skeleton(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose parameters and buffers live on the meta device (ties kept)."""
    memo: dict[int, Any] = {}
    for param in model.parameters():
        memo[id(param)] = torch.nn.Parameter(torch.empty_like(param, device="meta"), param.requires_grad)
    for buffer in model.buffers():
        memo[id(buffer)] = torch.empty_like(buffer, device="meta")
    return copy.deepcopy(model, memo)


def tie_groups(model: torch.nn.Module) -> list[list[str]]:
    """Names under which one parameter is registered more than once, one list per parameter."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(clean_name(name))
    return [group for group in names.values() if len(group) > 1]


def clean_name(name: str) -> str:
    """A parameter name without the activation-checkpoint wrapper's component."""
    return name.replace("_checkpoint_wrapped_module.", "")


def full_state_dict(model: torch.nn.Module, rank0_only: bool = True) -> dict[str, Any]:
    """Every rank calls it; the gathered weights on the CPU (only on rank 0 when ``rank0_only``,
    other ranks get ``{}``). Tied names share one tensor.

    ``rank0_only`` gathers one parameter at a time into rank 0's result, so rank 0 needs
    about one model of extra memory and the others none (an all-gather would materialise
    every full parameter on every rank).
    """
    if not rank0_only:
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        state = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    else:
        done: dict[int, Any] = {}
        state = {}
        for name, value in model.state_dict().items():
            if id(value) not in done:
                done[id(value)] = _to_rank0(value)
            state[name] = done[id(value)]
        if dist.get_rank() != 0:
            return {}
    for group in tie_groups(model):
        if group[0] in state:
            for name in group[1:]:
                state[name] = state[group[0]]
    return state


def _to_rank0(value: Any) -> Any:
    """A DTensor's full value on rank 0's CPU (``None`` elsewhere); other values as they are."""
    if not isinstance(value, DTensor):
        return value.detach().cpu() if isinstance(value, torch.Tensor) else value
    if value.device_mesh.ndim != 1 or value.placements != (Shard(0),):
        full = value.full_tensor()  # another layout: let DTensor gather it
        return full.cpu() if dist.get_rank() == 0 else None
    group = value.device_mesh.get_group()
    world, rows = dist.get_world_size(group), value.shape[0]
    chunk = -(-rows // world)  # FSDP2's dim-0 shards: torch.chunk sizes, the last ones shorter
    local = value.to_local().detach()
    if local.shape[0] < chunk:
        local = torch.cat([local, local.new_zeros((chunk - local.shape[0], *local.shape[1:]))])
    root = dist.get_global_rank(group, 0)
    if dist.get_rank() != root:
        dist.gather(local.contiguous(), dst=root, group=group)
        return None
    # A gather, not point to point: every rank issues one collective per parameter, so the
    # group's collective counts stay equal (a pool's check, the stop button's cut count them).
    full = torch.empty((chunk * world, *value.shape[1:]), dtype=local.dtype, device=local.device)
    dist.gather(local.contiguous(), gather_list=list(full.chunk(world)), dst=root, group=group)
    full = full[:rows] if chunk * world == rows else full[:rows].clone()
    return full.cpu()


def plain_module(skeleton: torch.nn.Module, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A full, ordinary copy of sharded ``model`` on ``device``, built from its ``skeleton``.

    Every rank calls it (the weights are gathered) and gets its own copy.
    """
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    buffers = {clean_name(name): b for name, b in model.named_buffers()}
    return module_from_weights(skeleton, weights, buffers, device)


def module_from_weights(skeleton: torch.nn.Module, weights: dict[str, Any], buffers: dict[str, Any],
                        device: torch.device) -> torch.nn.Module:
    """A copy of meta ``skeleton`` holding ``weights`` (by parameter name; ties kept) and ``buffers``."""
    plain = copy.deepcopy(skeleton)
    made: dict[int, torch.nn.Parameter] = {}
    for name, param in plain.named_parameters(remove_duplicate=False):
        if id(param) not in made:
            value = weights[name].detach().to(device)
            made[id(param)] = torch.nn.Parameter(value, requires_grad=param.requires_grad)
        _set(plain, name, made[id(param)], "_parameters")
    for name, _ in plain.named_buffers(remove_duplicate=False):
        _set(plain, name, buffers[name].detach().clone().to(device), "_buffers")
    return plain


def _set(root: torch.nn.Module, name: str, value: Any, table: str) -> None:
    owner, _, leaf = name.rpartition(".")
    getattr(root.get_submodule(owner), table)[leaf] = value


def merge_fsdp_weights(checkpoint_dir: str | os.PathLike[str], output_path: str | os.PathLike[str],
                       safe_serialization: bool = True, remove_checkpoint_dir: bool = False) -> Path:
    """Merge a sharded model checkpoint into one weights file (no process group needed).

    Args:
        checkpoint_dir: a ``save_state`` directory, or the ``pytorch_model_fsdp_<i>`` folder in it.
        output_path: the directory that gets ``model.safetensors`` (or ``pytorch_model.bin``).
        safe_serialization: safetensors (default) or ``torch.save``.
        remove_checkpoint_dir: delete the sharded folder afterwards.

    Returns:
        The written file.

    Raises:
        FileNotFoundError: no sharded model checkpoint in ``checkpoint_dir``.
    """
    import shutil

    from notebook_accel.checkpoint.weight_files import save_weights

    source = Path(checkpoint_dir)
    if (source / f"{MODEL_DIR}_0").is_dir():
        source = source / f"{MODEL_DIR}_0"
    if not (source / ".metadata").is_file():
        raise FileNotFoundError(f"{checkpoint_dir} holds no sharded model checkpoint "
                                f"(expected {MODEL_DIR}_0/.metadata, written by save_state under FSDP)")
    state = load_sharded_weights(source)
    path = save_weights(state, Path(output_path), safe_serialization)
    if remove_checkpoint_dir:
        shutil.rmtree(source)
    return path


def load_sharded_weights(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a sharded (torch.distributed.checkpoint) model folder into full CPU tensors, in this
    process alone (the kernel, say): without a process group ``dcp.load`` reads every shard."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(directory))
    prefix = f"{MODEL_KEY}."
    weights = {
        key.removeprefix(prefix): torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in reader.read_metadata().state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }
    state = {MODEL_KEY: weights}
    dcp.load(state, storage_reader=reader)
    return state[MODEL_KEY]
