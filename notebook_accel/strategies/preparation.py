"""What ``Accelerator.prepare`` does with one call's objects: each kind to its ``prepare_*`` method,
schedulers last (they find their prepared optimizers), and for a ``joint_setup`` strategy
(DeepSpeed's engine) the trainable model and its optimizer set up together."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from notebook_accel.data.prepare import DataLoaderShard
from notebook_accel.runtime.optim import AcceleratedOptimizer

SCHEDULER_TYPES: tuple[type, ...] = (torch.optim.lr_scheduler.LRScheduler,)
if hasattr(torch.optim.lr_scheduler, "ReduceLROnPlateau"):
    SCHEDULER_TYPES += (torch.optim.lr_scheduler.ReduceLROnPlateau,)


def mark_prepared(obj: Any) -> Any:
    """Set the peer's ``_is_accelerate_prepared`` marker (transformers reads it); returns ``obj``."""
    obj._is_accelerate_prepared = True
    return obj


def prepare_objects(accelerator: Any, objects: list[Any], placement: list[bool]) -> list[Any]:
    """``objects`` prepared by ``accelerator`` (``placement``: move each to the device), in order."""
    out = list(objects)
    if accelerator.strategy.joint_setup:
        _prepare_jointly(accelerator, out, placement)
    for i, obj in enumerate(objects):
        if not isinstance(obj, SCHEDULER_TYPES):
            out[i] = _prepare_one(accelerator, out[i], placement[i])
    for i, obj in enumerate(objects):
        if isinstance(obj, SCHEDULER_TYPES):
            out[i] = accelerator.prepare_scheduler(obj)
    return out


def _prepare_jointly(accelerator: Any, out: list[Any], placement: list[bool]) -> None:
    """Set the call's trainable model up together with its optimizer, in ``out``, in place: loaders
    first (the strategy reads their batch), models without an optimizer (frozen, evaluation) placed,
    not wrapped."""
    strategy = accelerator.strategy
    for i, obj in enumerate(out):
        if isinstance(obj, DataLoader) and not isinstance(obj, DataLoaderShard):
            out[i] = accelerator.prepare_data_loader(obj, device_placement=placement[i])
    modules = [i for i, obj in enumerate(out) if isinstance(obj, torch.nn.Module) and not strategy.owns(obj)]
    models = [i for i in modules if any(p.requires_grad for p in out[i].parameters())]
    optimizers = [i for i, obj in enumerate(out)
                  if isinstance(obj, torch.optim.Optimizer) and not isinstance(obj, AcceleratedOptimizer)]
    for i in modules:  # frozen models (a teacher...), or all of them when there is no optimizer
        if not optimizers or i not in models:
            out[i] = accelerator.prepare_model(out[i], device_placement=placement[i], evaluation_mode=True)
    if not optimizers:
        return
    model, wrapped = strategy.setup_model_and_optimizer(
        [out[i] for i in models], [out[i] for i in optimizers], accelerator._dataloaders)
    accelerator._models.append(model)
    accelerator._optimizers.append(wrapped)
    model = strategy.compile_model(model, accelerator.state.dynamo_plugin)
    out[models[0]], out[optimizers[0]] = mark_prepared(model), mark_prepared(wrapped)


def _prepare_one(accelerator: Any, obj: Any, placement: bool) -> Any:
    if isinstance(obj, torch.nn.Module):
        return accelerator.prepare_model(obj, device_placement=placement)
    if isinstance(obj, torch.optim.Optimizer) and not isinstance(obj, AcceleratedOptimizer):
        return accelerator.prepare_optimizer(obj)
    if isinstance(obj, DataLoader) and not isinstance(obj, DataLoaderShard):
        return accelerator.prepare_data_loader(obj, device_placement=placement)
    return obj
