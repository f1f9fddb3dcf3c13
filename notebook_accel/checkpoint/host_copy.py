"""A copy of training state in host memory that training can no longer change: the only part of a
snapshot that runs on the training path (``snapshots``); the files are written from it in the background.

A sharded state (FSDP2's DTensors) is copied shard by shard: each rank copies its own shard, which
stays a DTensor of the same mesh and placements (``torch.distributed.checkpoint`` writes it as such).
A state dict holds the live tensors (a model's parameters, an optimizer's moments), which the next
step changes in place, so every tensor is copied, to the CPU; containers are rebuilt around the
copies and other values deep-copied (a scheduler's lists). Tensors that are the same view of one
storage (tied weights) stay one tensor, so the weight files store them once, as ``save_state``'s do.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import torch


def host_copy(obj: Any, to_cpu: Callable[[Any], Any] | None = None) -> Any:
    """``obj`` with every tensor copied to host memory and every container rebuilt.

    Args:
        obj: a state dict, or any nesting of dicts, lists and tuples holding tensors and plain values.
        to_cpu: the device kind's copy to the CPU, applied first where a device needs its own
            (XLA's: one graph run for all tensors); CUDA tensors are copied by ``Tensor.to``.
    """
    if to_cpu is not None:
        obj = to_cpu(obj)
    return _copy(obj, {})


def nbytes(obj: Any) -> int:
    """Bytes of the tensors in ``obj`` (as ``host_copy`` walks it; a DTensor's own shard)."""
    if is_dtensor(obj):
        obj = obj.to_local()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def _copy(obj: Any, seen: dict[tuple[Any, ...], torch.Tensor]) -> Any:
    if is_dtensor(obj):
        from torch.distributed.tensor import DTensor

        local = obj.to_local().detach().to("cpu", copy=True)
        return DTensor.from_local(local, obj.device_mesh, obj.placements, run_check=False,
                                  shape=obj.shape, stride=obj.stride())
    if isinstance(obj, torch.Tensor):
        key = _view_key(obj)
        if key is not None and key in seen:
            return seen[key]
        copied = obj.detach().to("cpu", copy=True)
        if key is not None:
            seen[key] = copied
        return copied
    if isinstance(obj, dict):
        try:
            out = type(obj)()  # an OrderedDict stays one: a module's state dict
        except TypeError:
            out = {}
        for k, v in obj.items():
            out[k] = _copy(v, seen)
        if hasattr(obj, "_metadata"):  # a module state dict's versions, which load_state_dict reads
            out._metadata = copy.deepcopy(obj._metadata)
        return out
    if isinstance(obj, list):
        return [_copy(v, seen) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_copy(v, seen) for v in obj)
    return copy.deepcopy(obj)


def is_dtensor(obj: Any) -> bool:
    """``obj`` is a DTensor (without importing ``torch.distributed.tensor`` where nothing made one)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(obj, module.DTensor)


def _view_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """What makes two tensors the same view of the same memory (``None`` where a tensor has no storage)."""
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    if pointer == 0:
        return None
    return (tensor.device, pointer, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
