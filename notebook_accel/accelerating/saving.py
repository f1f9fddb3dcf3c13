"""The ``Accelerator``'s weights and training state on disk: ``save``, ``save_model``,
``save_state`` / ``load_state`` and their hooks (the mechanics: ``checkpoint.orchestration``,
``checkpoint.weight_files``, ``checkpoint.weight_shards``; the model's weights: the strategy's)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from notebook_accel.checkpoint import orchestration
from notebook_accel.checkpoint.weight_files import save_weights
from notebook_accel.checkpoint.weight_shards import save_object


class Saving:
    """Models' weights and ``save_state`` / ``load_state``, on ``self.strategy`` and the
    registered objects (``self._custom_objects``) and hooks (``self._state_hooks``)."""

    strategy: Any
    project_configuration: Any
    is_main_process: bool
    is_local_main_process: bool
    _custom_objects: list[Any]
    _state_hooks: orchestration.StateHooks
    _auto_resume: Any

    def unwrap_model(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool = True) -> torch.nn.Module:
        """The user's module inside DDP; optionally without the autocast forward. A compiled model stays
        compiled with ``keep_torch_compile`` (as the peer), else comes back plain (no ``_orig_mod.``
        keys); an FSDP-sharded one comes back as a full, plain copy (every process must call it)."""
        return self.strategy.unwrap(model, keep_fp32_wrapper, keep_torch_compile)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's state dict (of the unwrapped model by default), on the CPU-visible device.

        Under FSDP: the full weights, gathered on the main process's CPU (``{}`` on the others);
        every process must call it. A dispatched model's offloaded weights are read in (to the CPU).
        """
        return self.strategy.model_state_dict(model, unwrap)

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save ``obj`` on the main process (``torch.save``, or safetensors for a tensor dict: tensors
        sharing memory stored once); on each machine's with ``ProjectConfiguration(save_on_each_node=True)``.

        Tensors go to the CPU first where the device needs it (XLA), so the file loads without its runtime.
        """
        obj = self.strategy.to_cpu(obj)
        on_each_node = self.project_configuration.save_on_each_node
        if self.is_local_main_process if on_each_node else self.is_main_process:
            save_object(obj, Path(f), safe_serialization)

    def save_model(self, model: torch.nn.Module, save_directory: str | os.PathLike[str],
                   max_shard_size: int | str = "10GB", safe_serialization: bool = True) -> Path | None:
        """Save the unwrapped model's weights on the main process; returns the file (else ``None``).

        ``model.safetensors`` (tied weights stored once) or, with ``safe_serialization=False``,
        ``pytorch_model.bin``; written to a temporary name, then renamed. Above
        ``max_shard_size`` (bytes, or ``"10GB"``, ``"500MB"``...) the weights are split into
        ``model-00001-of-0000N.safetensors``... and the returned index file maps each weight to its shard.
        """
        state = self.strategy.to_cpu(self.get_state_dict(model))
        if not self.is_main_process:
            return None
        return save_weights(state, Path(save_directory), safe_serialization, max_shard_size)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Add objects with ``state_dict`` / ``load_state_dict`` to ``save_state`` (``ValueError`` naming
        every object that lacks them)."""
        self._custom_objects.extend(orchestration.checkpointable(objects))
        if self._auto_resume is not None:
            self._auto_resume.after_prepare(self)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` at the start of every ``save_state``.

        ``weights`` holds the models' state dicts; a hook may change it or remove entries
        (with the matching ``models`` entries) to save something else or nothing.
        Returns a handle whose ``remove()`` unregisters the hook.
        """
        return self._state_hooks.add(self._state_hooks.save, hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` at the start of every ``load_state``.

        A hook may remove entries from ``models`` to load them itself. Returns a removable handle.
        """
        return self._state_hooks.add(self._state_hooks.load, hook)

    def save_state(self, output_dir: str | os.PathLike[str] | None = None,
                   safe_serialization: bool = True) -> Path:
        """Atomically checkpoint models, optimizers, schedulers, loaders, scaler and RNGs (all processes call it).

        Without ``output_dir``: the next automatic checkpoint when ``automatic_checkpoint_naming``
        is on (older ones beyond ``total_limit`` are removed), else ``<project_dir>/checkpoint``.
        The peer's layout (``checkpoint.layout``): the peer loads it, and ``load_state`` loads the
        peer's. ``safe_serialization`` (the default, as the peer's) stores the models as safetensors
        (``model.safetensors``...), else ``pytorch_model.bin``...; ``load_state`` reads either.
        """
        return orchestration.save_accelerator_state(self, output_dir, safe_serialization)

    def load_state(self, input_dir: str | os.PathLike[str] | None = None, weights_only: bool = True,
                   *, strict: bool = True) -> Path:
        """Restore what ``save_state`` wrote (default: the latest automatic checkpoint, or ``<project_dir>/checkpoint``).

        ``weights_only=False`` can run code from the files: use it on trusted checkpoints only.
        ``strict=False`` (the peer's ``load_model_func_kwargs``) accepts model weights missing from or
        extra to the checkpoint, e.g. one a save hook cut down to a LoRA adapter; unsharded models only.
        """
        return orchestration.load_accelerator_state(self, input_dir, weights_only, strict)
