"""A model's tensors by name: which device-map entry places each one, and how to swap one in."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from notebook_accel.big_model.devices import DeviceKey


def all_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, tied ones under each of their names."""
    found = dict(model.named_parameters(remove_duplicate=False))
    found.update(model.named_buffers(remove_duplicate=False))
    return found


def buffer_names(model: nn.Module) -> set[str]:
    return {name for name, _ in model.named_buffers(remove_duplicate=False)}


def shared_names(model: nn.Module) -> dict[str, list[str]]:
    """For each tensor name, every name of the same tensor object (itself included)."""
    by_id: dict[int, list[str]] = {}
    for name, tensor in all_tensors(model).items():
        by_id.setdefault(id(tensor), []).append(name)
    return {name: names for names in by_id.values() for name in names}


def owning_entry(name: str, device_map: Mapping[str, DeviceKey]) -> str | None:
    """The most specific device-map entry that covers tensor ``name`` (``""`` covers everything)."""
    parts = name.split(".")
    for end in range(len(parts), -1, -1):
        prefix = ".".join(parts[:end])
        if prefix in device_map:
            return prefix
    return None


def entries_of_tensors(model: nn.Module, device_map: Mapping[str, DeviceKey]) -> dict[str, str]:
    """``{tensor name: its device-map entry}`` for every tensor of ``model``.

    Raises:
        ValueError: naming the tensors no entry covers, or entries that name nothing in the model.
    """
    tensors = all_tensors(model)
    owners = {name: owning_entry(name, device_map) for name in tensors}
    uncovered = [name for name, entry in owners.items() if entry is None]
    if uncovered:
        shown = ", ".join(uncovered[:5]) + (f" and {len(uncovered) - 5} more" if len(uncovered) > 5 else "")
        raise ValueError(f"device_map places no device for {shown}; add them, or a module holding them")
    modules = dict(model.named_modules(remove_duplicate=False))
    unknown = [entry for entry in device_map if entry not in modules and entry not in tensors]
    if unknown:
        raise ValueError(f"device_map names {unknown}, which are neither modules nor tensors of the model")
    return owners  # type: ignore[return-value]


def split_name(name: str) -> tuple[str, str]:
    module, _, attr = name.rpartition(".")
    return module, attr


def set_tensor(model: nn.Module, name: str, value: torch.Tensor) -> None:
    """Put ``value`` at ``name``: a parameter stays a parameter (same class and ``requires_grad``
    where the dtype allows), a buffer stays a buffer. A ``Parameter`` value is used as it is."""
    module_name, attr = split_name(name)
    module = model.get_submodule(module_name)
    if attr in module._parameters:
        old = module._parameters[attr]
        if not isinstance(value, nn.Parameter):
            grad = old is not None and old.requires_grad and (value.is_floating_point() or value.is_complex())
            kind = type(old) if old is not None else nn.Parameter
            value = kind(value, requires_grad=grad)
        module._parameters[attr] = value
    elif attr in module._buffers:
        module._buffers[attr] = value
    else:
        raise ValueError(f"{name!r} is neither a parameter nor a buffer of the model")


def get_tensor(model: nn.Module, name: str) -> torch.Tensor:
    module_name, attr = split_name(name)
    module = model.get_submodule(module_name)
    return module._parameters[attr] if attr in module._parameters else module._buffers[attr]
