"""The atomic-directory protocol of ``save_state``: a checkpoint directory appears whole or not at all.

Everything is written (and fsync'd) into ``<dir>.tmp``; only then does the main process
move the old ``<dir>`` aside to ``<dir>.old``, rename ``<dir>.tmp`` to ``<dir>`` and delete
``<dir>.old``. A crash while writing leaves the previous checkpoint untouched; a crash
between the two renames leaves a complete ``<dir>.old``, which ``resolve_checkpoint`` falls
back to. Other files in ``<dir>`` (what a save-state pre-hook or the user wrote there) move
into the new checkpoint, as they stay in the peer's, which writes in place; checkpoint files
of the old state that the new one does not write (a model no longer prepared) do not.
Processes that do not share the directory with the main process (a path per rank, machines
without a shared file system) each get a complete copy: one process per file system claims
it (``<dir>.claim-<token>``, created exclusively) and does the same there.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

from notebook_accel.runtime.ops import broadcast_object_list

_CHECKPOINT_FILE = re.compile(  # what save_state itself writes (stale ones are not carried over)
    r"(pytorch_model(_fsdp)?|model|optimizer|scheduler|dataloader|dl_state_dict|custom_checkpoint|random_states)"
    r"(_\d+)?"
    r"\.(pt|bin|pkl|safetensors)"
    r"|scaler\.pt|accelerator\.pt|(pytorch_model_fsdp|optimizer)_\d+")


class AtomicDir:
    """One ``save_state``'s directory: claimed on every process (``tmp`` to write into, ``owner``:
    this process writes the shared files there), then ``commit``-ted by every process.

    Args:
        output_dir: the checkpoint directory.
        state: where this process stands (a ``PartialState``).
    """

    def __init__(self, output_dir: str | os.PathLike[str], state: Any) -> None:
        self.state = state
        self.final = Path(output_dir).absolute()
        self.tmp = self.final.with_name(self.final.name + ".tmp")
        self.old = self.final.with_name(self.final.name + ".old")
        self.claim = _claim_tmp(self.final, self.tmp, state)
        self.owner = self.claim is not None

    def commit(self) -> Path:
        """Wait for every process's writes, then (owners) swap ``tmp`` in; returns the directory."""
        self.state.wait_for_everyone()
        if self.claim is not None:
            swap_in(self.tmp, self.final)
            self.claim.unlink(missing_ok=True)  # every process tried to claim it before the first write
        self.state.wait_for_everyone()
        return self.final


def swap_in(tmp: Path, final: Path) -> None:
    """Make the fully written (fsync'd) directory ``tmp`` the directory ``final``, atomically: the old
    ``final`` (if any) goes aside to ``<final>.old`` until the rename is durable, its foreign files
    carried over. One process does it, once every process's writes are done."""
    old = final.with_name(final.name + ".old")
    if final.exists():
        _carry_over(final, tmp)
    fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


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


def _carry_over(final: Path, tmp: Path) -> None:
    """Move the entries of ``final`` that are no checkpoint files of ours and that the new
    checkpoint does not write into ``tmp`` (a pre-hook's ``data.json``, the user's notes)."""
    for entry in final.iterdir():
        if not _CHECKPOINT_FILE.fullmatch(entry.name) and not (tmp / entry.name).exists():
            os.rename(entry, tmp / entry.name)


def _claim_tmp(final: Path, tmp: Path, state: Any) -> Path | None:
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


def fsync_dir(path: Path) -> None:
    """Make ``path``'s entries (files created or renamed in it) durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - not possible on every platform
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
