"""The file names of a ``save_state`` checkpoint: the peer's (Accelerate's), so that each library
loads the other's checkpoints; our earlier names are still read.

``model.safetensors`` / ``model_1.safetensors`` (or ``pytorch_model.bin`` / ``pytorch_model_1.bin``),
``optimizer.bin``, ``scheduler.bin`` (``_1``... for later ones), ``scaler.pt``,
``custom_checkpoint_0.pkl``, ``random_states_<rank>.pkl``, ``dl_state_dict.bin`` (``loader_states``):
the peer's. ``dataloader.pt`` and ``accelerator.pt`` are ours (the peer has no such files and
ignores them).
"""

from __future__ import annotations

from pathlib import Path

_PEER_OBJECTS = ("optimizer", "scheduler")  # files the peer writes as <kind>.bin / <kind>_<i>.bin


def _indexed(stem: str, index: int, ext: str) -> str:
    return f"{stem}{ext}" if index == 0 else f"{stem}_{index}{ext}"


def model_file(index: int, safe_serialization: bool) -> str:
    """The ``index``-th model's weights."""
    return _indexed("model", index, ".safetensors") if safe_serialization else _indexed("pytorch_model", index, ".bin")


def object_file(kind: str, index: int) -> str:
    """The ``index``-th optimizer, scheduler or data loader (``kind``)."""
    return _indexed(kind, index, ".bin" if kind in _PEER_OBJECTS else ".pt")


def custom_file(index: int) -> str:
    """The ``index``-th object given to ``register_for_checkpointing``."""
    return f"custom_checkpoint_{index}.pkl"


def rng_file(process_index: int) -> str:
    """One process's random states."""
    return f"random_states_{process_index}.pkl"


def _earlier(name: str) -> str:
    """The name our earlier layout gave that file (``optimizer.bin`` -> ``optimizer.pt``...)."""
    if name.startswith("pytorch_model") and name.endswith(".bin"):
        return "model" + name.removeprefix("pytorch_model").removesuffix(".bin") + ".pt"
    return name.removesuffix(".bin").removesuffix(".pkl") + ".pt" if name.endswith((".bin", ".pkl")) else name


def find(directory: Path, name: str) -> Path | None:
    """``directory / name``, else the file under its earlier name, else ``None``."""
    for candidate in (name, _earlier(name)):
        if (directory / candidate).is_file():
            return directory / candidate
    return None
