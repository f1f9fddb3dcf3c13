"""``AlignDevicesHook``: a module's inputs and weights on one execution device while it runs, its
weights kept elsewhere (``offload``) otherwise; the ``attach_*`` helpers put one on each module that
holds tensors. Dispatch's hook (``hooks.ModuleHook``) is one, streaming from safetensors files."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from notebook_accel.big_model.model_hooks import ModelHook, add_hook_to_module
from notebook_accel.big_model.model_tensors import set_tensor, split_name
from notebook_accel.big_model.tensor_placement import (
    named_module_tensors,
    set_module_tensor_to_device,
)


def move_to(value, device: torch.device | str | int | None, skip_keys: Iterable[str] | str | None = ()):
    """``value`` (tensors nested in tuples, lists, dicts) with every tensor on ``device``; a mapping's
    ``skip_keys`` stay where they are."""
    if device is None:
        return value
    skip = {skip_keys} if isinstance(skip_keys, str) else set(skip_keys or ())
    if skip and isinstance(value, Mapping):
        return type(value)({k: v if k in skip else move_to(v, device) for k, v in value.items()})
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, value)


def first_device(value) -> torch.device | None:
    """The device of the first tensor in ``value`` (nested), if any."""
    return next((x.device for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor)), None)


class PrefixedWeights(Mapping):
    """``weights`` seen from inside one module: its names without the module's ``prefix``."""

    def __init__(self, weights: Mapping, prefix: str) -> None:
        self.weights, self.prefix = weights, prefix

    def __getitem__(self, key):
        return self.weights[self.prefix + key]

    def __iter__(self):
        return (k[len(self.prefix):] for k in self.weights if k.startswith(self.prefix))

    def __len__(self):
        return sum(1 for _ in self)


class AlignDevicesHook(ModelHook):
    """Inputs (and, with ``offload``, weights from ``weights_map``) on ``execution_device`` for the
    forward; offloaded weights are meta placeholders outside it. ``io_same_device``: outputs go back
    to the inputs' device. ``offload_buffers``: buffers are offloaded too; ``place_submodules``: the
    submodules' tensors are this hook's as well. ``tied_params_map`` is accepted for the peer's
    callers (ties here stay ties by object identity)."""

    def __init__(self, execution_device: int | str | torch.device | None = None, offload: bool = False,
                 io_same_device: bool = False, weights_map: Mapping | None = None, offload_buffers: bool = False,
                 place_submodules: bool = False, skip_keys: str | list[str] | None = None,
                 tied_params_map: dict | None = None) -> None:
        self.execution_device = execution_device
        self.offload, self.io_same_device, self.weights_map = offload, io_same_device, weights_map
        self.offload_buffers, self.place_submodules = offload_buffers, place_submodules
        self.skip_keys, self.tied_params_map = skip_keys, tied_params_map
        self.input_device: torch.device | None = None
        self.original_devices: dict[str, torch.device] = {}

    def __repr__(self) -> str:
        return (f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
                f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
                f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})")

    def offloaded_names(self, module: nn.Module) -> list[str]:
        """The names of the tensors brought in for the forward (relative to ``module``)."""
        return [name for name, _ in named_module_tensors(
            module, include_buffers=self.offload_buffers, recurse=self.place_submodules, remove_non_persistent=True)]

    def bring_weights(self, module: nn.Module, device) -> None:
        """The offloaded tensors, real, on ``device``."""
        for name in self.offloaded_names(module):
            set_module_tensor_to_device(module, name, device, value=self.weights_map[name])

    def drop_weights(self, module: nn.Module) -> None:
        """The offloaded tensors back to meta placeholders."""
        for name in self.offloaded_names(module):
            set_module_tensor_to_device(module, name, "meta")

    def init_hook(self, module):
        device = self.execution_device
        if not self.offload:
            if device is not None:
                for name, _ in named_module_tensors(module, recurse=self.place_submodules):
                    set_module_tensor_to_device(module, name, device)
            return module
        tensors = dict(named_module_tensors(module, recurse=self.place_submodules))
        self.original_devices = {name: tensor.device for name, tensor in tensors.items()}
        if self.weights_map is None:
            self.weights_map = {name: tensors[name].to("cpu") for name in self.offloaded_names(module)}
        self.drop_weights(module)
        if device is not None:  # the buffers that stay: on the execution device
            for name, _ in module.named_buffers(recurse=self.place_submodules):
                owner, attr = split_name(name)
                kept = attr in module.get_submodule(owner)._non_persistent_buffers_set or not self.offload_buffers
                if kept:
                    set_module_tensor_to_device(module, name, device)
        return module

    def pre_forward(self, module, *args, **kwargs):
        if self.io_same_device:
            self.input_device = first_device([args, kwargs])
        if self.offload:
            self.bring_weights(module, self.execution_device)
        return move_to(args, self.execution_device), move_to(kwargs, self.execution_device, self.skip_keys)

    def forward_failed(self, module):
        if self.offload:
            self.drop_weights(module)

    def post_forward(self, module, output):
        if self.offload:
            self.drop_weights(module)
        if self.io_same_device and self.input_device is not None:
            output = move_to(output, self.input_device, self.skip_keys)
        return output

    def detach_hook(self, module):
        if self.offload:
            for name, device in self.original_devices.items():
                if device.type != "meta":
                    set_module_tensor_to_device(module, name, device, value=self.weights_map.get(name))
        return module


