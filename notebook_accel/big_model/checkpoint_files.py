"""Find the files of a checkpoint and list the tensors each holds without reading them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from notebook_accel.big_model.safetensors_io import StoredTensor, read_header

SAFE_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
SAFE_SINGLE = "model.safetensors"
BIN_SINGLE = "pytorch_model.bin"
_BIN_SUFFIXES = (".bin", ".pt", ".pth")


def checkpoint_files(checkpoint: str | os.PathLike) -> list[Path]:
    """The weight files of ``checkpoint``: a ``.safetensors`` or torch ``.bin`` file, an index
    (``*.index.json``: ``{"weight_map": {name: file}}``, or that map alone), or a folder holding
    an index or a single ``model.safetensors`` / ``pytorch_model.bin`` (the Hub's layouts), else
    exactly one ``*.index.json``.

    Raises:
        FileNotFoundError: naming what was looked for.
        ValueError: a folder with several ``*.index.json`` files and none of the Hub's names.
    """
    path = Path(checkpoint)
    if path.is_dir():
        for name in (SAFE_INDEX, SAFE_SINGLE, BIN_INDEX, BIN_SINGLE):
            if (path / name).is_file():
                return checkpoint_files(path / name)
        indexes = sorted(path.glob("*.index.json"))
        if len(indexes) == 1:
            return checkpoint_files(indexes[0])
        if indexes:
            raise ValueError(f"{path} holds several indexes ({', '.join(p.name for p in indexes)}): "
                             "pass the one to load")
        raise FileNotFoundError(
            f"{path} holds none of {SAFE_INDEX}, {SAFE_SINGLE}, {BIN_INDEX}, {BIN_SINGLE}, *.index.json"
        )
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.name.endswith(".index.json"):
        index = json.loads(path.read_text())
        weight_map = index.get("weight_map", index)
        return [path.parent / name for name in dict.fromkeys(weight_map.values())]
    if path.suffix == ".safetensors" or path.suffix in _BIN_SUFFIXES:
        return [path]
    raise FileNotFoundError(
        f"checkpoint {path} is not a .safetensors, .bin/.pt/.pth or .index.json file, nor a folder"
    )


def is_safetensors(path: Path) -> bool:
    return path.suffix == ".safetensors"


@contextmanager
def open_weights(path: Path) -> Iterator[tuple[dict[str, StoredTensor | torch.Tensor], int | None]]:
    """``({name: stored tensor or lazily mapped tensor}, fd)`` for one file; ``fd`` reads
    safetensors bytes. Torch files are memory-mapped, so nothing is read until it is used."""
    if is_safetensors(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            yield read_header(path), fd
        finally:
            os.close(fd)
        return
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError:  # files in torch's legacy (pre-zip) format cannot be mapped
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict of tensors")
    yield state, None
