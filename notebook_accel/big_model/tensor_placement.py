"""A module's tensors as the peer's helpers see them: listed (``named_module_tensors``,
``get_non_persistent_buffers``) and put on a device one by one (``set_module_tensor_to_device``)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from notebook_accel.big_model.memory import as_dtype
from notebook_accel.big_model.model_tensors import get_tensor, set_tensor, split_name


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False) -> set[str]:
    """The names of ``module``'s non-persistent buffers (a copy; with ``recurse``, its submodules'
    too, by their own short names, as the peer lists them)."""
    found = set(module._non_persistent_buffers_set)
    if recurse:
        for sub in module.modules():
            found |= sub._non_persistent_buffers_set
    return found


def named_module_tensors(module: nn.Module, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """``module``'s parameters, then its buffers (``include_buffers``), leaving out the non-persistent
    ones with ``remove_non_persistent``; the module is not changed."""
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skip = get_non_persistent_buffers(module, recurse) if remove_non_persistent else set()
        for name, buffer in module.named_buffers(recurse=recurse):
            if split_name(name)[1] not in skip:
                yield name, buffer


def set_module_tensor_to_device(
    module: nn.Module, tensor_name: str, device: int | str | torch.device, value: torch.Tensor | None = None,
    dtype: torch.dtype | str | None = None, fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict | None = None, non_blocking: bool = False, clear_cache: bool = True,
) -> None:
    """Put the parameter or buffer ``tensor_name`` of ``module`` on ``device`` (a parameter stays
    a parameter), holding ``value`` if given (cast to ``dtype``, else to the old tensor's dtype).

    ``tied_params_map`` and ``clear_cache`` are accepted for the peer's callers (ties here stay
    ties by object identity; nothing is cached). ``fp16_statistics`` belongs to bitsandbytes'
    8-bit weights, which big_model does not load.

    Raises:
        ValueError: no such tensor, a ``value`` of another shape, a meta tensor moved without a
            ``value``, or ``fp16_statistics``.
    """
    module_name, attr = split_name(tensor_name)
    owner = module.get_submodule(module_name)
    if attr not in owner._parameters and attr not in owner._buffers:
        raise ValueError(f"{module} does not have a parameter or a buffer named {tensor_name}.")
    if fp16_statistics is not None:
        raise ValueError("fp16_statistics (bitsandbytes 8-bit weights) is not supported by notebook_accel")
    old = get_tensor(module, tensor_name)
    device = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    if value is None:
        if old.is_meta and device.type != "meta":
            raise ValueError(f"{tensor_name} is on the meta device, we need a `value` to put in on {device}.")
        value = old
    elif old is not None and old.shape != value.shape:
        raise ValueError(f'Trying to set a tensor of shape {value.shape} in "{attr}" (which has shape '
                         f"{old.shape}), this looks incorrect.")
    dtype = as_dtype(dtype)
    if dtype is None and old is not None and value.is_floating_point():
        dtype = old.dtype
    if dtype is not None and (value.is_floating_point() or value.is_complex()):
        value = value.to(dtype)
    with torch.no_grad():
        moved = value.to(device, non_blocking=non_blocking)
    set_tensor(module, tensor_name, moved.detach() if isinstance(moved, nn.Parameter) else moved)
