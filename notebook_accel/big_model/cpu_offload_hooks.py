"""Whole-model CPU offload for pipelines of models (the peer's ``CpuOffload``): a model stays in
CPU memory until it runs, then stays on its device until the next model's hook sends it back."""

from __future__ import annotations

import torch
from torch import nn

from notebook_accel.big_model.align_hooks import move_to
from notebook_accel.big_model.devices import DeviceKey, current_devices
from notebook_accel.big_model.model_hooks import (
    ModelHook,
    add_hook_to_module,
    remove_hook_from_module,
)


def default_execution_device() -> torch.device:
    """The first GPU, else the CPU."""
    return torch.device("cuda", 0) if current_devices().gpu_count() else torch.device("cpu")


class CpuOffload(ModelHook):
    """Move the module to the CPU when attached and to ``execution_device`` (default: the first GPU,
    else the CPU) when it runs; ``prev_module_hook`` (a ``UserCpuOffloadHook``): the previous model
    in the pipeline, sent back to the CPU first."""

    def __init__(self, execution_device: DeviceKey | torch.device | None = None,
                 prev_module_hook: UserCpuOffloadHook | None = None) -> None:
        self.prev_module_hook = prev_module_hook
        self.execution_device = execution_device if execution_device is not None else default_execution_device()

    def init_hook(self, module):
        return module.to("cpu")

    def pre_forward(self, module, *args, **kwargs):
        previous = self.prev_module_hook
        if isinstance(previous, UserCpuOffloadHook) and _device(previous.model).type != "cpu":
            previous.offload()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        device = torch.device(self.execution_device)
        if _device(module) == device:
            return args, kwargs
        module.to(device)
        return move_to(args, device), move_to(kwargs, device)


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


class UserCpuOffloadHook:
    """A model and its ``CpuOffload``: ``offload()`` sends the model back to the CPU, ``remove()``
    takes the hook off."""

    def __init__(self, model: nn.Module, hook: ModelHook) -> None:
        self.model, self.hook = model, hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)


def cpu_offload_with_hook(model: nn.Module, execution_device: DeviceKey | torch.device | None = None,
                          prev_module_hook: UserCpuOffloadHook | None = None) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep ``model`` on the CPU until it runs (then on ``execution_device`` until offloaded: by the
    returned hook's ``offload()``, or by the next model's hook given it as ``prev_module_hook``)."""
    hook = CpuOffload(execution_device, prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)
