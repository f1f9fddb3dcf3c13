"""The parts a checkpointer's state is written as, beside plain files (``training_state.StateFile``):

- ``ShardedState``: a folder every rank writes its shards into through ``torch.distributed.checkpoint``
  (FSDP2's ``SHARDED_STATE_DICT``; a later run of any world size reads the pieces it holds);
- ``StagedFolder``: files a library's own writer has already written (DeepSpeed's engine), to be
  moved into the checkpoint.

``save_state`` writes a checkpointer's parts from the live state, at once; a snapshot copies them to
host memory first (``host_copy``; a staged folder is written into host memory, ``staging_directory``)
and writes them in the background, where a sharded state's collectives go over the snapshot's own
process group, not the one the training's collectives use.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notebook_accel.checkpoint.training_state import StateFile, write_files

SHM = Path("/dev/shm")  # host memory, as a file system (Linux)


@dataclass
class ShardedState:
    """A state dict of sharded tensors (DTensors), written by every rank into the folder ``name``."""

    name: str
    state: dict[str, Any]


@dataclass
class StagedFolder:
    """A folder (``path``) whose files go into the checkpoint as they are (merged into it)."""

    path: Path


Part = StateFile | ShardedState | StagedFolder


def own_shards(state: Any) -> Any:
    """``state`` with every DTensor replaced by this rank's own shard (a plain tensor): what a rank
    holds of a sharded state, restored by ``fill_own_shards`` on the same world size and layout."""
    from notebook_accel.checkpoint.host_copy import is_dtensor

    if is_dtensor(state):
        return state.to_local()
    if isinstance(state, dict):
        return {k: own_shards(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(own_shards(v) for v in state)
    return state


def fill_own_shards(live: Any, held: Any) -> Any:
    """``held`` (``own_shards``'s) as ``live`` lays it out: each of ``live``'s DTensors rebuilt around
    the held shard (its mesh, placements and shape), every other value ``held``'s."""
    from notebook_accel.checkpoint.host_copy import is_dtensor

    if is_dtensor(live):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(held.to(live.device), live.device_mesh, live.placements, run_check=False,
                                  shape=live.shape, stride=live.stride())
    if isinstance(live, dict) and isinstance(held, dict):
        return {k: fill_own_shards(live[k], v) if k in live else v for k, v in held.items()}
    if isinstance(live, (list, tuple)) and isinstance(held, (list, tuple)) and len(live) == len(held):
        return type(held)(fill_own_shards(a, b) for a, b in zip(live, held, strict=True))
    return held


def write_parts(directory: Path, parts: list[Part], group: Any = None, paced: bool = False) -> None:
    """Write ``parts`` into ``directory`` (every rank calls it, with its own parts: sharded states
    are collectives over ``group``, the default group when ``None``). A staged folder is moved in
    and removed. ``paced``: the files are written a piece at a time (``paced_writes``).

    ``torch.distributed.checkpoint`` is imported only for a sharded state (whose strategy has
    imported it already): its import, 80 modules, took 60 ms of a background snapshot's first
    write, holding the interpreter while training waited."""
    write_files(directory, [p for p in parts if isinstance(p, StateFile)], paced)
    for part in parts:
        if isinstance(part, ShardedState):
            import torch.distributed.checkpoint as dcp

            with quiet_alone():
                dcp.save(part.state, checkpoint_id=directory / part.name, process_group=group)
        elif isinstance(part, StagedFolder) and part.path.absolute() != directory.absolute():
            try:
                _copy_in(part.path, directory)
            finally:
                shutil.rmtree(part.path, ignore_errors=True)


@contextmanager
def quiet_alone() -> Iterator[None]:
    """Without a process group, silence ``torch.distributed.checkpoint``'s warning that it reads or
    writes in one process (it always says so then; that is what a one-process job means)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*uninitialized, assuming")
        yield


def _copy_in(source: Path, directory: Path) -> None:
    """Copy the tree ``source`` into ``directory`` (merged), every file fsync'd."""
    for root, _, names in os.walk(source):
        target = directory / Path(root).relative_to(source)
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copyfile(Path(root, name), target / name)
            with open(target / name, "rb+") as f:
                os.fsync(f.fileno())


@contextmanager
def private_folder(purpose: str) -> Iterator[Path]:
    """A fresh folder of this process in host memory (``/dev/shm``; the temporary directory where there
    is none), removed afterwards."""
    import tempfile

    where = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix=f"notebook_accel-{purpose}-", dir=where))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def staging_directory(token: str, step: int, need_bytes: int, one_machine: bool) -> Path | None:
    """A fresh folder in host memory (``/dev/shm``) that every rank of one machine shares, for a
    library's writer to write a snapshot into on the training path; ``None`` where there is none
    with ``need_bytes`` free (twice, for safety) or the ranks span machines (write in place then)."""
    if not one_machine or not SHM.is_dir() or not os.access(SHM, os.W_OK):
        return None
    if shutil.disk_usage(SHM).free < 2 * need_bytes:
        return None
    return SHM / f"notebook_accel-snapshot-{token}-{step}"
