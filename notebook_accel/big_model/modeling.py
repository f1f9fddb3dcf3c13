"""The peer's ``accelerate.utils.modeling`` helpers that users call directly, over big_model's pieces:
sizes (``dtype_byte_size``, ``convert_file_size_to_int``, ``compute_module_total_buffer_size``),
tied weights (``find_tied_parameters``, ``retie_parameters``), device maps (``clean_device_map``,
``check_device_map``), a module's tensors (``named_module_tensors``, ``get_non_persistent_buffers``,
``set_module_tensor_to_device``, ``align_module_device``) and ``get_state_dict_offloaded_model``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from notebook_accel.big_model.dispatch import state_dict_with_offloaded
from notebook_accel.big_model.hooks import bring_all, offloading_hook
from notebook_accel.big_model.memory import as_dtype, parse_size, tensor_bytes
from notebook_accel.big_model.model_tensors import get_tensor, owning_entry, set_tensor, split_name


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes per element of ``dtype`` (``1/8`` for ``torch.bool``, as the peer counts it)."""
    if dtype == torch.bool:
        return 1 / 8
    return torch.empty((), dtype=dtype).element_size()


def convert_file_size_to_int(size: int | str) -> int:
    """``"100MB"`` -> ``10**8``, ``"2GiB"`` -> ``2 * 2**30``, ``500`` -> ``500``.

    Raises:
        ValueError: a negative size, or a string that is not a number and a unit.
    """
    return parse_size(size)


def compute_module_total_buffer_size(model: nn.Module, dtype: torch.dtype | str | None = None,
                                     special_dtypes: Mapping[str, torch.dtype] | None = None) -> int:
    """Bytes of every buffer of ``model`` (floating-point ones counted as ``dtype`` if given)."""
    dtype, special = as_dtype(dtype), special_dtypes or {}
    return sum(tensor_bytes(b, special.get(name, dtype)) for name, b in model.named_buffers())


def find_tied_parameters(model: nn.Module) -> list[list[str]]:
    """Groups of parameter names sharing one parameter (each sorted; groups ordered by first name)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return sorted(sorted(group) for group in names.values() if len(group) > 1)


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make each group of names share its first name's parameter again (after a load untied them)."""
    for group in tied_params:
        shared = get_tensor(model, group[0])
        for name in group[1:]:
            set_tensor(model, name, shared)


def clean_device_map(device_map: dict[str, Any], module_name: str = "") -> dict[str, Any]:
    """Merge, in place, the entries under ``module_name`` that all share one device into one entry
    (``{"a.x": 0, "a.y": 0}`` -> ``{"a": 0}``), then do the same in each child; returns the map."""
    prefix = f"{module_name}." if module_name else ""
    under = [key for key in device_map if key.startswith(prefix)]
    devices = {str(device_map[key]) for key in under}
    if len(under) > 1 and len(devices) == 1:
        device = device_map[under[0]]
        for key in under:
            del device_map[key]
        device_map[module_name] = device
        return device_map
    depth = module_name.count(".") + 2 if module_name else 1
    for child in sorted({".".join(key.split(".")[:depth]) for key in under}):
        if child != module_name:
            clean_device_map(device_map, child)
    return device_map


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Check that ``device_map`` places every tensor of ``model``.

    Raises:
        ValueError: naming the tensors no entry covers.

    Warns (``UserWarning``) about entries that name no module or tensor of ``model``.
    """
    modules = {name for name, _ in model.named_modules()}
    tensors = [name for name, _ in model.named_parameters()] + [name for name, _ in model.named_buffers()]
    unknown = [key for key in device_map if key and key not in modules and key not in tensors]
    if unknown:
        warnings.warn(f"device_map keys do not match any submodules in the model: {unknown}", stacklevel=2)
    unplaced = [name for name in tensors if owning_entry(name, device_map) is None]
    if unplaced:
        raise ValueError(f"The device_map provided does not give any device for the following parameters: "
                         f"{', '.join(unplaced)}")


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


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: int | str | torch.device | None = None,
                        ) -> Iterator[None]:
    """Inside the block, ``module``'s own weights are real and on one device: an offloaded module's
    are brought in (to ``execution_device``, default where it runs), another's are moved to
    ``execution_device`` if given; afterwards they are as before."""
    hook = offloading_hook(module)
    if hook is not None:
        device = torch.device(execution_device) if execution_device is not None else hook.device
        for name, tensor in bring_all(hook.sources, device).items():
            set_tensor(module, name, tensor)
        try:
            yield
        finally:
            hook.drop_weights()
        return
    if execution_device is None:
        yield
        return
    before = dict(module.named_parameters(recurse=False))
    for name in before:
        set_module_tensor_to_device(module, name, execution_device)
    try:
        yield
    finally:
        for name, param in before.items():  # the very parameters again
            set_tensor(module, name, param)


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict with its offloaded weights read into CPU memory (a dispatched or
    offloaded model's placeholders are meta)."""
    return state_dict_with_offloaded(model)
