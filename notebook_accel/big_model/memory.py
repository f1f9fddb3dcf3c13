"""Sizes: of modules, of memory budgets, and how much memory each device has free."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import psutil
import torch
from torch import nn

from notebook_accel.big_model.devices import (
    DeviceKey,
    current_devices,
    device_order,
    normalize_device,
)

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(size: int | float | str) -> int:
    """``"1GiB"`` -> 1073741824, ``"10GB"`` -> 10**10, ``512`` -> 512.

    Raises:
        ValueError: naming the value and the accepted units.
    """
    if isinstance(size, bool):
        raise ValueError(f"memory size {size!r} is not a size")
    if isinstance(size, (int, float)):
        if size < 0:
            raise ValueError(f"memory size {size!r} is negative")
        return int(size)
    match = _SIZE.match(size) if isinstance(size, str) else None
    unit = match.group(2).upper() if match else None
    if unit not in _UNITS:
        raise ValueError(
            f"memory size {size!r} is not a number of bytes or a number with one of the units "
            f"{', '.join(u for u in _UNITS if u and u != 'B')} (e.g. '10GiB')"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def dtype_size(dtype: torch.dtype) -> float:
    """Bytes per element (fractional for sub-byte types)."""
    if dtype == torch.bool:
        return 1
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.bits / 8


def tensor_bytes(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    """Bytes ``tensor`` takes once loaded, floating-point tensors cast to ``dtype`` if given."""
    if dtype is not None and tensor.dtype.is_floating_point:
        return math.ceil(tensor.numel() * dtype_size(dtype))
    return math.ceil(tensor.numel() * dtype_size(tensor.dtype))


def named_tensors(module: nn.Module, prefix: str = "", recurse: bool = True) -> Iterable[tuple[str, torch.Tensor]]:
    """Parameters then buffers of ``module``, each shared tensor once, names prefixed."""
    yield from module.named_parameters(prefix=prefix, recurse=recurse)
    yield from module.named_buffers(prefix=prefix, recurse=recurse)


def compute_module_sizes(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype] | None = None,
) -> dict[str, int]:
    """Bytes of every module and tensor of ``model`` by name (``""`` is the whole model).

    Args:
        model: the model (meta tensors are fine: only shapes and dtypes are read).
        dtype: count floating-point tensors as this dtype (the dtype they will be loaded in).
        special_dtypes: per-tensor dtypes that override ``dtype``.

    Returns:
        ``{"": total, "layers": ..., "layers.0": ..., "layers.0.weight": ..., ...}``; a tensor
        shared by several modules (tied weights) counts once, in the first module holding it.
    """
    dtype = as_dtype(dtype)
    special_dtypes = special_dtypes or {}
    sizes: dict[str, int] = {}
    for name, tensor in named_tensors(model):
        size = tensor_bytes(tensor, special_dtypes.get(name, dtype))
        parts = name.split(".")
        for end in range(len(parts) + 1):
            key = ".".join(parts[:end])
            sizes[key] = sizes.get(key, 0) + size
    sizes.setdefault("", 0)
    return sizes


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``"float16"`` / ``"torch.float16"`` / ``torch.float16`` -> ``torch.float16``."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype {dtype!r} is not a torch dtype (e.g. 'float16', 'bfloat16', 'float32')")
    return value


def get_max_memory(max_memory: Mapping[DeviceKey, int | str] | None = None) -> dict[DeviceKey, int]:
    """Memory budget per device in bytes, GPUs first, then ``"cpu"`` (and ``"disk"`` if given).

    Args:
        max_memory: ``{0: "10GiB", "cpu": "30GiB"}``; sizes may be ints or strings. ``None``: the free
            memory of every GPU and the available memory of this machine.

    Given budgets are only parsed, not checked against the hardware, so a plan for GPUs can be
    made anywhere (``dispatch_model`` checks the devices exist).

    Raises:
        ValueError: for an unknown device key or a malformed size.
    """
    devices = current_devices()
    if max_memory is None:
        found: dict[DeviceKey, int] = {i: devices.gpu_free_memory(i) for i in range(devices.gpu_count())}
        found["cpu"] = psutil.virtual_memory().available
        return found
    parsed = {normalize_device(key): parse_size(value) for key, value in max_memory.items()}
    return dict(sorted(parsed.items(), key=lambda item: device_order(item[0])))


def largest_unit_size(
    model: nn.Module, sizes: Mapping[str, int], no_split_module_classes: Iterable[str] = ()
) -> int:
    """Bytes of the largest piece the planner may not split: a no-split module or a leaf module."""
    no_split = set(no_split_module_classes)
    largest, stack = 0, [("", model)]
    while stack:
        name, module = stack.pop()
        children = list(module.named_children())
        if not children or type(module).__name__ in no_split:
            largest = max(largest, sizes.get(name, 0))
            continue
        direct = [t for t in named_tensors(module, name, recurse=False)]
        largest = max([largest] + [sizes.get(n, 0) for n, _ in direct])
        stack.extend((f"{name}.{child}" if name else child, sub) for child, sub in children)
    return largest


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype] | None = None,
    low_zero: bool = False,
) -> dict[DeviceKey, int]:
    """Budgets that spread ``model`` evenly over the GPUs instead of filling GPU 0 first.

    Each GPU gets its share of the model plus room for the largest unsplittable piece, capped by its
    own budget. With ``low_zero`` GPU 0 keeps only what the other GPUs cannot hold (room for
    generation outputs there). CPU and disk budgets are left unchanged.
    """
    budgets = get_max_memory(max_memory)
    gpus = [key for key in budgets if isinstance(key, int) and budgets[key] > 0]
    if len(gpus) <= 1:
        return budgets
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    largest = largest_unit_size(model, sizes, no_split_module_classes or ())
    sharing = gpus[1:] if low_zero else gpus
    share = math.ceil(sizes[""] / len(sharing)) + largest
    for key in sharing:
        budgets[key] = min(budgets[key], share)
    if low_zero:
        rest = max(0, sizes[""] - sum(budgets[key] - largest for key in sharing))
        budgets[gpus[0]] = min(budgets[gpus[0]], rest + (largest if rest else 0))
    return budgets
