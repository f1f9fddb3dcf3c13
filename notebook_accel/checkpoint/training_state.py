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

Atomicity: everything is written (and fsync'd) into ``<dir>.tmp``; only then does
the main process move the old ``<dir>`` aside to ``<dir>.old``, rename
``<dir>.tmp`` to ``<dir>`` and delete ``<dir>.old``. A crash while writing leaves
the previous checkpoint untouched; a crash between the two renames leaves a
complete ``<dir>.old``, which ``load_state`` falls back to. Other files in ``<dir>``
(what a save-state pre-hook or the user wrote there) move into the new checkpoint,
as they stay in the peer's, which writes in place; checkpoint files of the old
state that the new one does not write (a model no longer prepared) do not. Processes that do
not share the directory with the main process (a path per rank, machines without
a shared file system) each get a complete copy: one process per file system
claims it (``<dir>.claim-<token>``, created exclusively) and does the same there.

Security: files are read with ``torch.load(weights_only=True)``, which refuses
arbitrary pickled objects; a state that needs them can be loaded with
``weights_only=False``. Loading an untrusted checkpoint that way is as dangerous as
``torch.load`` on it: it can run arbitrary code.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from notebook_accel.checkpoint import layout, loader_states, random_states
from notebook_accel.checkpoint.weight_shards import (
    drop_shared,
    parse_size,
    save_object,
    save_shards,
    split_state,
)
from notebook_accel.runtime.helpers import extract_model_from_parallel
from notebook_accel.runtime.ops import broadcast_object_list
from notebook_accel.runtime.state import PartialState


@dataclass
class CheckpointItems:
    """What ``save_state`` / ``load_state`` handle, in the order they were prepared."""

    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)
    scaler: Any = None
    accelerator: Any = None  # an object with state_dict / load_state_dict
    model_states: list[dict[str, Any]] | None = None  # what save-state hooks left to write (else: the models')
    sharded: Any = None  # writes/reads models and optimizers itself (FSDP: fsdp.checkpointing), on every rank


_CHECKPOINT_FILE = re.compile(  # what save_state itself writes (stale ones are not carried over)
    r"(pytorch_model(_fsdp)?|model|optimizer|scheduler|dataloader|dl_state_dict|custom_checkpoint|random_states)"
    r"(_\d+)?"
    r"\.(pt|bin|pkl|safetensors)"
    r"|scaler\.pt|accelerator\.pt|(pytorch_model_fsdp|optimizer)_\d+")


def _carry_over(final: Path, tmp: Path) -> None:
    """Move the entries of ``final`` that are no checkpoint files of ours and that the new
    checkpoint does not write into ``tmp`` (a pre-hook's ``data.json``, the user's notes)."""
    for entry in final.iterdir():
        if not _CHECKPOINT_FILE.fullmatch(entry.name) and not (tmp / entry.name).exists():
            os.rename(entry, tmp / entry.name)


