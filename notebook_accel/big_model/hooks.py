"""Forward hooks of a dispatched model: move inputs to a module's device, bring offloaded weights in
just before it runs and drop them right after."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._pytree import tree_map

from notebook_accel.big_model.model_tensors import set_tensor
from notebook_accel.big_model.safetensors_io import StoredTensor, map_tensors, prefetch

_OFFLOADING: weakref.WeakKeyDictionary[nn.Module, ModuleHook] = weakref.WeakKeyDictionary()  # module -> its hook


def offloading_hook(module: nn.Module) -> ModuleHook | None:
    """The hook that brings ``module``'s offloaded weights in while it runs, if it has one."""
    return _OFFLOADING.get(module)


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module``'s own weights are offloaded (``dispatch_model`` to "cpu" or "disk",
    ``cpu_offload``, ``disk_offload``): kept elsewhere, brought to its device only while it runs."""
    return module in _OFFLOADING


@dataclass(frozen=True)
class WeightSource:
    """Where an offloaded tensor is kept: bytes in a safetensors file, or a tensor in memory."""

    value: StoredTensor | torch.Tensor
    dtype: torch.dtype | None = None  # floating-point tensors are cast to this when brought in

    def bring(self, device: torch.device, mapped: torch.Tensor | None = None) -> torch.Tensor:
        tensor = mapped if mapped is not None else self.value
        dtype = self.dtype if self.dtype is not None and tensor.is_floating_point() else tensor.dtype
        return tensor.to(device=device, dtype=dtype)  # no copy when already in place

    def materialize(self, device: torch.device) -> torch.Tensor:
        """The tensor on ``device`` in memory of its own (never a view of the file)."""
        if not isinstance(self.value, StoredTensor):
            return self.bring(device)
        view = map_tensors({"": self.value})[""]
        out = self.bring(device, view)
        return out.clone() if out.numel() and out.data_ptr() == view.data_ptr() else out


def stored_parts(sources: Mapping[str, WeightSource]) -> dict[str, StoredTensor]:
    return {name: s.value for name, s in sources.items() if isinstance(s.value, StoredTensor)}


def bring_all(sources: Mapping[str, WeightSource], device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors of ``sources`` on ``device``; file-backed ones are zero-copy views on the CPU."""
    stored = stored_parts(sources)
    mapped = map_tensors(stored) if stored else {}
    return {name: source.bring(device, mapped.get(name)) for name, source in sources.items()}


def move_to(value, device: torch.device, skip_keys: Iterable[str] = ()):
    """``value`` (tensors nested in tuples, lists, dicts) with every tensor on ``device``."""
    skip = set(skip_keys)
    if skip and isinstance(value, Mapping):
        return type(value)({k: v if k in skip else move_to(v, device) for k, v in value.items()})
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, value)


def _first_tensor_device(args, kwargs) -> torch.device | None:
    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.Tensor):
            return value.device
    return None


@dataclass(eq=False)
class ModuleHook:
    """The hooks of one module of a dispatched model.

    ``sources`` (names relative to the module) are brought to ``device`` before the module runs and
    replaced by their meta placeholders after it returns (or raises). ``restore_output`` (the root)
    sends outputs back to the device the first input came from.
    """

    module: nn.Module
    device: torch.device
    sources: dict[str, WeightSource] = field(default_factory=dict)
    move_inputs: bool = True
    restore_output: bool = False
    skip_keys: tuple[str, ...] = ()
    next_streamed: ModuleHook | None = field(default=None, repr=False)  # streamed after this one

    def __post_init__(self) -> None:
        self.placeholders = {}
        for name in self.sources:
            module_name, _, attr = name.rpartition(".")
            owner = self.module.get_submodule(module_name)
            held = owner._parameters if attr in owner._parameters else owner._buffers
            self.placeholders[name] = held[attr]
        self._input_device: list[torch.device | None] = []
        if self.sources:
            _OFFLOADING[self.module] = self
        self.handles = [
            self.module.register_forward_pre_hook(self._before, with_kwargs=True),
            self.module.register_forward_hook(self._after, with_kwargs=True, always_call=True),
        ]

    def _before(self, module, args, kwargs):
        if self.restore_output:
            self._input_device.append(_first_tensor_device(args, kwargs))
        if self.sources:
            for name, tensor in bring_all(self.sources, self.device).items():
                set_tensor(self.module, name, tensor)
            if self.next_streamed is not None:
                prefetch(stored_parts(self.next_streamed.sources).values())
        if self.move_inputs:
            return move_to(args, self.device), move_to(kwargs, self.device)
        return None

    def _after(self, module, args, kwargs, output):
        self.drop_weights()
        if self.restore_output:
            device = self._input_device.pop() if self._input_device else None
            if device is not None:
                return move_to(output, device, self.skip_keys)
        return None

    def drop_weights(self) -> None:
        """Put the meta placeholders back, letting the brought-in weights go."""
        for name, placeholder in self.placeholders.items():
            set_tensor(self.module, name, placeholder)

    def remove(self) -> None:
        if _OFFLOADING.get(self.module) is self:
            del _OFFLOADING[self.module]
        for handle in self.handles:
            handle.remove()
