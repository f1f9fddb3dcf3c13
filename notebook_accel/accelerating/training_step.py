"""The ``Accelerator``'s training step: backward, gradient accumulation, autocast, unscaling
and clipping (the mechanics: the strategy's, and ``runtime.precision``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from notebook_accel.runtime import precision


class TrainingStep:
    """One step's calls over ``self.strategy``, ``self.scaler`` and ``self.gradient_state``: when
    gradients synchronise (every N-th micro-step, or every one with ``sync_each_batch``) and how
    they are made final before they are inspected."""

    strategy: Any
    scaler: Any
    gradient_state: Any
    sync_each_batch: bool
    sync_gradients: bool
    mixed_precision: str
    device: torch.device
    _optimizers: list[Any]

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the fp16 scaler skipped the last optimizer step (inf/NaN gradients)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled under fp16 (the strategy's)."""
        self.strategy.backward(loss, self.scaler, **kwargs)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One micro-step: gradients sync (and the optimizer steps) every N-th time, or at the loader's end."""
        self.gradient_state.do_sync()
        with contextlib.ExitStack() as stack:
            if not (self.gradient_state.sync_gradients or self.sync_each_batch):
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip the gradients' synchronisation inside the block (DDP's all-reduce; the strategy's)."""
        return self.strategy.no_sync(model)

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Make the next backward all-reduce DDP gradients although the forward ran under ``no_sync``
        (wrap the last of several backwards; a null context when ``model`` is not DDP-wrapped)."""
        return self.strategy.trigger_sync_in_backward(model)

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager[Any]:
        """Autocast for this accelerator's mixed precision and device (``autocast_handler.enabled``:
        the peer's ``AutocastKwargs``)."""
        enabled = getattr(autocast_handler, "enabled", True)
        return precision.autocast_context(self.mixed_precision, self.device, enabled=enabled)

    def unscale_gradients(self) -> None:
        """Unscale fp16 gradients before inspecting them (done once per optimizer step)."""
        if self.scaler is not None and self.sync_gradients:
            precision.unscale(self.scaler, [opt.optimizer for opt in self._optimizers])

    def _settle_gradients(self) -> None:
        """Make the gradients final before they are inspected: unscaled (fp16), then as the strategy
        has them at a step (``Strategy.settle_gradients``)."""
        self.unscale_gradients()
        if self.sync_gradients:
            self.strategy.settle_gradients(self._optimizers)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Unscale (fp16), then clip as the strategy does (FSDP2: the global norm; DeepSpeed: the
        engine's ``gradient_clipping``); returns the total norm."""
        self._settle_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Unscale (fp16), then ``torch.nn.utils.clip_grad_value_`` (``ValueError`` under DeepSpeed)."""
        self._settle_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value)
