"""The Accelerator's FSDP behaviour now lives in ``notebook_accel.strategies.fsdp`` (the strategy seam).

``FsdpRuntime(plugin, mixed_precision, device)`` still builds it: the strategy, sharding.
"""

from __future__ import annotations

import torch

from notebook_accel.fsdp.plugin import FullyShardedDataParallelPlugin
from notebook_accel.strategies.base import StrategyContext
from notebook_accel.strategies.fsdp import FsdpStrategy


def FsdpRuntime(plugin: FullyShardedDataParallelPlugin, mixed_precision: str,  # noqa: N802  (the former class)
                device: torch.device) -> FsdpStrategy:
    """The FSDP strategy for ``plugin``, sharding over the process group.

    Raises:
        ValueError: on an XLA device.
    """
    strategy = FsdpStrategy(StrategyContext.on_device(device, mixed_precision), plugin)
    strategy.sharding = True
    return strategy


__all__ = ["FsdpRuntime", "FsdpStrategy"]
