"""A model's weight files: written (``model.safetensors`` or ``pytorch_model.bin``, sharded above a
size, tied weights stored once) and read back into a model (tied weights restored)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from notebook_accel.checkpoint.paced_writes import save_safetensors_paced
from notebook_accel.checkpoint.weight_shards import (
    drop_shared,
    parse_size,
    save_object,
    save_shards,
    split_state,
)
from notebook_accel.runtime.device import device_kind


def save_weights_file(state: dict[str, torch.Tensor], path: Path, paced: bool = False) -> None:
    """One safetensors file of ``state``, tied weights stored once (fsync'd); ``paced``: written a
    piece at a time (``paced_writes``: a snapshot's background write)."""
    if paced:
        save_safetensors_paced(drop_shared(state)[0], path, metadata={"format": "pt"})
        return
    save_object(drop_shared(state)[0], path, safe_serialization=True)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def save_weights(
    state: dict[str, torch.Tensor], directory: Path, safe_serialization: bool = True,
    max_shard_size: int | str = "10GB",
) -> Path:
    """Write a model state dict as ``model.safetensors`` or ``pytorch_model.bin``, atomically.

    Above ``max_shard_size`` the weights are split into shards with an index file
    (``weight_shards``). safetensors refuses tensors sharing memory (tied weights):
    each is stored once, under its first name, as the peer does.
    """
    limit = parse_size(max_shard_size)
    directory.mkdir(parents=True, exist_ok=True)
    if safe_serialization:
        state = drop_shared(state)[0]
    return save_shards(split_state(state, limit), directory, safe_serialization)


def load_safetensors(model: Any, file: str, strict: bool) -> None:
    """safetensors' ``load_model`` (which restores tied weights stored once); it reads every
    tensor's storage pointer to find the tied ones, and some device kinds' tensors have none
    (XLA's), so there the tied names are found by identity instead (``state_dict(keep_vars=True)``)."""
    from safetensors.torch import load_file, load_model

    current = model.state_dict(keep_vars=True)
    if all(device_kind(tensor.device).has_storage(tensor) for tensor in current.values()):
        load_model(model, file, strict=strict)
        return
    state = load_file(file)
    aliases: dict[int, list[str]] = {}
    for name, tensor in current.items():
        aliases.setdefault(id(tensor), []).append(name)
    for names in aliases.values():
        stored = next((name for name in names if name in state), None)
        for name in names if stored is not None else ():
            state.setdefault(name, state[stored])
    model.load_state_dict(state, strict=strict)
