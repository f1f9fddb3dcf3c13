"""XLA: TPU cores through torch_xla (imported lazily, by ``notebook_accel.runtime.xla``).

Moving a model to an XLA device makes new ``Parameter`` objects, so optimizers are
pointed at them; with several cores the optimizer averages the gradients (once per
step, before clipping when the loop clips) instead of a DDP wrapper; every optimizer
step ends the step's graph. Tensors are copied to the CPU before saving (by the device kind, ``XlaDevice``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from notebook_accel.runtime import precision, xla
from notebook_accel.runtime.optim import AcceleratedOptimizer
from notebook_accel.strategies.base import Strategy, StrategyContext


class XlaStrategy(Strategy):
    """Data parallelism over XLA devices (``DistributedType.XLA``)."""

    name: ClassVar[str] = "xla"

    def __init__(self, context: StrategyContext, plugin: Any = None) -> None:
        super().__init__(context, plugin)
        self.moved_parameters: dict[int, torch.nn.Parameter] = {}  # id(old) -> parameter on the device

    @classmethod
    def wanted(cls, context: StrategyContext, plugin: Any) -> bool:
        return context.state.device.type == "xla"

    def setup_model(self, model: torch.nn.Module, place: bool, evaluation_mode: bool,
                    optimizers: list[torch.optim.Optimizer]) -> torch.nn.Module:
        """Moved to the device (optimizers prepared before pointed at its new parameters), autocast."""
        if place:
            self.moved_parameters.update(xla.move_model(model, self.device))
            for optimizer in optimizers:
                xla.rebind_parameters(optimizer, self.moved_parameters)
        precision.wrap_forward(model, self.mixed_precision, self.device)
        return model

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, scaler: Any) -> AcceleratedOptimizer:
        """Pointed at the moved parameters; averages gradients across cores before its step (once: the
        Accelerator has it done before clipping, see ``runtime.xla.GradientReducer``), and ends the graph after it."""
        xla.rebind_parameters(optimizer, self.moved_parameters)
        reducer = xla.GradientReducer() if self.num_processes > 1 else None
        return AcceleratedOptimizer(optimizer, self.gradient_state, scaler, reducer, xla.sync)

    def settle_gradients(self, optimizers: list[AcceleratedOptimizer]) -> None:
        """Average the gradients across the cores now (before clipping); their step will not repeat it."""
        for optimizer in optimizers:
            if optimizer.before_step is not None:  # its GradientReducer (several cores)
                optimizer.before_step.reduce_now(optimizer.optimizer)
