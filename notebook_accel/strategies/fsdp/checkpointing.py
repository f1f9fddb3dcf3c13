"""Models and optimizers of an FSDP job in ``save_state`` / ``load_state``.

``SHARDED_STATE_DICT`` (default): each model goes to ``pytorch_model_fsdp_<i>/`` and
each optimizer to ``optimizer_<i>/`` through ``torch.distributed.checkpoint``, one
file per rank holding only that rank's shards (the peer's layout). No rank ever
holds more than its shards, and a different world size can load the folder.
``FULL_STATE_DICT``: the weights and optimizer state are gathered to rank 0, which
writes them under the peer's names, ``pytorch_model_fsdp.bin`` / ``optimizer.bin``
(``_1``... for later ones; our earlier ``model.pt`` / ``optimizer.pt`` are still read);
loading broadcasts them from rank 0. Everything else in the checkpoint (schedulers, loaders, RNGs) is
written by ``notebook_accel.checkpoint.training_state`` as usual.

The sharded layout does not depend on the world size: an Accelerator with an FSDP plugin
writes it even on one process (nothing to shard, one file), and a job of any size
(one process included) loads a checkpoint written by any other, each process reading
the pieces it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from notebook_accel.checkpoint.state_parts import (
    Part,
    ShardedState,
    fill_own_shards,
    quiet_alone,
    write_parts,
)
from notebook_accel.checkpoint.training_state import CheckpointFiles, StateFile
from notebook_accel.strategies.fsdp.state_dict import (
    MODEL_DIR,
    MODEL_KEY,
    OPTIMIZER_DIR,
    OPTIMIZER_KEY,
    full_state_dict,
)


def _file(prefix: str, index: int) -> str:
    """The peer's name of a full state dict: ``pytorch_model_fsdp.bin``, ``optimizer_1.bin``..."""
    stem = MODEL_DIR if prefix == "model" else prefix
    return f"{stem}.bin" if index == 0 else f"{stem}_{index}.bin"


def _earlier_file(name: str) -> str:
    """The name our earlier layout gave that file (``model.pt``, ``optimizer_1.pt``...)."""
    stem = name.removesuffix(".bin")
    if stem.startswith(MODEL_DIR):
        stem = "model" + stem.removeprefix(MODEL_DIR)
    return stem + ".pt"


