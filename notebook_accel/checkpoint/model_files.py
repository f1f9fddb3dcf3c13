"""The plain checkpointer: unsharded models and optimizers, one file each in the peer's names
(``model.safetensors`` or ``pytorch_model.bin``, ``optimizer.bin``...), written by the directory's owner.

Every strategy that does not shard its models checkpoints through it (``Strategy.checkpointer``);
a sharding strategy brings its own, with the same two methods (``strategies/fsdp``, ``strategies/deepspeed``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from notebook_accel.checkpoint import layout
from notebook_accel.checkpoint.training_state import CheckpointFiles, StateFile, write_files
from notebook_accel.checkpoint.weight_files import load_safetensors
from notebook_accel.runtime.helpers import extract_model_from_parallel


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state dict is saved and loaded: no DDP, no ``torch.compile`` (no ``_orig_mod.`` keys)."""
    return extract_model_from_parallel(model, keep_torch_compile=False)


class PlainCheckpointer:
    """Writes and reads unsharded models and optimizers (every process calls both).

    Args:
        models: the prepared models.
        optimizers: the prepared optimizers.
        to_cpu: the strategy's copy to the CPU (a collective on XLA: every process takes part).
        live: ``to_cpu`` leaves the tensors as they are, so ``snapshot_parts`` holds the live tensors,
            made without a copy or a collective (``live_parts``: a snapshot schedule may then make
            its first copy's memory ahead).
    """

    def __init__(self, models: list[torch.nn.Module], optimizers: list[Any], to_cpu: Callable[[Any], Any],
                 live: bool = False) -> None:
        self.models = models
        self.optimizers = optimizers
        self.to_cpu = to_cpu
        self.live_parts = live

    def save(self, files: CheckpointFiles) -> None:
        """The models' states (``files.model_states`` when save hooks left them) and the optimizers'."""
        write_files(files.directory, self.state_files(files.model_states, files.safe_serialization, files.owner))

    def state_files(self, model_states: list[dict[str, Any]] | None, safe_serialization: bool,
                    owner: bool) -> list[StateFile]:
        """The models' and optimizers' files with their states on the CPU (none where not ``owner``; every
        process calls it: the copy to the CPU is a collective on XLA). ``model_states``: what save hooks left."""
        model_states = self.to_cpu(model_states if model_states is not None
                                   else [_unwrap(m).state_dict() for m in self.models])
        optimizer_states = self.to_cpu([o.state_dict() for o in self.optimizers])
        if not owner:
            return []
        return ([StateFile(layout.model_file(i, safe_serialization), weights, safetensors=safe_serialization)
                 for i, weights in enumerate(model_states)]
                + [StateFile(layout.object_file("optimizer", i), optimizer_state)
                   for i, optimizer_state in enumerate(optimizer_states)])

    reshards = False  # a snapshot of another world size is refused (snapshot_identity)

    def snapshot_parts(self, model_states: list[dict[str, Any]] | None, owner: bool,
                       staging: Any = None) -> list[StateFile]:
        """A snapshot's model and optimizer files (``state_files`` as safetensors; ``staging`` unused)."""
        del staging
        return self.state_files(model_states, True, owner)

    def load(self, files: CheckpointFiles) -> None:
        """The models (safetensors or ``.bin``, ``files.strict`` or not) and the optimizers."""
        for i, model in enumerate(self.models):
            safe = files.directory / layout.model_file(i, True)
            if safe.is_file():  # tied weights were stored once, under one name
                load_safetensors(_unwrap(model), str(safe), files.strict)
            else:
                _unwrap(model).load_state_dict(files.read_named(layout.model_file(i, False)), strict=files.strict)
        for i, optimizer in enumerate(self.optimizers):
            optimizer.load_state_dict(files.read_named(layout.object_file("optimizer", i)))
