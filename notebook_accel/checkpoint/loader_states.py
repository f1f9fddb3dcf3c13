"""Each prepared data loader's position in a checkpoint, in the file the peer uses for it.

A loader on torchdata's ``StatefulDataLoader`` (``use_stateful_dataloader=True``) keeps
torchdata's state in ``dl_state_dict.bin`` (``dl_state_dict_1.bin``...), the peer's file, so
either library resumes the other's epoch. Other loaders keep ours (shuffling generator and
position, ``shard.LoaderProgress``) in ``dataloader.pt``, which the peer ignores; without it
they read a stateful loader's ``dl_state_dict.bin`` (the peer's, or ours) for the batches its
epoch had done, so ``skip_first_batches(loader)`` and ``Accelerator.resume`` continue that
epoch. A loader with neither file (a stateful one given our plain file, or the peer's
checkpoint of a plain loader, where it keeps no position) starts its epoch over, with a
warning. The peer's ``sampler.bin`` (its pickled ``SeedableRandomSampler``) gives the
loader's seedable sampler its seed and epoch (``peer_sampler``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from notebook_accel.checkpoint import layout, peer_sampler


def _stateful_file(index: int) -> str:
    return "dl_state_dict.bin" if index == 0 else f"dl_state_dict_{index}.bin"


def state_file(loader: Any, index: int) -> str:
    """The file that holds the ``index``-th loader's state."""
    if getattr(loader, "use_stateful_dataloader", False):
        return _stateful_file(index)
    return layout.object_file("dataloader", index)


def state_files(loaders: list[Any]) -> list[tuple[str, Any]]:
    """Every loader's state file: its name and its state."""
    return [(state_file(loader, i), loader.state_dict()) for i, loader in enumerate(loaders)]


def load(directory: Path, loaders: list[Any], read: Callable[[Path], Any]) -> None:
    """Restore every loader whose state file ``directory`` holds (``read(path)`` reads one)."""
    for i, loader in enumerate(loaders):
        name = state_file(loader, i)
        file = layout.find(directory, name)
        if file is None and name != _stateful_file(i):  # a plain loader: a stateful one's batches done
            file = layout.find(directory, _stateful_file(i))
        if file is None:
            warnings.warn(f"{directory} has no {name} (saved with another kind of loader, or by the peer "
                          "without use_stateful_dataloader): that loader starts its epoch from the beginning",
                          stacklevel=3)
        else:
            loader.load_state_dict(read(file))
        sampler_file = directory / peer_sampler.file_name(i)
        if sampler_file.is_file():
            _seed_sampler(loader, peer_sampler.read(sampler_file))


def _seed_sampler(loader: Any, position: peer_sampler.SamplerPosition | None) -> None:
    """Give ``loader``'s seedable sampler the peer's seed and epoch (the peer puts its sampler back whole)."""
    sampler = loader.get_sampler() if hasattr(loader, "get_sampler") else None
    if position is None or not (hasattr(sampler, "initial_seed") and hasattr(sampler, "set_epoch")):
        return
    sampler.initial_seed = position.initial_seed
    sampler.set_epoch(position.epoch)
