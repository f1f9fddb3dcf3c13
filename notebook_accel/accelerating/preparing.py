"""The ``Accelerator``'s ``prepare``: each object to its ``prepare_*`` (the dispatch:
``strategies.preparation``; wrapping and sharding: the strategy's; loaders: ``data.prepare``)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from notebook_accel.data.prepare import DataLoaderShard, shard_data_loader, skip_first_batches
from notebook_accel.runtime.optim import AcceleratedOptimizer, AcceleratedScheduler
from notebook_accel.strategies.preparation import mark_prepared, prepare_objects


class Preparing:
    """``prepare`` and ``prepare_model`` / ``_optimizer`` / ``_scheduler`` / ``_data_loader``: each
    prepared object is kept (``self._models``...) for ``save_state``, snapshots and clipping."""

    strategy: Any
    state: Any
    gradient_state: Any
    device: torch.device
    device_placement: bool
    dataloader_config: Any
    step_scheduler_with_optimizer: bool
    scaler: Any
    num_processes: int
    process_index: int
    split_batches: bool
    distributed_type: Any
    _models: list[torch.nn.Module]
    _optimizers: list[AcceleratedOptimizer]
    _schedulers: list[AcceleratedScheduler]
    _dataloaders: list[DataLoaderShard]
    _snapshots: Any
    _auto_resume: Any

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and data loaders, returned in the given order.

        Schedulers are prepared last, so they can find their prepared optimizers.
        Other objects are returned unchanged.
        """
        self.distributed_type.check_supported()
        placement = device_placement or [self.device_placement] * len(args)
        if len(placement) != len(args):
            raise ValueError(f"device_placement has {len(placement)} entries for {len(args)} objects")
        out = prepare_objects(self, list(args), placement)
        if self._auto_resume is not None:
            self._auto_resume.after_prepare(self)
        return out[0] if len(out) == 1 else tuple(out)

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        """Move ``model`` to the device, autocast its forward, wrap it in DDP when distributed
        (or shard it with FSDP2 when there is an FSDP plugin; mixed precision is then its policy),
        then ``torch.compile`` it when the dynamo plugin says so (the whole wrapped model, or
        each repeated block with ``use_regional_compilation``).

        A model prepared before (or the module inside one) is returned as prepared then.
        """
        for prepared in self._models:
            if model is prepared or model is getattr(prepared, "module", None):
                return prepared
        if getattr(model, "_is_accelerate_prepared", False):  # by another Accelerator: never wrapped twice
            self._models.append(model)
            return model
        place = device_placement if device_placement is not None else self.device_placement
        model = self.strategy.setup_model(model, place, evaluation_mode, [opt.optimizer for opt in self._optimizers])
        model = self.strategy.compile_model(model, self.state.dynamo_plugin)
        self._models.append(model)
        return mark_prepared(model)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` (see ``optim.AcceleratedOptimizer``)."""
        wrapped = self.strategy.setup_optimizer(optimizer, self.scaler)
        self._optimizers.append(wrapped)
        if self._snapshots is not None:
            self._snapshots.watch_optimizer(wrapped)
        return mark_prepared(wrapped)

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap ``scheduler`` (see ``optim.AcceleratedScheduler``)."""
        mine = [opt for opt in self._optimizers if opt.optimizer is getattr(scheduler, "optimizer", None)]
        wrapped = AcceleratedScheduler(
            scheduler, mine or self._optimizers, self.gradient_state, self.num_processes,
            split_batches=self.split_batches, step_with_optimizer=self.step_scheduler_with_optimizer,
        )
        self._schedulers.append(wrapped)
        if self._snapshots is not None:
            self._snapshots.watch_scheduler(wrapped)
        return mark_prepared(wrapped)

    def prepare_data_loader(self, loader: DataLoader, device_placement: bool | None = None) -> DataLoaderShard:
        """Shard ``loader`` across processes (see ``data``)."""
        place = device_placement if device_placement is not None else self.device_placement
        shard = shard_data_loader(
            loader, num_processes=self.num_processes, process_index=self.process_index,
            device=self.device if place else None, gradient_state=self.gradient_state,
            loader_index=len(self._dataloaders), collective_device=self.device, **self.dataloader_config.shard_kwargs())
        self._dataloaders.append(shard)
        return mark_prepared(shard)

    def skip_first_batches(self, dataloader: DataLoaderShard, num_batches: int | None = None) -> DataLoaderShard:
        """A loader that skips the first ``num_batches`` (default: where ``load_state`` left off)."""
        return skip_first_batches(dataloader, num_batches)