def _write(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _read(path: Path, weights_only: bool) -> Any:
    return torch.load(path, map_location="cpu", weights_only=weights_only)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state dict is saved and loaded: no DDP, no ``torch.compile`` (no ``_orig_mod.`` keys)."""
    return extract_model_from_parallel(model, keep_torch_compile=False)


def _claim_tmp(final: Path, tmp: Path, state: PartialState) -> Path | None:
    """Make ``tmp`` ready on every process; returns the claim file where this process finalises it.

    Every process tries to create ``<dir>.claim-<token>`` exclusively (``O_EXCL``,
    decided by the file server, never from a stale cache), the main process first.
    On a file system the main process shares, the file exists and the others do
    not claim; a process that succeeds has a file system of its own (each rank its
    own path, or machines without a shared one) and (re)creates ``tmp`` there.
    """
    token = uuid.uuid4().hex if state.is_main_process else None
    if state.use_distributed:
        token = broadcast_object_list([token])[0]
    claim = final.with_name(f"{final.name}.claim-{token}")
    if state.is_main_process:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        _create_exclusive(claim)
    state.wait_for_everyone()
    owner = state.is_main_process
    if not owner:
        final.parent.mkdir(parents=True, exist_ok=True)
        owner = _create_exclusive(claim)
    if owner:
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed earlier attempt
        tmp.mkdir()
    state.wait_for_everyone()
    return claim if owner else None


def _create_exclusive(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


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
    final = Path(output_dir).absolute()
    tmp = final.with_name(final.name + ".tmp")
    old = final.with_name(final.name + ".old")
    claim = _claim_tmp(final, tmp, state)
    owner = claim is not None
    on_xla = state.device.type == "xla"
    if on_xla:  # every process takes part in the copy to the CPU
        from notebook_accel.runtime import xla

        model_states = [xla.to_cpu(s) for s in items.model_states or [_unwrap(m).state_dict() for m in items.models]]
        optimizer_states = [xla.to_cpu(o.state_dict()) for o in items.optimizers]
    elif items.sharded is not None:
        model_states = []  # the sharded writer saves the models and optimizers itself
    elif items.model_states is not None:
        model_states = items.model_states
    else:
        model_states = [_unwrap(m).state_dict() for m in items.models]
    if items.sharded is not None:
        items.sharded.save(tmp, state.is_main_process, _write)
    if owner:
        for i, weights in enumerate(model_states):
            if safe_serialization:
                save_weights_file(weights, tmp / layout.model_file(i, True))
            else:
                _write(weights, tmp / layout.model_file(i, False))
        for i, opt in enumerate(items.optimizers if items.sharded is None else ()):
            _write(optimizer_states[i] if on_xla else opt.state_dict(), tmp / layout.object_file("optimizer", i))
        for i, obj in enumerate(items.schedulers):
            _write(obj.state_dict(), tmp / layout.object_file("scheduler", i))
        loader_states.save(tmp, items.dataloaders, _write)
        for i, obj in enumerate(items.custom):
            _write(obj.state_dict(), tmp / layout.custom_file(i))
        if items.scaler is not None:
            _write(items.scaler.state_dict(), tmp / "scaler.pt")
        if items.accelerator is not None:
            _write(items.accelerator.state_dict(), tmp / "accelerator.pt")
    _write(random_states.capture(on_xla, step), tmp / layout.rng_file(state.process_index))
    state.wait_for_everyone()
    if owner:
        if final.exists():
            _carry_over(final, tmp)
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)
        claim.unlink(missing_ok=True)  # every process tried to claim it before the first write
    state.wait_for_everyone()
    return final


def save_weights_file(state: dict[str, torch.Tensor], path: Path) -> None:
    """One safetensors file of ``state``, tied weights stored once (fsync'd)."""
    save_object(drop_shared(state)[0], path, safe_serialization=True)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def save_weights(
    state: dict[str, torch.Tensor], directory: Path, safe_serialization: bool = True,
    max_shard_size: int | str = "10GB",
) -> Path:
    """Write a model state dict as ``model.safetensors`` or ``pytorch_model.bin``, atomically.

    Above ``max_shard_size`` the weights are split into shards with an index file
    (``weight_shards``). safetensors refuses tensors sharing memory (tied weights):
    each is stored once, under its first name, as the peer does.
    """
    limit = parse_size(max_shard_size)
    directory.mkdir(parents=True, exist_ok=True)
    if safe_serialization:
        state = drop_shared(state)[0]
    return save_shards(split_state(state, limit), directory, safe_serialization)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - not possible on every platform
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resolve_checkpoint(input_dir: str | os.PathLike[str]) -> Path:
    """The directory to load: ``input_dir``, or its ``.old`` copy left by an interrupted save.

    Raises:
        FileNotFoundError: when neither exists.
    """
    path = Path(input_dir).absolute()
    if path.is_dir():
        return path
    old = path.with_name(path.name + ".old")
    if old.is_dir():
        warnings.warn(f"{path} is missing; loading {old}, left by an interrupted save_state", stacklevel=3)
        return old
    raise FileNotFoundError(f"no checkpoint directory at {path}")


def load_state(
    input_dir: str | os.PathLike[str], items: CheckpointItems, state: PartialState, weights_only: bool = True,
    strict: bool = True,
) -> Path:
    """Restore ``items`` and this process's RNGs from a ``save_state`` directory.

    ``strict=False`` lets model weights be missing or extra (a checkpoint that holds only a
    LoRA adapter, say); it applies to unsharded models, as in the peer.

    Raises:
        FileNotFoundError: missing directory or a missing file for a prepared object.
        ValueError: ``strict=False`` with sharded (FSDP / DeepSpeed) models.
    """
    path = resolve_checkpoint(input_dir)
    if not strict and items.sharded is not None:
        raise ValueError(f"load_state(strict=False) loads unsharded models only; {type(items.sharded).__name__} "
                         "restores sharded models whole: use strict=True (the default)")

    def read(name: str) -> Any:
        file = layout.find(path, name)
        if file is None:
            raise FileNotFoundError(
                f"checkpoint {path} has no {name}; was it saved with the same prepared objects?"
            )
        return _read(file, weights_only)

    if items.sharded is not None:
        items.sharded.load(path, state.is_main_process, lambda file: _read(file, weights_only))
    for i, model in enumerate(items.models if items.sharded is None else ()):
        safe = path / layout.model_file(i, True)
        if safe.is_file():  # tied weights were stored once, under one name
            _load_safetensors(_unwrap(model), str(safe), strict)
        else:
            _unwrap(model).load_state_dict(read(layout.model_file(i, False)), strict=strict)
    for kind, objs in (("optimizer", items.optimizers if items.sharded is None else []),
                       ("scheduler", items.schedulers)):
        for i, obj in enumerate(objs):
            obj.load_state_dict(read(layout.object_file(kind, i)))
    loader_states.load(path, items.dataloaders, lambda file: _read(file, weights_only))
    for i, obj in enumerate(items.custom):
        obj.load_state_dict(read(layout.custom_file(i)))
    if items.scaler is not None:
        items.scaler.load_state_dict(read("scaler.pt"))
    if items.accelerator is not None and (path / "accelerator.pt").is_file():
        items.accelerator.load_state_dict(read("accelerator.pt"))
    rng_file = layout.find(path, layout.rng_file(state.process_index))
    if rng_file is not None:
        states = random_states.read(rng_file, weights_only)
        random_states.restore(states)
        if items.accelerator is not None and not (path / "accelerator.pt").is_file() and "step" in states:
            items.accelerator.load_state_dict({"step": states["step"]})  # the peer's checkpoint
    else:
        warnings.warn(f"{layout.rng_file(state.process_index)} not found in {path}; random states not restored",
                      stacklevel=2)
    return path


@dataclass
class ProjectConfiguration:
    """Where an ``Accelerator`` keeps logs and checkpoints (the peer's names).

    Attributes:
        project_dir: base directory.
        logging_dir: tracker output; defaults to ``project_dir``.
        automatic_checkpoint_naming: ``save_state()`` without a directory writes
            ``<project_dir>/checkpoints/checkpoint_<iteration>``; ``load_state()`` loads the latest.
        total_limit: keep at most this many automatic checkpoints (oldest removed).
        iteration: the number the next automatic checkpoint gets.
        save_on_each_node: ``Accelerator.save`` writes on each machine's local main process
            (machines without a shared file system), not only on the main process. ``save_state``
            needs no such switch: it writes a complete copy on every file system by itself.
    """

    project_dir: str | os.PathLike[str] | None = None
    logging_dir: str | os.PathLike[str] | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def resolve(self, path: str | os.PathLike[str] | None, saving: bool) -> Path:
        """The directory ``save_state`` / ``load_state`` use when given ``path`` (maybe ``None``).

        Raises:
            ValueError: no path and no ``project_dir``.
            FileNotFoundError: loading the latest automatic checkpoint when there is none.
        """
        if path is not None:
            return Path(path)
        if self.automatic_checkpoint_naming:
            if saving:
                return self.next_dir()
            existing = self.checkpoints()
            if not existing:
                raise FileNotFoundError(f"no automatic checkpoint under {self.project_dir}/checkpoints")
            return existing[-1]
        if self.project_dir is None:
            raise ValueError("save_state/load_state need a directory, or Accelerator(project_dir=...)")
        return Path(self.project_dir) / "checkpoint"

    def checkpoints(self) -> list[Path]:
        """Existing automatic checkpoints, oldest first."""
        if self.project_dir is None:
            return []
        base = Path(self.project_dir) / "checkpoints"
        found = []
        for path in base.glob("checkpoint_*"):
            suffix = path.name.removeprefix("checkpoint_")
            if path.is_dir() and suffix.isdigit():
                found.append((int(suffix), path))
        return [p for _, p in sorted(found)]

    def next_dir(self) -> Path:
        """The directory of the next automatic checkpoint."""
        if self.project_dir is None:
            raise ValueError("automatic_checkpoint_naming needs a project_dir")
        return Path(self.project_dir) / "checkpoints" / f"checkpoint_{self.iteration}"

    def prune(self) -> None:
        """Delete the oldest automatic checkpoints beyond ``total_limit`` (main process only)."""
        if self.total_limit is None:
            return
        existing = self.checkpoints()
        for path in existing[: max(len(existing) - self.total_limit, 0)]:
            shutil.rmtree(path, ignore_errors=True)


def _load_safetensors(model: Any, file: str, strict: bool) -> None:
    """safetensors' ``load_model`` (which restores tied weights stored once); it reads every
    tensor's storage pointer to find the tied ones, and XLA tensors have none, so on XLA the
    tied names are found by identity instead (``state_dict(keep_vars=True)``)."""
    from safetensors.torch import load_file, load_model

    current = model.state_dict(keep_vars=True)
    if not any(tensor.device.type == "xla" for tensor in current.values()):
        load_model(model, file, strict=strict)
        return
    state = load_file(file)
    aliases: dict[int, list[str]] = {}
    for name, tensor in current.items():
        aliases.setdefault(id(tensor), []).append(name)
    for names in aliases.values():
        stored = next((name for name in names if name in state), None)
        for name in names if stored is not None else ():
            state.setdefault(name, state[stored])
    model.load_state_dict(state, strict=strict)
