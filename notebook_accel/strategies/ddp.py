"""DDP: torch's ``DistributedDataParallel`` over several processes, or one process alone.

The default strategy: models are placed on the device, their forward autocast, and
(several processes) wrapped in DDP, which all-reduces gradients in backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel

from notebook_accel.runtime.state import DistributedType
from notebook_accel.strategies.base import Strategy, StrategyContext
from notebook_accel.strategies.ddp_comm_hooks import register_comm_hook


class DdpStrategy(Strategy):
    """Data parallelism with ``DistributedDataParallel`` (``NO``, ``MULTI_CPU``, ``MULTI_GPU``)."""

    name: ClassVar[str] = "ddp"

    @classmethod
    def wanted(cls, context: StrategyContext, plugin: Any) -> bool:
        return True  # the fallback: the registry asks it last

    def setup_model(self, model: torch.nn.Module, place: bool, evaluation_mode: bool,
                    optimizers: list[torch.optim.Optimizer]) -> torch.nn.Module:
        """Placed and autocast; wrapped in DDP (with its communication hook) when several
        processes train it."""
        model = super().setup_model(model, place, evaluation_mode, optimizers)
        trainable = any(p.requires_grad for p in model.parameters())
        if self.num_processes > 1 and trainable and not evaluation_mode and not isinstance(model, DistributedDataParallel):
            device_ids = [self.state.local_process_index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=device_ids, **self.context.ddp_kwargs)
            register_comm_hook(model, self.context.ddp_comm_hook)
        return model

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any]) -> Iterator[None]:
        """``torch.distributed.algorithms.Join`` over ``joinables`` (several processes; the process
        state's type decides, as in the peer, whose scripts change it to see the warning)."""
        if self.distributed_type not in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU):
            self._warn_join_unsupported()
            yield
            return
        from torch.distributed.algorithms.join import Join

        with Join(joinables):
            yield
