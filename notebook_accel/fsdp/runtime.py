"""``FsdpRuntime``: what an ``Accelerator`` does differently when it shards with FSDP2.

The Accelerator keeps one of these when it has an FSDP plugin and more than one
process, and hands it the FSDP-specific parts of ``prepare``, ``no_sync``,
``clip_grad_norm_``, ``unwrap_model`` and ``get_state_dict`` (checkpoints: ``fsdp.checkpointing``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from notebook_accel.fsdp.plugin import FullyShardedDataParallelPlugin
from notebook_accel.fsdp.sharding import shard_model
from notebook_accel.fsdp.state_dict import full_state_dict, meta_skeleton, plain_module


class FsdpRuntime:
    """FSDP2 behaviour for one Accelerator.

    Args:
        plugin: the validated plugin.
        mixed_precision: the Accelerator's choice (``"no"``, ``"bf16"``, ``"fp16"``).
        device: the Accelerator's device.

    Raises:
        ValueError: on an XLA device.
    """

    def __init__(self, plugin: FullyShardedDataParallelPlugin, mixed_precision: str, device: torch.device) -> None:
        if device.type == "xla":
            raise ValueError("FSDP (fully_shard) does not run on XLA devices; on TPU use the default data "
                             "parallelism (no fsdp_plugin), or run on device 'cuda' or 'cpu'")
        self.plugin = plugin
        self.mixed_precision = mixed_precision
        self.device = device
        self.skeletons: dict[int, torch.nn.Module] = {}  # id(sharded model) -> meta copy of the original
        self.new_params: dict[int, torch.nn.Parameter] = {}  # id(original parameter) -> sharded one

    def owns(self, model: Any) -> bool:
        """Whether ``model`` was sharded by this runtime."""
        return isinstance(model, FSDPModule) and id(model) in self.skeletons

    def prepare_model(self, model: torch.nn.Module, optimizers: Iterable[Any], place: bool = True) -> torch.nn.Module:
        """Move ``model`` to the device (``place``; not from the meta device: ``cpu_ram_efficient_loading``
        fills it), shard it in place and point already-prepared ``optimizers`` at its new parameters."""
        if place and not any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            model.to(self.device)
        skeleton = meta_skeleton(model)
        self.new_params.update(shard_model(model, self.plugin, self.mixed_precision, self.device))
        self.skeletons[id(model)] = skeleton
        for opt in optimizers:
            self.rebind(opt.optimizer)
        return model

    def rebind(self, optimizer: torch.optim.Optimizer) -> None:
        """Replace parameters ``fully_shard`` replaced in ``optimizer``'s groups (and its state)."""
        for group in optimizer.param_groups:
            group["params"] = [self.new_params.get(id(p), p) for p in group["params"]]
        for old in list(optimizer.state):
            new = self.new_params.get(id(old))
            if new is not None:
                optimizer.state[new] = optimizer.state.pop(old)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Accumulate unreduced gradients locally inside the block (FSDP2's gradient-sync switch)."""
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    @staticmethod
    def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip to the global norm over every rank's shards; returns that norm (a plain tensor).

        Unsharded parameters (``ignored_modules``) count with their local gradients.
        """
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

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """A full, plain copy of sharded ``model`` (every rank calls it; each gets a copy)."""
        return plain_module(self.skeletons[id(model)], model, self.device)

    def state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        """The full weights on rank 0's CPU (``{}`` elsewhere); every rank calls it."""
        return full_state_dict(model, rank0_only=True)

