"""``cpu_offload`` / ``disk_offload``: keep every weight off the execution device until its module
runs, one module at a time."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable

import torch
from torch import nn

from notebook_accel.big_model.devices import DeviceKey, current_devices
from notebook_accel.big_model.dispatch import dispatch_model


def _per_module(model: nn.Module, tier: str) -> dict[str, str]:
    """``{name: tier}`` for every module holding tensors of its own (the finest hooks possible)."""
    return {
        name: tier
        for name, module in model.named_modules()
        if next(itertools.chain(module.parameters(recurse=False), module.buffers(recurse=False)), None)
        is not None
    }


def _execution_device(device: DeviceKey | torch.device | None) -> DeviceKey | torch.device:
    if device is not None:
        return device
    return 0 if current_devices().gpu_count() else "cpu"


def cpu_offload(
    model: nn.Module,
    execution_device: DeviceKey | torch.device | None = None,
    offload_buffers: bool = False,
    preload_module_classes: Iterable[str] | None = None,
) -> nn.Module:
    """Keep the weights in CPU memory and copy each module's to ``execution_device`` (default: the
    first GPU, else the CPU, where nothing needs copying) only while it runs; a module of a
    ``preload_module_classes`` class brings its submodules' weights with its own."""
    return dispatch_model(
        model, _per_module(model, "cpu"), main_device=_execution_device(execution_device),
        offload_buffers=offload_buffers, force_hooks=True, preload_module_classes=preload_module_classes,
    )


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike,
    execution_device: DeviceKey | torch.device | None = None,
    offload_buffers: bool = False,
    preload_module_classes: Iterable[str] | None = None,
) -> nn.Module:
    """Write the weights once to a safetensors file in ``offload_dir`` and free them; each module's
    weights are then memory-mapped from there (zero-copy on the CPU) only while it runs (with its
    submodules' for a ``preload_module_classes`` class)."""
    return dispatch_model(
        model, _per_module(model, "disk"), main_device=_execution_device(execution_device),
        offload_dir=offload_dir, offload_buffers=offload_buffers, force_hooks=True,
        preload_module_classes=preload_module_classes,
    )
