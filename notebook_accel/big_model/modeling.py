"""The peer's ``accelerate.utils.modeling`` helpers that users call directly, over big_model's pieces:
sizes (``dtype_byte_size``, ``convert_file_size_to_int``, ``compute_module_total_buffer_size``),
tied weights (``find_tied_parameters``, ``retie_parameters``, ``get_module_size_with_ties``), device maps (``clean_device_map``,
``check_device_map``) and ``get_state_dict_offloaded_model``. A module's tensors one by one are
``tensor_placement``'s; ``align_module_device`` is ``align_hooks``'.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from notebook_accel.big_model.dispatch import state_dict_with_offloaded
from notebook_accel.big_model.memory import as_dtype, parse_size, tensor_bytes
from notebook_accel.big_model.model_tensors import get_tensor, owning_entry, set_tensor


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


def get_module_size_with_ties(tied_params: list[str], module_size: int, module_sizes: Mapping[str, int],
                              modules_to_treat: list[tuple[str, nn.Module]]) -> tuple[int, list[str], list[nn.Module]]:
    """A module's size with the modules it shares weights with (the peer's step of its device-map
    search; our planner, ``planner._Plan._tie_partners``, keeps tied pieces together by itself).

    Args:
        tied_params: names of weights tied to the module's, held by modules in ``modules_to_treat``.
        module_size: the module's own size.
        module_sizes: size per module / tensor name (``compute_module_sizes``).
        modules_to_treat: the ``(name, module)`` pairs not placed yet.

    Returns:
        The size with each holder of a tied weight added (less the shared weight itself, counted
        once), and those holders' names and modules, one per tied weight.
    """
    names: list[str] = []
    modules: list[nn.Module] = []
    size = module_size
    for param in tied_params:
        name, module = next((n, m) for n, m in modules_to_treat if param.startswith(f"{n}."))
        names.append(name)
        modules.append(module)
        size += module_sizes[name] - module_sizes[param]
    return size, names, modules


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


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict with its offloaded weights read into CPU memory (a dispatched or
    offloaded model's placeholders are meta)."""
    return state_dict_with_offloaded(model)
