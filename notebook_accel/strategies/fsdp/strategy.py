"""FSDP2: models sharded over the processes with torch's ``fully_shard``.

The mechanics live beside it in this folder (``plugin``, ``sharding``, ``state_dict``,
``checkpointing``), imported when a job actually shards. One GPU shards over a group of one
process (as the peer under a launcher: CPU offload lets a single GPU train a model it cannot
hold); one CPU process has nothing to gain, so nothing is sharded there (models are set up as in
DDP's one-process case), but ``save_state`` still writes the FSDP layout, so checkpoints move
between world sizes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import torch

from notebook_accel.runtime import compilation
from notebook_accel.runtime.device import device_kind
from notebook_accel.runtime.optim import AcceleratedOptimizer
from notebook_accel.runtime.state import DistributedType, ensure_process_group
from notebook_accel.strategies.base import Strategy, StrategyContext
from notebook_accel.strategies.fsdp.plugin import resolve_plugin


class FsdpStrategy(Strategy):
    """Fully sharded data parallelism (``DistributedType.FSDP`` when sharding).

    Raises:
        ValueError: on a device kind that is not torch-native (XLA).
    """

    name: ClassVar[str] = "fsdp"

    def __init__(self, context: StrategyContext, plugin: Any = None) -> None:
        device_kind(context.state.device).refuse("FSDP (fully_shard)",
                                                 " (no fsdp_plugin), or run on device 'cuda' or 'cpu'")
        super().__init__(context, plugin)
        self.sharding = self.num_processes > 1 or self.device.type == "cuda"
        if self.sharding and self.num_processes == 1:
            ensure_process_group(self.collective_backend, 0, 1, None, self.device, alone=True)
        self.skeletons: dict[int, torch.nn.Module] = {}  # id(sharded model) -> meta copy of the original
        self.new_params: dict[int, torch.nn.Parameter] = {}  # id(original parameter) -> sharded one

    @classmethod
    def resolve_plugin(cls, given: Any) -> Any:
        return resolve_plugin(given)

    @classmethod
    def wanted(cls, context: StrategyContext, plugin: Any) -> bool:
        """With a plugin; not for one process on a device kind that is not torch-native (XLA), which
        shards nothing and runs as that kind's default (several such processes are refused when built)."""
        alone_elsewhere = not device_kind(context.state.device).torch_native and context.state.num_processes == 1
        return plugin is not None and not alone_elsewhere

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.FSDP if self.sharding else self.state.distributed_type

    def owns(self, model: Any) -> bool:
        """Whether ``model`` was sharded here."""
        if id(model) not in self.skeletons:
            return False
        from torch.distributed.fsdp import FSDPModule

        return isinstance(model, FSDPModule)

    def setup_model(self, model: torch.nn.Module, place: bool, evaluation_mode: bool,
                    optimizers: list[torch.optim.Optimizer]) -> torch.nn.Module:
        """Sharded in place when it trains over several processes: moved to the device first (``place``;
        not from the meta device: ``cpu_ram_efficient_loading`` fills it), optimizers prepared before
        pointed at its new parameters; mixed precision is then the sharding's policy."""
        if not (self.sharding and not evaluation_mode and any(p.requires_grad for p in model.parameters())):
            return super().setup_model(model, place, evaluation_mode, optimizers)
        from notebook_accel.strategies.fsdp.sharding import shard_model
        from notebook_accel.strategies.fsdp.state_dict import meta_skeleton

        if place and not any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            model.to(self.device)
        skeleton = meta_skeleton(model)
        self.new_params.update(shard_model(model, self.plugin, self.mixed_precision, self.device))
        self.skeletons[id(model)] = skeleton
        for optimizer in optimizers:
            self.rebind(optimizer)
        return model

    def compile_model(self, model: torch.nn.Module, plugin: Any) -> torch.nn.Module:
        """A sharded model is compiled in place (``nn.Module.compile``): the same module, so
        ``fully_shard``'s hooks run and this strategy still knows it."""
        return compilation.compile_model(model, plugin, in_place=self.owns(model))

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, scaler: Any) -> AcceleratedOptimizer:
        self.rebind(optimizer)  # models prepared first got new (sharded) parameters
        return super().setup_optimizer(optimizer, scaler)

    def rebind(self, optimizer: torch.optim.Optimizer) -> None:
        """Replace parameters ``fully_shard`` replaced in ``optimizer``'s groups (and its state)."""
        if not self.new_params:
            return
        for group in optimizer.param_groups:
            group["params"] = [self.new_params.get(id(p), p) for p in group["params"]]
        for old in list(optimizer.state):
            new = self.new_params.get(id(old))
            if new is not None:
                optimizer.state[new] = optimizer.state.pop(old)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """FSDP2's gradient-sync switch off inside the block, for a sharded model."""
        return self._no_sync(model) if self.owns(model) else super().no_sync(model)

    @staticmethod
    @contextlib.contextmanager
    def _no_sync(model: Any) -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip to the global norm over every rank's shards; returns that norm (a plain tensor).

        Unsharded parameters (``ignored_modules``) count with their local gradients.
        """
        if not self.sharding:
            return super().clip_grad_norm_(parameters, max_norm, norm_type)
        from torch.distributed.tensor import DTensor

        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        sharded = [p for p in params if isinstance(p.grad, DTensor)]
        local = [p for p in params if p.grad is not None and not isinstance(p.grad, DTensor)]
        norms = []
        if sharded:
            norm = torch.nn.utils.get_total_norm([p.grad for p in sharded], norm_type)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if local:
            norm = torch.nn.utils.get_total_norm([p.grad for p in local], norm_type)
            norms.append(norm.to(norms[0].device) if norms else norm)
        if not norms:
            return torch.tensor(0.0)
        stacked = torch.stack(norms)
        total = stacked.max() if math.isinf(norm_type) else stacked.pow(norm_type).sum().pow(1.0 / norm_type)
        for group in (sharded, local):  # torch's foreach kernels do not mix DTensors and tensors
            if group:
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    def unwrap(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True,
               keep_torch_compile: bool = False) -> torch.nn.Module:
        """A sharded model: a full, plain copy (every rank calls it; each gets a copy)."""
        if not self.owns(model):
            return super().unwrap(model, keep_fp32_wrapper, keep_torch_compile)
        from notebook_accel.strategies.fsdp.state_dict import plain_module

        return plain_module(self.skeletons[id(model)], model, self.device)

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """A sharded model: the full weights on rank 0's CPU (``{}`` elsewhere); every rank calls it."""
        if not self.owns(model):
            return super().model_state_dict(model, unwrap)
        from notebook_accel.strategies.fsdp.state_dict import full_state_dict

        return full_state_dict(model, rank0_only=True)

    def checkpointer(self, models: list[torch.nn.Module], optimizers: list[AcceleratedOptimizer]) -> Any:
        """The FSDP layout, on any number of processes."""
        from notebook_accel.strategies.fsdp.checkpointing import FsdpCheckpointer

        return FsdpCheckpointer(models, optimizers, str(self.plugin.state_dict_type))
