"""Saving and restoring the whole training state, atomically.

A checkpoint is a directory, in the peer's layout (``layout``: each library loads the other's)::

    model.safetensors, model_1.safetensors, ...  state dicts of the unwrapped models (main process;
                                       pytorch_model.bin, ... with safe_serialization=False)
    pytorch_model_fsdp_0/, optimizer_0/  instead, under FSDP: one shard file per rank (see fsdp.checkpointing)
    optimizer.bin, scheduler.bin, ...  likewise, one per prepared object (optimizer_1.bin...)
    dataloader.pt, ...                 shuffling generator and position in the epoch (ours), or
    dl_state_dict.bin, ...             torchdata's state of a stateful loader (the peer's; loader_states)
    scaler.pt                          the fp16 GradScaler, when there is one
    custom_checkpoint_0.pkl, ...       objects given to ``register_for_checkpointing``
    accelerator.pt                     accumulation counters and the tracker step (ours)
    random_states_<rank>.pkl           python, numpy, torch, CUDA/XLA RNGs of each process, and the step

Atomically (``atomic_dir``): a crash while saving leaves the previous checkpoint loadable.
Model and optimizer states go through the strategy's checkpointer (``model_files.PlainCheckpointer``,
or a sharding strategy's own), RNG states through the device kind (``random_states``).

Security: files are read with ``torch.load(weights_only=True)``, which refuses
arbitrary pickled objects; a state that needs them can be loaded with
``weights_only=False``. Loading an untrusted checkpoint that way is as dangerous as
``torch.load`` on it: it can run arbitrary code.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from notebook_accel.checkpoint import layout, loader_states, random_states
from notebook_accel.checkpoint.atomic_dir import AtomicDir, resolve_checkpoint
from notebook_accel.checkpoint.paced_writes import save_paced
from notebook_accel.checkpoint.weight_files import save_weights_file
from notebook_accel.runtime.state import PartialState


@dataclass
class CheckpointItems:
    """What ``save_state`` / ``load_state`` handle, in the order they were prepared."""

    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)
    scaler: Any = None
    accelerator: Any = None  # an object with state_dict / load_state_dict
    model_states: list[dict[str, Any]] | None = None  # what save-state hooks left to write (else: the models')
    checkpointer: Any = None  # the strategy's: writes/reads models and optimizers (``save``/``load``), on every rank


@dataclass
class CheckpointFiles:
    """One checkpoint directory as a checkpointer sees it (its ``save(files)`` and ``load(files)``).

    Attributes:
        directory: the directory (saving: the atomic directory's ``tmp``; it exists on every process).
        is_main: this is the main process.
        owner: saving: this process writes the shared files in this directory (one per file system).
        weights_only: loading: ``torch.load``'s safe mode.
        safe_serialization: saving: models as safetensors.
        strict: loading: model weights must match exactly.
        model_states: saving: what save-state hooks left to write (else the models').
    """

    directory: Path
    is_main: bool
    owner: bool = False
    weights_only: bool = True
    safe_serialization: bool = True
    strict: bool = True
    model_states: list[dict[str, Any]] | None = None
    own_shards: dict[str, Any] | None = None  # loading: this rank's shards by sharded part name, read
    # instead of the parts' folders (a snapshot brought back from the peers' memory: ``snapshot_peers``)

    def write(self, obj: Any, path: Path) -> None:
        """``torch.save`` ``obj`` to ``path``, fsync'd."""
        _write(obj, path)

    def read(self, path: Path) -> Any:
        """One file, on the CPU."""
        return _read(path, self.weights_only)

    def read_named(self, name: str) -> Any:
        """The file of that name (or the peer's name for it, ``layout.find``).

        Raises:
            FileNotFoundError: the checkpoint has none.
        """
        file = layout.find(self.directory, name)
        if file is None:
            raise FileNotFoundError(
                f"checkpoint {self.directory} has no {name}; was it saved with the same prepared objects?"
            )
        return self.read(file)

    def refuse_partial(self, checkpointer: Any) -> None:
        """Raise ``ValueError`` for ``strict=False``, which a sharding ``checkpointer`` cannot honour."""
        if not self.strict:
            raise ValueError(f"load_state(strict=False) loads unsharded models only; {type(checkpointer).__name__} "
                             "restores sharded models whole: use strict=True (the default)")


@dataclass
class StateFile:
    """One file of a checkpoint with what goes into it: ``name`` (in the checkpoint directory), ``obj``
    (its content) and ``safetensors`` (a model's weights as safetensors, tied weights once; else
    ``torch.save``). A synchronous save writes the live objects; a snapshot writes host copies of them."""

    name: str
    obj: Any
    safetensors: bool = False


def write_files(directory: Path, files: list[StateFile], paced: bool = False) -> None:
    """Write (and fsync) every file of ``files`` into ``directory``; ``paced``: a piece at a time,
    pausing between pieces (``paced_writes``: a snapshot's background write)."""
    for file in files:
        if file.safetensors:
            save_weights_file(file.obj, directory / file.name, paced)
        else:
            _write(file.obj, directory / file.name, paced)


def state_files(items: CheckpointItems, state: PartialState, owner: bool, step: int | None) -> list[StateFile]:
    """The files of ``items`` beside the models' and optimizers' (the checkpointer's): schedulers,
    loaders, registered objects, scaler and counters where this process writes the shared files
    (``owner``), and this process's random states (with ``step``), as ``save_state`` writes them."""
    files = []
    if owner:
        files += [StateFile(layout.object_file("scheduler", i), obj.state_dict())
                  for i, obj in enumerate(items.schedulers)]
        files += [StateFile(name, obj) for name, obj in loader_states.state_files(items.dataloaders)]
        files += [StateFile(layout.custom_file(i), obj.state_dict()) for i, obj in enumerate(items.custom)]
        if items.scaler is not None:
            files.append(StateFile("scaler.pt", items.scaler.state_dict()))
        if items.accelerator is not None:
            files.append(StateFile("accelerator.pt", items.accelerator.state_dict()))
    files.append(StateFile(layout.rng_file(state.process_index), random_states.capture(state.device_kind, step)))
    return files


def _write(obj: Any, path: Path, paced: bool = False) -> None:
    if paced:
        save_paced(obj, path)
        return
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _read(path: Path, weights_only: bool) -> Any:
    return torch.load(path, map_location="cpu", weights_only=weights_only)


def save_state(
    output_dir: str | os.PathLike[str], items: CheckpointItems, state: PartialState, safe_serialization: bool = True,
    step: int | None = None,
) -> Path:
    """Write a checkpoint of ``items`` to ``output_dir`` atomically; returns its path.

    Every process must call it (each writes its own RNG file). Where processes do not
    share the directory (each its own path, or machines without a shared file system),
    one process per file system writes the shared files there too, so every copy is complete.
    ``safe_serialization`` writes the models as ``model.safetensors``, ``model_1.safetensors``...
    (else ``pytorch_model.bin``...); ``step`` goes into the random-states files, as the peer's.
    """
    directory = AtomicDir(output_dir, state)
    tmp = directory.tmp
    items.checkpointer.save(CheckpointFiles(tmp, state.is_main_process, directory.owner,
                                            safe_serialization=safe_serialization, model_states=items.model_states))
    write_files(tmp, state_files(items, state, directory.owner, step))
    return directory.commit()


def load_state(
    input_dir: str | os.PathLike[str], items: CheckpointItems, state: PartialState, weights_only: bool = True,
    strict: bool = True, own_shards: dict[str, Any] | None = None,
) -> Path:
    """Restore ``items`` and this process's RNGs from a ``save_state`` directory.

    ``strict=False`` lets model weights be missing or extra (a checkpoint that holds only a
    LoRA adapter, say); it applies to unsharded models, as in the peer. ``own_shards``: this rank's
    shards by sharded part name, loaded instead of the parts' folders (``CheckpointFiles.own_shards``).

    Raises:
        FileNotFoundError: missing directory or a missing file for a prepared object.
        ValueError: ``strict=False`` with sharded (FSDP / DeepSpeed) models.
    """
    path = resolve_checkpoint(input_dir)
    files = CheckpointFiles(path, state.is_main_process, weights_only=weights_only, strict=strict,
                            own_shards=own_shards)
    read = files.read_named
    items.checkpointer.load(files)
    for i, obj in enumerate(items.schedulers):
        obj.load_state_dict(read(layout.object_file("scheduler", i)))
    loader_states.load(path, items.dataloaders, files.read)
    for i, obj in enumerate(items.custom):
        obj.load_state_dict(read(layout.custom_file(i)))
    if items.scaler is not None:
        items.scaler.load_state_dict(read("scaler.pt"))
    if items.accelerator is not None and (path / "accelerator.pt").is_file():
        items.accelerator.load_state_dict(read("accelerator.pt"))
    rng_file = layout.find(path, layout.rng_file(state.process_index))
    if rng_file is not None:
        states = random_states.read(rng_file, weights_only)
        random_states.restore(states, state.device_kind)
        if items.accelerator is not None and not (path / "accelerator.pt").is_file() and "step" in states:
            items.accelerator.load_state_dict({"step": states["step"]})  # the peer's checkpoint
    else:
        warnings.warn(f"{layout.rng_file(state.process_index)} not found in {path}; random states not restored",
                      stacklevel=2)
    return path
