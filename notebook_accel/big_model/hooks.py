"""Dispatch's hooks (``AlignDevicesHook``s): move inputs to a module's device, bring offloaded
weights in (from safetensors files or memory) just before it runs and drop them right after."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from notebook_accel.big_model.align_hooks import AlignDevicesHook, first_device, move_to
from notebook_accel.big_model.model_hooks import add_hook_to_module, remove_hook_from_module
from notebook_accel.big_model.model_tensors import get_tensor, set_tensor
from notebook_accel.big_model.safetensors_io import StoredTensor, map_tensors, prefetch


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


class SourceWeights(Mapping):
    """``sources`` as a ``weights_map``: each tensor read into CPU memory when asked for."""

    def __init__(self, sources: Mapping[str, WeightSource]) -> None:
        self.sources = sources

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.sources[name].materialize(torch.device("cpu"))

    def __iter__(self):
        return iter(self.sources)

    def __len__(self) -> int:
        return len(self.sources)


class ModuleHook(AlignDevicesHook):
    """Dispatch's hook of one module, attached when made (the model is already in place).

    ``sources`` (names relative to the module) are brought to ``device`` before the module runs and
    replaced by their meta placeholders (shared by tied names) after it returns or raises; the next
    streamed module's file pages are prefetched meanwhile. ``restore_output`` (the root) sends
    outputs back to the device the first input came from.
    """

    def __init__(self, module: nn.Module, device: torch.device, sources: Mapping[str, WeightSource] | None = None,
                 move_inputs: bool = True, restore_output: bool = False, skip_keys: tuple[str, ...] = ()) -> None:
        self.sources = dict(sources or {})
        super().__init__(device, offload=bool(self.sources), io_same_device=restore_output,
                         weights_map=SourceWeights(self.sources), skip_keys=list(skip_keys) or None)
        self.module, self.move_inputs = module, move_inputs
        self.next_streamed: ModuleHook | None = None  # streamed after this one
        self.placeholders = {name: get_tensor(module, name) for name in self.sources}
        self._input_devices: list[torch.device | None] = []  # a stack: a module may run inside itself
        add_hook_to_module(module, self)

    def init_hook(self, module):
        return module

    def detach_hook(self, module):
        return module  # undispatch_model brings the weights back

    def bring_weights(self, module: nn.Module, device) -> None:
        for name, tensor in bring_all(self.sources, torch.device(device)).items():
            set_tensor(module, name, tensor)

    def drop_weights(self, module: nn.Module | None = None) -> None:
        for name, placeholder in self.placeholders.items():
            set_tensor(self.module, name, placeholder)

    def pre_forward(self, module, *args, **kwargs):
        if self.io_same_device:
            self._input_devices.append(first_device([args, kwargs]))
        if self.sources:
            self.bring_weights(module, self.execution_device)
            if self.next_streamed is not None:
                prefetch(stored_parts(self.next_streamed.sources).values())
        if self.move_inputs:
            return move_to(args, self.execution_device), move_to(kwargs, self.execution_device)
        return args, kwargs

    def forward_failed(self, module):
        self.drop_weights()
        if self.io_same_device and self._input_devices:
            self._input_devices.pop()

    def post_forward(self, module, output):
        self.drop_weights()
        device = self._input_devices.pop() if self.io_same_device and self._input_devices else None
        return move_to(output, device, self.skip_keys) if device is not None else output

    def remove(self) -> None:
        if getattr(self.module, "_hf_hook", None) is self:
            remove_hook_from_module(self.module)
