"""``load_checkpoint_and_dispatch``: plan, load and dispatch in one call."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from notebook_accel.big_model.devices import DeviceKey
from notebook_accel.big_model.dispatch import dispatch_model
from notebook_accel.big_model.loading import load_checkpoint_in_model
from notebook_accel.big_model.planner import resolve_device_map


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: str | Mapping[str, DeviceKey | torch.device] | None = None,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    offload_folder: str | os.PathLike | None = None,
    offload_buffers: bool = False,
    dtype: torch.dtype | str | None = None,
    skip_keys: Iterable[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    preload_module_classes: Iterable[str] | None = None,
) -> nn.Module:
    """Load ``checkpoint`` into ``model`` (built under ``init_empty_weights``) and dispatch it.

    Args:
        device_map: ``"auto"`` / ``"balanced"`` / ``"balanced_low_0"`` / ``"sequential"``, a device,
            or ``{module name: device}``; ``None`` only loads (everything on the CPU, no hooks).
        max_memory: budgets for the planner, e.g. ``{0: "20GiB", "cpu": "1GiB"}``.
        no_split_module_classes: class names never split across devices.
        offload_folder: where disk-placed weights of ``.bin`` checkpoints are written (safetensors
            checkpoints are streamed from their own files and need none).
        offload_buffers: offload buffers with their module.
        dtype: cast floating-point weights to this dtype.
        skip_keys: dict output keys left on their device.
        force_hooks: hook even a model that sits on one device.
        strict: missing or unexpected checkpoint names are an error.
        preload_module_classes: see ``dispatch_model``.

    Returns:
        ``model``, with ``model.hf_device_map`` set.

    Example::

        with init_empty_weights():
            model = MyModel()
        model = load_checkpoint_and_dispatch(model, "ckpt/", device_map="auto",
                                             no_split_module_classes=["Block"])
    """
    plan = None
    if device_map is not None:
        plan = resolve_device_map(model, device_map, max_memory, no_split_module_classes, dtype,
                                  offload_buffers=offload_buffers)
    load_checkpoint_in_model(model, checkpoint, plan, offload_folder=offload_folder, dtype=dtype,
                             offload_buffers=offload_buffers, strict=strict)
    if plan is None:
        return model
    return dispatch_model(model, plan, offload_buffers=offload_buffers, skip_keys=skip_keys,
                          force_hooks=force_hooks, preload_module_classes=preload_module_classes)
