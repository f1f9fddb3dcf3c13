"""The engine's model and optimizer in ``save_state`` / ``load_state``, through DeepSpeed's checkpoints.

The engine writes ``pytorch_model/`` in the checkpoint (the peer's layout): the module's
weights (``mp_rank_00_model_states.pt``) and, per rank, that rank's ZeRO partition of the
fp32 master weights and optimizer state (``*zero_pp_rank_<r>_*optim_states.pt``), so no
rank ever holds more than its share and a resumed run continues bit for bit. Models and
optimizers outside the engine are written as in any job; everything else in the checkpoint
(schedulers, loaders, RNGs) is written by ``notebook_accel.checkpoint.training_state`` as usual.
DeepSpeed's ``zero_to_fp32.py`` (written into the folder) merges the partitions offline.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from notebook_accel.checkpoint.state_parts import Part, StagedFolder, write_parts
from notebook_accel.checkpoint.training_state import CheckpointFiles, StateFile

ENGINE_TAG = "pytorch_model"


def _file(prefix: str, index: int) -> str:
    return f"{prefix}.pt" if index == 0 else f"{prefix}_{index}.pt"


class DeepSpeedCheckpointer:
    """Writes and reads the models and optimizers of one Accelerator (all ranks call both).

    Args:
        runtime: the Accelerator's DeepSpeed strategy (``strategies.deepspeed.DeepSpeedStrategy``).
        models: the prepared models (the engine and any others).
        optimizers: the prepared optimizers (the engine's wrapper and any others).
    """

    def __init__(self, runtime: Any, models: list[torch.nn.Module], optimizers: list[Any]) -> None:
        self.runtime = runtime
        self.models = models
        self.optimizers = optimizers

    def _others(self) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]]]:
        models = [(i, m) for i, m in enumerate(self.models) if not self.runtime.owns(m)]
        optimizers = [(i, o) for i, o in enumerate(self.optimizers) if o is not self.runtime.optimizer]
        return models, optimizers

    reshards = False  # ZeRO partitions load on the world size that wrote them
    in_memory = False  # the engine writes its state into files: not kept in the peers' memory

    def save(self, files: CheckpointFiles) -> None:
        """Write every model and optimizer into ``files.directory`` (which exists on every rank);
        whole files on rank 0 only."""
        write_parts(files.directory, self.snapshot_parts(None, files.is_main, lambda _: files.directory))

    def snapshot_parts(self, model_states: list[dict[str, Any]] | None, owner: bool,
                       staging: Callable[[int], Path]) -> list[Part]:
        """Every model's and optimizer's part (every rank calls it): the engine writes its checkpoint
        at once (DeepSpeed's own writer, collectives inside) into ``staging(bytes_needed)``, a folder
        every rank shares, which ``owner`` moves into the checkpoint; other models and optimizers are
        files ``owner`` writes. Save hooks' ``model_states`` are not used (the engine writes its own)."""
        del model_states
        parts: list[Part] = []
        engine = self.runtime.engine
        if engine is not None:
            params = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
            folder = staging(16 * params)  # fp32 weights, master copy and two moments, about
            # save_latest: the 'latest' file lets DeepSpeed's zero_to_fp32.py find the tag by itself
            engine.save_checkpoint(str(folder), tag=ENGINE_TAG, save_latest=True)
            if owner:
                parts.append(StagedFolder(folder))
        models, optimizers = self._others()
        if owner:
            parts += [StateFile(_file("model", i), model.state_dict()) for i, model in models]
            parts += [StateFile(_file("optimizer", i), opt.state_dict()) for i, opt in optimizers]
        return parts

    def load(self, files: CheckpointFiles) -> None:
        """Restore every model and optimizer from ``files.directory``.

        Raises:
            FileNotFoundError: the checkpoint has no DeepSpeed engine folder (written by a job
                without DeepSpeed) or lacks a model or optimizer file.
            ValueError: ``strict=False`` (the engine restores its model whole).
        """
        files.refuse_partial(self)
        directory, read = files.directory, files.read
        if self.runtime.engine is not None:
            if not (directory / ENGINE_TAG).is_dir():
                raise FileNotFoundError(f"{directory} has no {ENGINE_TAG}/ folder: it was not written by a "
                                        "DeepSpeed job (load it with the strategy that wrote it)")
            path, _ = self.runtime.engine.load_checkpoint(str(directory), tag=ENGINE_TAG,
                                                          load_optimizer_states=True,
                                                          load_lr_scheduler_states=False)
            if path is None:
                raise FileNotFoundError(f"DeepSpeed found no checkpoint in {directory / ENGINE_TAG}")
        models, optimizers = self._others()
        for prefix, objs in (("model", models), ("optimizer", optimizers)):
            for i, obj in objs:
                file = directory / _file(prefix, i)
                if not file.is_file():
                    raise FileNotFoundError(f"{file} is missing: the checkpoint was saved with other objects")
                obj.load_state_dict(read(file))
