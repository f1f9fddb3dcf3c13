"""An ``Accelerator``'s ``save_state`` / ``load_state``: its pre-hooks, its counters, automatic naming.

What is saved comes from the Accelerator's prepared objects; model and optimizer states go
through its strategy's checkpointer, RNG states through the device kind, and the rest is
written by ``training_state``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.hooks import RemovableHandle

from notebook_accel.checkpoint import training_state
from notebook_accel.checkpoint.training_state import CheckpointItems


class StateHooks:
    """The pre-hooks of ``save_state`` and ``load_state`` (``Accelerator.register_*_state_pre_hook``)."""

    def __init__(self) -> None:
        # OrderedDict: RemovableHandle keeps a weak reference to it
        self.save: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self.load: OrderedDict[int, Callable[..., None]] = OrderedDict()

    @staticmethod
    def add(hooks: OrderedDict[int, Callable[..., None]], hook: Callable[..., None]) -> RemovableHandle:
        """Register ``hook`` in ``hooks``; the handle's ``remove()`` unregisters it."""
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle


def checkpointable(objects: tuple[Any, ...]) -> tuple[Any, ...]:
    """``objects``, each with ``state_dict`` / ``load_state_dict`` (``register_for_checkpointing``).

    Raises:
        ValueError: listing every object ("Item at index i", with its type) that lacks them.
    """
    bad = [f"Item at index {i} ({type(obj).__name__})" for i, obj in enumerate(objects)
           if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)))]
    if bad:
        raise ValueError(
            f"these objects have no state_dict/load_state_dict and cannot be checkpointed: {', '.join(bad)}"
        )
    return objects


def checkpoint_items(accelerator: Any, models: list[Any] | None = None) -> CheckpointItems:
    """What ``accelerator``'s checkpoints hold (``models``: those the pre-hooks left, else all), with
    its strategy's checkpointer for the models and optimizers."""
    models = accelerator._models if models is None else models
    return CheckpointItems(
        accelerator._schedulers, accelerator._dataloaders,
        accelerator._custom_objects, accelerator.scaler, _Counters(accelerator),
        checkpointer=accelerator.strategy.checkpointer(models, accelerator._optimizers),
    )


def run_save_hooks(accelerator: Any, target: Path) -> CheckpointItems:
    """Call the save hooks (they may write into ``target``, change the weights or drop models);
    returns the checkpoint's items with what they left."""
    models, model_states = list(accelerator._models), None
    if accelerator._state_hooks.save:
        target.mkdir(parents=True, exist_ok=True)  # hooks write into it (their files are kept)
        model_states = [accelerator.unwrap_model(m, keep_torch_compile=False).state_dict() for m in models]
        for hook in list(accelerator._state_hooks.save.values()):
            hook(models, model_states, target)
    items = checkpoint_items(accelerator, models)
    items.model_states = model_states
    return items


def save_accelerator_state(accelerator: Any, output_dir: str | os.PathLike[str] | None,
                           safe_serialization: bool) -> Path:
    """``Accelerator.save_state``: the save hooks, the checkpoint, then automatic naming's count and limit."""
    config = accelerator.project_configuration
    automatic = output_dir is None and config.automatic_checkpoint_naming
    target = config.resolve(output_dir, saving=True)
    items = run_save_hooks(accelerator, Path(target))
    path = training_state.save_state(target, items, accelerator.state, safe_serialization, step=accelerator.step)
    if automatic:
        config.iteration += 1
        if accelerator.is_main_process:
            config.prune()
        accelerator.wait_for_everyone()
    return path


def load_accelerator_state(accelerator: Any, input_dir: str | os.PathLike[str] | None, weights_only: bool,
                           strict: bool, own_shards: dict[str, Any] | None = None) -> Path:
    """``Accelerator.load_state``: the load hooks, the checkpoint, then automatic naming's next number
    (``own_shards``: ``training_state.load_state``'s)."""
    path = accelerator.project_configuration.resolve(input_dir, saving=False)
    models = list(accelerator._models)
    for hook in list(accelerator._state_hooks.load.values()):
        hook(models, path)
    items = checkpoint_items(accelerator, models)
    path = training_state.load_state(path, items, accelerator.state, weights_only, strict, own_shards)
    suffix = path.name.removeprefix("checkpoint_")
    if accelerator.project_configuration.automatic_checkpoint_naming and suffix.isdigit():
        accelerator.project_configuration.iteration = int(suffix) + 1
    accelerator.wait_for_everyone()
    return path


class _Counters:
    """The Accelerator's own counters (``step``, accumulation), as a checkpointable object."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.accelerator.step, "gradient_state": self.accelerator.gradient_state.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """``step``, and the accumulation counters where the checkpoint has them (the peer's has not)."""
        self.accelerator.step = int(state["step"])
        if "gradient_state" in state:
            self.accelerator.gradient_state.load_state_dict(state["gradient_state"])
