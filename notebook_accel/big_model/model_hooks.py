"""The hook protocol users compose by hand (the peer's ``accelerate.hooks``): a ``ModelHook`` runs
around a module's ``forward`` (with its keyword arguments), ``add_hook_to_module`` attaches one.

Every hook of ours runs through it: dispatch's (``hooks.ModuleHook``), ``AlignDevicesHook``,
``CpuOffload``.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

MOVERS = ("to", "cpu", "cuda")  # the methods dispatch guards on a dispatched model, dropped on removal


class ModelHook:
    """Callbacks around a module's forward. ``no_grad``: run the forward under ``torch.no_grad()``."""

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """When attached; returns the module."""
        return module

    def pre_forward(self, module: nn.Module, *args, **kwargs) -> tuple[tuple, dict]:
        """Before the forward; returns the ``(args, kwargs)`` it is called with."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output):
        """After the forward; returns the output."""
        return output

    def forward_failed(self, module: nn.Module) -> None:
        """When the forward raised (ours: undo what ``pre_forward`` brought in)."""

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """When removed; returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks, each event run through them in order."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module):
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module, *args, **kwargs):
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module, output):
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def forward_failed(self, module):
        for hook in self.hooks:
            getattr(hook, "forward_failed", lambda m: None)(module)

    def detach_hook(self, module):
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args, **kwargs):
    hook = module._hf_hook
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    try:
        with torch.no_grad() if hook.no_grad else contextlib.nullcontext():
            output = module._old_forward(*args, **kwargs)
    except BaseException:
        getattr(hook, "forward_failed", lambda m: None)(module)
        raise
    return hook.post_forward(module, output)


def _is_graph_module(module: nn.Module) -> bool:
    # an fx GraphModule's forward is its class's: an instance attribute would freeze the graph
    return "GraphModuleImpl" in str(type(module))


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Run ``hook`` around ``module``'s forward (name and signature kept), replacing its hook, or
    chained after it (a ``SequentialHook``) with ``append``; returns the module."""
    old_hook = getattr(module, "_hf_hook", None)
    if append and old_hook is not None:
        remove_hook_from_module(module)
        hook = SequentialHook(old_hook, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        old_forward = module._old_forward
    else:
        old_forward = module._old_forward = module.forward
    module = hook.init_hook(module)
    module._hf_hook = hook
    forward = functools.update_wrapper(functools.partial(_hooked_forward, module), old_forward)
    if _is_graph_module(module):
        type(module).forward = forward
    else:
        module.forward = forward
    return module


DISPATCHED = "_notebook_accel_dispatch"  # a model dispatch_model hooked: the record of how (its ``undo``)


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach ``module``'s hook and give it its own forward back (its children's too with
    ``recurse``); returns the module. A model ``dispatch_model`` / ``cpu_offload`` hooked is
    undispatched (its offloaded weights back in place), as the peer's hooks give theirs back."""
    dispatched = module.__dict__.get(DISPATCHED)
    if dispatched is not None:
        dispatched.undo(module)
    if hasattr(module, "_hf_hook"):
        module._hf_hook.detach_hook(module)
        delattr(module, "_hf_hook")
    if hasattr(module, "_old_forward"):
        if _is_graph_module(module):
            type(module).forward = module._old_forward
        else:
            module.forward = module._old_forward
        delattr(module, "_old_forward")
    for name in MOVERS:
        module.__dict__.pop(name, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and of every module inside it."""
    remove_hook_from_module(module, recurse=True)
