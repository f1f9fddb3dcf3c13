"""Each prepared data loader's position in a checkpoint, in the file the peer uses for it.

A loader on torchdata's ``StatefulDataLoader`` (``use_stateful_dataloader=True``) keeps
torchdata's state in ``dl_state_dict.bin`` (``dl_state_dict_1.bin``...), the peer's file, so
either library resumes the other's epoch. Other loaders keep ours (shuffling generator and
position, ``shard.LoaderProgress``) in ``dataloader.pt``, which the peer ignores. A loader
whose file is absent (a checkpoint of the other kind, or the peer's, which keeps no position
for plain loaders) starts its epoch over, with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from notebook_accel.checkpoint import layout


def state_file(loader: Any, index: int) -> str:
    """The file that holds the ``index``-th loader's state."""
    if getattr(loader, "use_stateful_dataloader", False):
        return "dl_state_dict.bin" if index == 0 else f"dl_state_dict_{index}.bin"
    return layout.object_file("dataloader", index)


def state_files(loaders: list[Any]) -> list[tuple[str, Any]]:
    """Every loader's state file: its name and its state."""
    return [(state_file(loader, i), loader.state_dict()) for i, loader in enumerate(loaders)]


def load(directory: Path, loaders: list[Any], read: Callable[[Path], Any]) -> None:
    """Restore every loader whose state file ``directory`` holds (``read(path)`` reads one)."""
    for i, loader in enumerate(loaders):
        name = state_file(loader, i)
        file = layout.find(directory, name)
        if file is None:
            warnings.warn(f"{directory} has no {name} (saved with another kind of loader, or by the peer "
                          "without use_stateful_dataloader): that loader starts its epoch from the beginning",
                          stacklevel=3)
            continue
        loader.load_state_dict(read(file))