class FsdpCheckpointer:
    """Writes and reads the models and optimizers of one Accelerator (all ranks call both).

    Args:
        models: the prepared models (sharded or not).
        optimizers: the prepared optimizers (``AcceleratedOptimizer``).
        state_dict_type: ``"SHARDED_STATE_DICT"`` or ``"FULL_STATE_DICT"``.
    """

    def __init__(self, models: list[torch.nn.Module], optimizers: list[Any], state_dict_type: str) -> None:
        self.models = models
        self.optimizers = optimizers
        self.sharded = state_dict_type == "SHARDED_STATE_DICT"
        self.reshards = True  # either layout loads on any world size (see the module docstring)

    def _owner(self, optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
        mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for model in self.models:
            if any(id(p) in mine for p in model.parameters()):
                return model
        return None

    def save(self, files: CheckpointFiles) -> None:
        """Write every model and optimizer into ``files.directory`` (which exists on every rank);
        whole files on rank 0 only."""
        write_parts(files.directory, self.snapshot_parts(None, files.is_main))

    def snapshot_parts(self, model_states: list[dict[str, Any]] | None, owner: bool,
                       staging: Any = None) -> list[Part]:
        """Every model's and optimizer's part, from the live state (every rank calls it: gathering a
        full state dict is a collective): a folder of each rank's shards (sharded), or a whole file
        that ``owner`` writes. Save hooks' ``model_states`` are not used (the shards are the models'), nor
        ``staging`` (nothing is written here)."""
        del model_states, staging
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        parts: list[Part] = []
        for i, model in enumerate(self.models):
            if self.sharded:
                parts.append(ShardedState(f"{MODEL_DIR}_{i}", {MODEL_KEY: get_model_state_dict(model)}))
            else:
                state = full_state_dict(model, rank0_only=True) if isinstance(model, FSDPModule) else model.state_dict()
                if owner:
                    parts.append(StateFile(_file("model", i), state))
        for i, opt in enumerate(self.optimizers):
            owning = self._owner(opt.optimizer)
            if owning is None:
                if owner:
                    parts.append(StateFile(_file("optimizer", i), opt.state_dict()))
            elif self.sharded:
                parts.append(ShardedState(f"{OPTIMIZER_DIR}_{i}",
                                          {OPTIMIZER_KEY: get_optimizer_state_dict(owning, opt.optimizer)}))
            else:
                state = get_optimizer_state_dict(owning, opt.optimizer, options=full)
                if owner:
                    parts.append(StateFile(_file("optimizer", i), state))
        return parts

    def load(self, files: CheckpointFiles) -> None:
        """Restore every model and optimizer from ``files.directory``.

        Raises:
            FileNotFoundError: a model or optimizer has no entry (saved with other objects,
                or with the other ``state_dict_type``).
            ValueError: ``strict=False`` (sharded models are restored whole).
        """
        files.refuse_partial(self)
        directory, is_main, read = files.directory, files.is_main, files.read
        for i, model in enumerate(self.models):
            if self.sharded:
                state = self._sharded(files, f"{MODEL_DIR}_{i}", {MODEL_KEY: get_model_state_dict(model)})
                set_model_state_dict(model, state[MODEL_KEY])
            elif isinstance(model, FSDPModule):
                state = self._read(directory, _file("model", i), read) if is_main else {}
                set_model_state_dict(model, state, options=_broadcast())
            else:
                model.load_state_dict(self._read(directory, _file("model", i), read))
        for i, opt in enumerate(self.optimizers):
            owner = self._owner(opt.optimizer)
            if owner is None:
                opt.load_state_dict(self._read(directory, _file("optimizer", i), read))
            elif self.sharded:
                state = self._sharded(files, f"{OPTIMIZER_DIR}_{i}",
                                      {OPTIMIZER_KEY: get_optimizer_state_dict(owner, opt.optimizer)})
                set_optimizer_state_dict(owner, opt.optimizer, state[OPTIMIZER_KEY])
            elif isinstance(owner, FSDPModule):
                state = self._read(directory, _file("optimizer", i), read) if is_main else {}
                set_optimizer_state_dict(owner, opt.optimizer, state, options=_broadcast())
            else:
                state = self._read(directory, _file("optimizer", i), read)
                set_optimizer_state_dict(owner, opt.optimizer, state, options=StateDictOptions(full_state_dict=True))

    def _sharded(self, files: CheckpointFiles, name: str, live: dict[str, Any]) -> dict[str, Any]:
        """The sharded part ``name`` laid out as ``live``: this rank's own shards where ``files`` holds
        them (``own_shards``), else read from its folder by ``torch.distributed.checkpoint``."""
        if files.own_shards is not None:
            if name not in files.own_shards:
                raise FileNotFoundError(f"the snapshot held in memory has no sharded {name}; was it taken with "
                                        "the same prepared objects?")
            return fill_own_shards(live, files.own_shards[name])
        with quiet_alone():
            dcp.load(live, checkpoint_id=self._folder(files.directory, name))
        return live

    @staticmethod
    def _folder(directory: Path, name: str) -> Path:
        if not (directory / name / ".metadata").is_file():
            raise FileNotFoundError(f"checkpoint {directory} has no sharded {name}/; was it saved with the same "
                                    "prepared objects and state_dict_type SHARDED_STATE_DICT?")
        return directory / name

    @staticmethod
    def _read(directory: Path, name: str, read: Callable[[Path], Any]) -> Any:
        for candidate in (name, _earlier_file(name)):
            if (directory / candidate).is_file():
                return read(directory / candidate)
        raise FileNotFoundError(f"checkpoint {directory} has no {name}; was it saved with the same "
                                "prepared objects and this state_dict_type?")


def _broadcast() -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
