"""Local SGD (the peer's ``accelerate.local_sgd``): each process takes ``local_sgd_steps``
optimizer steps alone (DDP's gradient all-reduce is off), then the processes average their
parameters. Less communication, for DDP on CPUs or GPUs (not FSDP, DeepSpeed or XLA)."""

from __future__ import annotations

from typing import Any

import torch

from notebook_accel.runtime.state import DistributedType

_SUPPORTED = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


class LocalSGD:
    """A context manager around the training loop; call :meth:`step` after each optimizer step.

    Args:
        accelerator: the ``Accelerator`` that prepared ``model``.
        model: the prepared model whose parameters are averaged.
        local_sgd_steps: optimizer steps between two averages.
        enabled: False: plain DDP (it is off anyway with a single process).
    Raises:
        NotImplementedError: the accelerator's strategy is not DDP.

    Example::

        with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd:
            for batch in loader:
                ...
                optimizer.step()
                local_sgd.step()
    """

    def __init__(self, accelerator: Any, model: torch.nn.Module, local_sgd_steps: int,
                 enabled: bool = True) -> None:
        if accelerator.distributed_type not in _SUPPORTED:
            raise NotImplementedError("LocalSGD is supported only for CPUs and GPUs (no DeepSpeed "
                                      f"or FSDP); this job is {accelerator.distributed_type}")
        self.enabled = enabled and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: Any = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.model.no_sync()
            self._no_sync.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.enabled:
            self._sync_and_avg_model_params()
            self._no_sync.__exit__(*exc_info)

    def step(self) -> None:
        """Count an optimizer step; every ``local_sgd_steps`` steps, average the parameters."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        self.accelerator.wait_for_everyone()
        with self.accelerator.autocast():
            for param in self.model.parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")
