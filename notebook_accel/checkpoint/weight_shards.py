"""Saving a model's weights in shards of at most ``max_shard_size`` (the Hugging Face layout).

One shard: ``model.safetensors`` (or ``pytorch_model.bin``). Several:
``model-00001-of-00003.safetensors``... plus ``model.safetensors.index.json``
mapping every weight to its file (``{"metadata": {"total_size": N}, "weight_map": {...}}``).
A tensor larger than the limit gets a shard of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from notebook_accel._peer_paths import peer_logger

logger = peer_logger(__name__)

def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string like ``"10GB"``, ``"500MiB"`` (``big_model``'s units).

    Raises:
        ValueError: a size that is not positive, or a string that is not a number and a unit
            (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB).
    """
    from notebook_accel.big_model.memory import parse_size as size_in_bytes

    if isinstance(size, (int, float)) and not isinstance(size, bool) and size <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size}")
    try:
        limit = size_in_bytes(size)
    except ValueError:
        raise ValueError(
            f"max_shard_size={size!r} is not a size; use an int (bytes) or e.g. '10GB', '500MB', '2GiB'"
        ) from None
    if limit <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return limit


def drop_shared(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``state`` with each tensor that shares memory with an earlier one (tied weights) left out,
    the others made contiguous (safetensors refuses both); and the names left out."""
    seen: set[tuple[Any, int]] = set()
    unique, dropped = {}, []
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            dropped.append(name)
        else:
            seen.add(key)
            unique[name] = tensor.contiguous()
    return unique, dropped


def save_object(obj: Any, path: Path, safe_serialization: bool = False) -> None:
    """``torch.save`` (or safetensors' ``save_file`` for a dict of tensors) to ``path``.

    safetensors stores a tensor sharing memory with another (tied weights) once, under its first
    name, and logs a warning naming the others (the peer's ``save``).
    """
    if safe_serialization:
        from safetensors.torch import save_file

        obj, dropped = drop_shared(dict(obj))
        if dropped:
            logger.warning(f"Removed shared tensor {dropped} while saving {path.name}: each is stored once, under "
                           "the first name sharing its memory (tie the weights again after loading)")
        save_file(obj, str(path), metadata={"format": "pt"})
    else:
        torch.save(obj, path)


def split_state(state: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """``state`` cut, in order, into pieces of at most ``max_bytes`` (a bigger tensor alone)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in state.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and used + size > max_bytes:
            shards.append({})
            used = 0
        shards[-1][name] = tensor
        used += size
    return shards


def save_shards(
    shards: list[dict[str, torch.Tensor]], directory: Path, safe_serialization: bool,
) -> Path:
    """Write ``shards`` (see the module docstring); returns the index file (or the single file)."""
    stem, ext = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    count = len(shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, start=1):
        name = f"{stem}{ext}" if count == 1 else f"{stem}-{i:05d}-of-{count:05d}{ext}"
        tmp = directory / (name + ".tmp")
        save_object(shard, tmp, safe_serialization)
        os.replace(tmp, directory / name)
        for key, tensor in shard.items():
            weight_map[key] = name
            total += tensor.numel() * tensor.element_size()
    if count == 1:
        return directory / f"{stem}{ext}"
    index = directory / f"{stem}{ext}.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return index
