"""Optimizer and scheduler wrappers that respect gradient accumulation and fp16 scaling.

``AcceleratedOptimizer``: ``step`` and ``zero_grad`` do nothing while gradients are
being accumulated; under fp16 ``step`` goes through the ``GradScaler`` and records
whether the scaler skipped it (inf/NaN gradients).

``AcceleratedScheduler`` (the peer's semantics): nothing while accumulating or when
the optimizer step was skipped; otherwise ``num_processes`` steps per optimizer
step (each process saw 1/N of the batches an un-sharded loop would) unless
``split_batches``, where it steps once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from notebook_accel.runtime.gradient_state import GradientState


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer``; behaves like it, except while accumulating gradients.

    Attributes not defined here are looked up on the wrapped optimizer.

    Args:
        optimizer: the user's optimizer.
        gradient_state: the owning Accelerator's state.
        scaler: the fp16 ``GradScaler``, if any.
        before_step: called with ``optimizer`` before each real step (on XLA: reduce the
            gradients across replicas, which replaces DDP there).
        after_step: called after each real step (on XLA: ``mark_step``).

    ``step_hooks``: callables given this optimizer after each real step (``checkpoint.snapshots``
    counts steps there); never pickled with it.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, gradient_state: GradientState, scaler: Any = None,
        before_step: Callable[[torch.optim.Optimizer], None] | None = None,
        after_step: Callable[[], None] | None = None,
    ) -> None:
        # Deliberately no super().__init__: this is a proxy, state lives in ``optimizer``.
        self.optimizer = optimizer
        self.gradient_state = gradient_state
        self.scaler = scaler
        self.before_step = before_step
        self.after_step = after_step
        self._is_overflow = False  # the peer's name: its tests set it to fake a skipped step
        self.step_hooks: list[Callable[[AcceleratedOptimizer], None]] = []

    def __getattr__(self, name: str) -> Any:
        if name == "optimizer":  # not yet set (e.g. during unpickling)
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "step_hooks": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"step_hooks": [], **state})

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients, unless gradients are being accumulated."""
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def train(self) -> None:
        """Forward ``train()`` for optimizers that have it (schedule-free)."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        """Forward ``eval()`` for optimizers that have it (schedule-free)."""
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last ``step`` was skipped by the fp16 scaler (inf/NaN gradients)."""
        return self._is_overflow

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Step the optimizer, unless accumulating; through the scaler under fp16."""
        if not self.gradient_state.sync_gradients:
            return None
        if self.before_step is not None:
            self.before_step(self.optimizer)
        if self.scaler is None:
            self._is_overflow = False
            result = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        else:
            result = self._scaled_step(closure)
        if self.after_step is not None:
            self.after_step()
        self._stepped()
        return result

    def _stepped(self) -> None:
        """A real step was taken: call the ``step_hooks``."""
        for hook in self.step_hooks:
            hook(self)

    def _scaled_step(self, closure: Callable[[], Any] | None) -> Any:
        # The scaler calls optimizer.step only for finite gradients: watch for that call.
        called = False
        inner = self.optimizer.step
        had_own = "step" in self.optimizer.__dict__
        saved = self.optimizer.__dict__.get("step")

        def probe(*args: Any, **kwargs: Any) -> Any:
            nonlocal called
            called = True
            return inner(*args, **kwargs)

        self.optimizer.step = probe  # type: ignore[method-assign]
        try:
            args = () if closure is None else (closure,)
            result = self.scaler.step(self.optimizer, *args)
            self.scaler.update()
        finally:
            if had_own:
                self.optimizer.step = saved  # type: ignore[method-assign]
            else:
                del self.optimizer.step
        self._is_overflow = not called
        return result


class AcceleratedScheduler:
    """Wraps a learning-rate scheduler so it steps as the peer's does.

    Args:
        scheduler: the torch scheduler.
        optimizers: the prepared optimizers (a skipped step skips the scheduler).
        gradient_state: the owning Accelerator's state.
        num_processes: steps per optimizer step when not ``split_batches``.
        split_batches: step once per optimizer step.
        step_with_optimizer: when ``False``, ``step`` always steps once, like the raw scheduler.

    ``step_hooks``: callables given this scheduler after each ``step`` call; never pickled with it.
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[AcceleratedOptimizer],
        gradient_state: GradientState,
        num_processes: int,
        split_batches: bool = False,
        step_with_optimizer: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.gradient_state = gradient_state
        self.num_processes = num_processes
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer
        self.step_hooks: list[Callable[[AcceleratedScheduler], None]] = []

    def __getattr__(self, name: str) -> Any:
        if name in ("scheduler", "step_hooks"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "step_hooks": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"step_hooks": [], **state})

    def __repr__(self) -> str:
        return f"AcceleratedScheduler({self.scheduler!r})"

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step as the peer does (see the module docstring), then call the ``step_hooks``."""
        self._step(*args, **kwargs)
        for hook in self.step_hooks:
            hook(self)

    def _step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        times = 1 if self.split_batches else self.num_processes
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(times):
            if total is not None and self.scheduler.last_epoch >= total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)
