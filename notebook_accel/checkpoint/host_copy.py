"""A copy of training state in host memory that training can no longer change: the only part of a
snapshot that runs on the training path (``snapshots``); the files are written from it in the background.

A sharded state (FSDP2's DTensors) is copied shard by shard: each rank copies its own shard, which
stays a DTensor of the same mesh and placements (``torch.distributed.checkpoint`` writes it as such).
A state dict holds the live tensors (a model's parameters, an optimizer's moments), which the next
step changes in place, so every tensor is copied, to the CPU; containers are rebuilt around the
copies and other values deep-copied (a scheduler's lists). Tensors that are the same view of one
storage (tied weights) stay one tensor, so the weight files store them once, as ``save_state``'s do.

Given an earlier copy of the same state (``into``: the previous snapshot's, once written), each tensor
is copied into that copy's tensor of the same shape, dtype and strides: pages already in memory, not
fresh ones the kernel must fault in and zero on the training path (a copy 3-4x faster on CPU here).
The first snapshot has no earlier copy: ``blank`` makes one ahead, without the values, in the
background (its pages faulted in there).
"""

from __future__ import annotations

import copy
import mmap
import sys
from collections.abc import Callable
from typing import Any

import torch


def host_copy(obj: Any, to_cpu: Callable[[Any], Any] | None = None, into: Any = None) -> Any:
    """``obj`` with every tensor copied to host memory and every container rebuilt.

    Args:
        obj: a state dict, or any nesting of dicts, lists and tuples holding tensors and plain values.
        to_cpu: the device kind's copy to the CPU, applied first where a device needs its own
            (XLA's: one graph run for all tensors); CUDA tensors are copied by ``Tensor.to``.
        into: an earlier ``host_copy`` of the same state that nothing reads any more: its tensors are
            overwritten and returned where they match (the rest is copied anew).
    """
    if to_cpu is not None:
        obj = to_cpu(obj)
    return _copy(obj, {}, into, set(), _tensor_copy)


def blank(obj: Any) -> Any:
    """What ``host_copy(obj)`` makes, but the tensors' values left out (whatever the memory held):
    every tensor a CPU tensor of the same shape, dtype and strides (tied ones one tensor), each of
    its memory pages touched, so that the kernel has faulted them in. A ``host_copy(obj, into=blank(obj))`` then
    copies into resident memory. Reads only the tensors' shapes (a background thread may call it
    while training changes the values)."""
    return _copy(obj, {}, None, set(), _blank_tensor)


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


def _copy(obj: Any, seen: dict[tuple[Any, ...], torch.Tensor], old: Any, used: set[int],
          make: Callable[[torch.Tensor, Any, set[int]], torch.Tensor]) -> Any:
    """``seen``: the copies made so far by view (tied weights); ``used``: the ids of ``into``'s tensors
    overwritten so far (each at most once, though ``into`` tied two that are no longer tied); ``make``:
    a tensor's copy (``_tensor_copy``, or ``_blank_tensor``)."""
    if is_dtensor(obj):
        from torch.distributed.tensor import DTensor

        local = make(obj.to_local(), old.to_local() if is_dtensor(old) else None, used)
        return DTensor.from_local(local, obj.device_mesh, obj.placements, run_check=False,
                                  shape=obj.shape, stride=obj.stride())
    if isinstance(obj, torch.Tensor):
        key = _view_key(obj)
        if key is not None and key in seen:
            return seen[key]
        copied = make(obj, old, used)
        if key is not None:
            seen[key] = copied
        return copied
    if isinstance(obj, dict):
        try:
            out = type(obj)()  # an OrderedDict stays one: a module's state dict
        except TypeError:
            out = {}
        olds = old if isinstance(old, dict) else {}
        for k, v in obj.items():
            out[k] = _copy(v, seen, olds.get(k), used, make)
        if hasattr(obj, "_metadata"):  # a module state dict's versions, which load_state_dict reads
            out._metadata = copy.deepcopy(obj._metadata)
        return out
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        olds = old if type(old) is type(obj) and len(old) == len(obj) else [None] * len(obj)
        copied = [_copy(v, seen, o, used, make) for v, o in zip(obj, olds, strict=True)]
        return copied if isinstance(obj, list) else tuple(copied)
    return copy.deepcopy(obj)


def _tensor_copy(tensor: torch.Tensor, old: Any, used: set[int]) -> torch.Tensor:
    """``tensor`` copied to the CPU: into ``old`` where it is a CPU tensor of the same shape, dtype and
    strides (what a fresh copy would be) not overwritten yet, else into a new one."""
    tensor = tensor.detach()
    if (type(old) is torch.Tensor and id(old) not in used and old.device.type == "cpu"
            and old.dtype == tensor.dtype and old.shape == tensor.shape and old.stride() == tensor.stride()
            and old.storage_offset() == 0 and old is not tensor):
        used.add(id(old))
        return old.copy_(tensor)
    return tensor.to("cpu", copy=True)


def _blank_tensor(tensor: torch.Tensor, old: Any, used: set[int]) -> torch.Tensor:
    """A CPU tensor like ``tensor``'s copy, its memory faulted in by writing a zero into every page
    (one thread: the training's threads keep the cores)."""
    del old, used
    made = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
    storage = made.untyped_storage()
    if storage.nbytes():
        pages = torch.empty(0, dtype=torch.uint8).set_(storage)[::mmap.PAGESIZE]
        pages.numpy().fill(0)
    return made


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
