"""``torch.compile`` for prepared models: whole, or region by region, and the "compiling" phase.

``compile_model`` is what a strategy's ``compile_model`` does (``strategies/base.py``): the
wrapped model in an ``OptimizedModule`` (``model._orig_mod`` is what it wraps), or, with
regional compilation, each block of the model's ``nn.ModuleList`` s of repeated blocks compiled
on its own (the compiler reuses the first block's work). ``in_place`` compiles with
``nn.Module.compile`` instead, keeping the module object (FSDP2's sharded modules, DeepSpeed's).

While dynamo compiles (lazily, in the first steps), the worker's phase is ``"compiling"``: a
``Phase`` event (``wire``) at the start and the end of each compilation, which the kernel's
views show as ``rank 0 compiling (12.0 s)``.
"""

from __future__ import annotations

import sys
from types import MethodType
from typing import Any

import torch

from notebook_accel import events
from notebook_accel.wire import Kind

COMPILING = "compiling"


def is_compiled_module(module: Any) -> bool:
    """Whether ``module`` is what ``torch.compile(module)`` returns (an ``OptimizedModule``)."""
    if "torch._dynamo" not in sys.modules:  # nothing was compiled (and importing it takes seconds)
        return False
    return isinstance(module, torch._dynamo.eval_frame.OptimizedModule)


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Whether some submodule of ``module`` was compiled with ``torch.compile``."""
    if "torch._dynamo" not in sys.modules:
        return False
    return any(is_compiled_module(sub) for sub in module.modules())


def is_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an ``nn.ModuleList`` of blocks of one class."""
    return (isinstance(module, torch.nn.ModuleList) and len(module) > 0
            and all(isinstance(m, type(module[0])) for m in module))


def has_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds repeated blocks somewhere (see ``is_repeated_blocks``)."""
    return any(is_repeated_blocks(sub) for sub in module.modules())


def compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """A copy of ``module``'s structure whose repeated blocks are each ``torch.compile`` d, and
    whose other leaves (a head...) are compiled separately; parameters are shared, not copied.
    Each copied module keeps its original as ``__dict__["_orig_mod"]`` (not a submodule), so
    unwrapping gives the originals back.
    """

    def regions(mod: torch.nn.Module) -> torch.nn.Module:
        if is_repeated_blocks(mod):
            return torch.nn.ModuleList(torch.compile(block, **compile_kwargs) for block in mod)
        if not has_repeated_blocks(mod):
            return torch.compile(mod, **compile_kwargs)
        new = mod.__class__.__new__(mod.__class__)
        new.__dict__.update(mod.__dict__)
        for name, value in list(new.__dict__.items()):  # methods bound to the original: rebind
            if getattr(value, "__self__", None) is mod and hasattr(value, "__func__"):
                new.__dict__[name] = MethodType(value.__func__, new)
        new._modules = {name: regions(child) for name, child in mod.named_children()}
        new.__dict__["_orig_mod"] = mod
        return new

    return regions(module)


def compile_regions_in_place(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """``compile_regions`` with ``nn.Module.compile``: the same module objects, each repeated
    block (or leaf) compiled in place, so hooks installed on them (FSDP2's) still run."""
    if is_repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            compile_regions_in_place(child, **compile_kwargs)
    else:
        module.compile(**compile_kwargs)
    return module


def _check_backend(name: str) -> None:
    available = torch._dynamo.list_backends(exclude_tags=())
    if name not in available:
        raise ValueError(f"dynamo backend {name!r} is not available in this torch "
                         f"({torch.__version__}); available: {', '.join(available)}")


def compile_model(model: torch.nn.Module, plugin: Any, in_place: bool = False) -> torch.nn.Module:
    """``model`` compiled as ``plugin`` (a ``TorchDynamoPlugin``) says; unchanged when it is off
    or ``model`` is compiled already.

    Raises:
        ValueError: the plugin's backend is not registered in this torch (naming those that are).
    """
    if plugin is None or not plugin.enabled or is_compiled_module(model) or has_compiled_regions(model):
        return model
    kwargs = plugin.to_kwargs()
    _check_backend(kwargs["backend"])  # always there: the plugin is enabled
    report_compiling()
    if plugin.use_regional_compilation:
        return (compile_regions_in_place if in_place else compile_regions)(model, **kwargs)
    if in_place:
        model.compile(**kwargs)
        return model
    return torch.compile(model, **kwargs)


def _started(_args: Any) -> None:
    events.emit(Kind.PHASE, {"name": COMPILING}, key="phase")


def _ended(_args: Any) -> None:
    events.emit(Kind.PHASE, {"name": None}, key="phase")


def report_compiling() -> None:
    """In a launched worker: send the ``compiling`` phase to the kernel whenever dynamo compiles
    (its compile callbacks, which also cover the lazily compiled backward). Idempotent."""
    if not events.active():
        return
    handler = torch._dynamo.callback.callback_handler
    if _started not in handler.start_callbacks:
        handler.register_start_callback(_started)
        handler.register_end_callback(_ended)
