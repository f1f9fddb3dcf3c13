"""The peer's ``sampler.bin``: its pickled ``SeedableRandomSampler``, read without running its code.

The peer's ``save_state`` writes a loader's sampler whole (``torch.save`` of the object: its
class, the user's dataset inside it, its generator) as ``sampler.bin`` (``sampler_1.bin``...),
and its ``load_state`` puts the unpickled object back. Of that object a resumed loader needs
two numbers: the seed and the epoch (the permutation of epoch ``e`` is drawn from ``seed + e``,
in both libraries: ``data/samplers.SeedableRandomSampler``). They are read here with an
unpickler that builds nothing but tensors, devices and inert records: every other class named
in the file (the peer's, the user's dataset) becomes a record of its pickled state, so loading
a checkpoint never runs code the checkpoint names, as ``weights_only`` loading promises.
"""

from __future__ import annotations

import pickle
import types
from pathlib import Path
from typing import Any

import torch

__all__ = ["SamplerPosition", "file_name", "read"]


def file_name(index: int) -> str:
    """The ``index``-th loader's sampler file, as the peer names it."""
    return "sampler.bin" if index == 0 else f"sampler_{index}.bin"


class SamplerPosition:
    """What a resumed loader takes from the peer's sampler: ``initial_seed`` and ``epoch``."""

    def __init__(self, initial_seed: int, epoch: int) -> None:
        self.initial_seed = initial_seed
        self.epoch = epoch


class _Record:
    """An object the file names, kept as its pickled state and nothing more."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.__dict__["state"] = state


def _allowed(module: str, name: str) -> Any:
    """The few globals built for real: a tensor's rebuild, its storage's type, a device."""
    if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_parameter"):
        return getattr(torch._utils, name)
    if module == "torch" and (name.endswith("Storage") or name == "device"):
        return getattr(torch, name)
    if module == "collections" and name == "OrderedDict":
        from collections import OrderedDict

        return OrderedDict
    return None


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(module, name)
        if found is not None:
            return found
        return type(name, (_Record,), {"__module__": f"recorded:{module}"})


_INERT = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="inert_pickle")


def read(path: Path) -> SamplerPosition | None:
    """The seed and epoch of the sampler the peer pickled into ``path``; ``None`` when it holds no
    ``SeedableRandomSampler`` (the peer writes the file for no other)."""
    obj = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_INERT)
    if type(obj).__name__ != "SeedableRandomSampler":
        return None
    fields = obj.__dict__.get("state") or obj.__dict__
    if not isinstance(fields, dict) or "initial_seed" not in fields or "epoch" not in fields:
        return None
    return SamplerPosition(int(fields["initial_seed"]), int(fields["epoch"]))
