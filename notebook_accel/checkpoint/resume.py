"""``Accelerator.resume``: the newest complete snapshot loaded, the loaders set to skip what was seen,
and the step to go on from, said in one line.

A snapshot of another run shape (world size, strategy, prepared objects, a model's weight shapes:
``snapshot_identity``) is refused, naming the difference; one of FSDP's loads on another world size
(its shards resharded by ``torch.distributed.checkpoint``; the loaders skip the samples the old
processes had seen together). Rank 0 chooses the snapshot and every
rank loads that one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from notebook_accel.checkpoint import (
    orchestration,
    snapshot_dir,
    snapshot_peers,
    snapshot_remote,
    state_parts,
)
from notebook_accel.checkpoint.snapshot_identity import differences, identity
from notebook_accel.checkpoint.training_state import write_files
from notebook_accel.runtime import ops


def resume(accelerator: Any, directory: Path) -> int:
    """Load the newest complete snapshot in ``directory`` into ``accelerator``'s prepared objects (every
    rank calls it, after ``prepare``); returns the optimizer steps it holds (0 when there is none).

    Raises:
        ValueError: the snapshot is of another run shape (the message names the difference).
    """
    directory = directory.absolute()
    held = snapshot_peers.take_restored(str(directory))  # a heal's, on every rank or none
    if held is not None:
        return _resume_from_peers(accelerator, held)
    if accelerator.is_main_process:
        snapshot_remote.pull_newest(directory)  # a URL's newest, into its mirror (one machine)
    newest = snapshot_dir.newest(directory) if accelerator.is_main_process else None
    if accelerator.num_processes > 1:
        newest = ops.broadcast_object_list([newest])[0]
    if newest is None:
        accelerator.print(f"nothing to resume in {snapshot_remote.remote_of(directory) or directory}: "
                          "starting at step 0")
        return 0
    assert newest.meta is not None
    found = differences(newest.meta, identity(accelerator))
    if found:
        raise ValueError(f"cannot resume from {newest.path}: " + "; ".join(found)
                         + ". Resume with the run shape it was taken with, or snapshot into another directory")
    orchestration.load_accelerator_state(accelerator, newest.path, weights_only=True, strict=True)
    saved_world = int(newest.meta.get("world_size", accelerator.num_processes))
    for loader in accelerator._dataloaders:
        loader.skip_seen_on_next_pass(saved_world)
    step = int(newest.meta["step"])
    resharded = "" if saved_world == accelerator.num_processes else (
        f"; resharded from {saved_world} processes to {accelerator.num_processes}")
    where = snapshot_remote.remote_of(directory) or directory
    accelerator.print(f"resumed from snapshot step {step:,} (saved {snapshot_dir.ago(time.time() - newest.saved_at)} ago, "
                      f"{where}); {step:,} steps not redone{resharded}")
    return step



def _resume_from_peers(accelerator: Any, held: snapshot_peers.Restored) -> int:
    """Load the snapshot a warm pool's heal brought back from the peers' memory (``snapshot_peers``):
    the files into a private folder in host memory, each rank's shards as they are; no disk read."""
    found = differences(held.meta, identity(accelerator))
    if found:
        raise ValueError(f"cannot resume from the snapshot of step {held.step:,} held in the peers' memory: "
                         + "; ".join(found) + ". Prepare the objects it was taken with")
    with state_parts.private_folder("peers") as folder:
        write_files(folder, held.files)
        orchestration.load_accelerator_state(accelerator, folder, weights_only=True, strict=True,
                                             own_shards=held.shards)
    for loader in accelerator._dataloaders:
        loader.skip_seen_on_next_pass(accelerator.num_processes)
    accelerator.print(f"resumed from snapshot step {held.step:,} held in the peers' memory (taken "
                      f"{snapshot_dir.ago(time.time() - float(held.meta['saved_at']))} ago; nothing read from "
                      f"{held.directory}); {held.step:,} steps not redone")
    return held.step