def offloading_hook(module: nn.Module) -> AlignDevicesHook | None:
    """``module``'s hook, if it is an ``AlignDevicesHook`` that offloads its weights."""
    hook = getattr(module, "_hf_hook", None)
    return hook if isinstance(hook, AlignDevicesHook) and hook.offload else None


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module``'s own weights are offloaded (``dispatch_model`` to "cpu" or "disk",
    ``cpu_offload``, ``disk_offload``, an ``AlignDevicesHook(offload=True)``): kept elsewhere,
    brought to its device only while it runs."""
    return offloading_hook(module) is not None


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: int | str | torch.device | None = None,
                        ) -> Iterator[None]:
    """Inside the block, ``module``'s own weights are real and on one device: an offloaded module's
    are brought in (to ``execution_device``, default where it runs), another's are moved to
    ``execution_device`` if given; afterwards they are as before."""
    hook = offloading_hook(module)
    if hook is not None:
        hook.bring_weights(module, execution_device if execution_device is not None else hook.execution_device)
        try:
            yield
        finally:
            hook.drop_weights(module)
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


def attach_execution_device_hook(module: nn.Module, execution_device, skip_keys=None,
                                  preload_module_classes: Iterable[str] | None = None,
                                  tied_params_map: dict | None = None) -> None:
    """An ``AlignDevicesHook(execution_device)`` on every module holding state (a non-empty
    ``state_dict()``) and no hook yet (not inside a module of a ``preload_module_classes``
    class). One ``state_dict()`` of the whole model tells which modules hold state (by its
    keys' prefixes), not one at every level (O(parameters x depth))."""
    holding = {key[:end + 1] for key in module.state_dict(keep_vars=True)
               for end in (-1, *(i for i, char in enumerate(key) if char == "."))}

    def attach(module: nn.Module, prefix: str) -> None:
        if not hasattr(module, "_hf_hook") and prefix in holding:
            add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys,
                                                        tied_params_map=tied_params_map))
        if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
            return
        for name, child in module.named_children():
            attach(child, f"{prefix}{name}.")

    attach(module, "")


def attach_align_device_hook(module: nn.Module, execution_device=None, offload: bool = False,
                             weights_map: Mapping | None = None, offload_buffers: bool = False,
                             module_name: str = "", skip_keys=None,
                             preload_module_classes: Iterable[str] | None = None,
                             tied_params_map: dict | None = None) -> None:
    """An ``AlignDevicesHook`` (chained after any hook there) on every module holding tensors of its
    own; a module of a ``preload_module_classes`` class, offloaded, brings its submodules' too.
    ``weights_map`` is keyed by names from the model's root (``module_name``: ``module``'s)."""
    whole = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if whole or next(named_module_tensors(module), None) is not None:
        prefix = f"{module_name}." if module_name else ""
        hook = AlignDevicesHook(execution_device, offload=offload,
                                weights_map=None if weights_map is None else PrefixedWeights(weights_map, prefix),
                                offload_buffers=offload_buffers, place_submodules=whole, skip_keys=skip_keys,
                                tied_params_map=tied_params_map)
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for name, child in module.named_children():
        attach_align_device_hook(child, execution_device, offload, weights_map, offload_buffers,
                                 f"{module_name}.{name}" if module_name else name, skip_keys,
                                 preload_module_classes, tied_params_map)


def attach_align_device_hook_on_blocks(module: nn.Module, execution_device=None, offload=False,
                                       weights_map: Mapping | None = None, offload_buffers: bool = False,
                                       module_name: str = "", skip_keys=None,
                                       preload_module_classes: Iterable[str] | None = None,
                                       tied_params_map: dict | None = None) -> None:
    """Hooks per block: ``execution_device`` and ``offload`` are one value for the whole module or
    ``{block name: value}``. A block kept on its device gets one hook placing it whole; an offloaded
    block gets ``attach_align_device_hook``; the root sends outputs back to the inputs' device."""
    common = dict(skip_keys=skip_keys, tied_params_map=tied_params_map)
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if offload:
            attach_align_device_hook(module, execution_device, True, weights_map, offload_buffers, module_name,
                                     **common)
        else:
            add_hook_to_module(module, AlignDevicesHook(execution_device, io_same_device=True,
                                                        place_submodules=True, **common))
        return
    if not isinstance(execution_device, Mapping):
        execution_device = dict.fromkeys(offload, execution_device)
    if not isinstance(offload, Mapping):
        offload = dict.fromkeys(execution_device, offload)
    root = module_name == ""
    if module_name in execution_device and module_name in offload:
        device = execution_device[module_name]
        if not offload[module_name]:
            add_hook_to_module(module, AlignDevicesHook(device, offload_buffers=offload_buffers, io_same_device=root,
                                                        place_submodules=True, **common))
            attach_execution_device_hook(module, device, **common)
        else:
            attach_align_device_hook(module, device, True, weights_map, offload_buffers, module_name,
                                     preload_module_classes=preload_module_classes, **common)
            if not hasattr(module, "_hf_hook"):
                add_hook_to_module(module, AlignDevicesHook(device, io_same_device=root, **common))
            attach_execution_device_hook(module, device, preload_module_classes=preload_module_classes, **common)
    elif root:
        add_hook_to_module(module, AlignDevicesHook(execution_device.get(""), io_same_device=True, **common))
    for name, child in module.named_children():
        attach_align_device_hook_on_blocks(child, execution_device, offload, weights_map, offload_buffers,
                                           f"{module_name}.{name}" if module_name else name,
                                           preload_module_classes=preload_module_classes, **common)
