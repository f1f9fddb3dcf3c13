"""The peer's disk-offload format, for files it wrote and for code written against it.

One raw array per tensor (``<name>.dat``, written and read through numpy's memory maps; numpy
is imported only when they are) and an
``index.json`` giving each one's dtype (torch's name) and shape. Dtypes numpy lacks
(bfloat16, the float8s) are stored as the signed integers of their width. Our own dispatch
offloads to safetensors files instead (``safetensors_io``); this module serves the peer's names:
``offload_weight``, ``load_offloaded_weight``, ``offload_state_dict``, ``save_offload_index``,
``OffloadedWeightsLoader``, ``PrefixedDataset``, ``extract_submodules_state_dict``, and
``stored_tensors``: a folder the peer offloaded into, as our dispatch reads it (each ``.dat``
file memory-mapped where it lies, as a safetensors file's tensors are).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from notebook_accel.big_model.safetensors_io import StoredTensor, read_header

INDEX = "index.json"
_AS_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _storage(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` is written as: itself, or the integer of its width where numpy lacks it."""
    try:
        torch.empty(0, dtype=dtype).numpy()
    except TypeError:
        return _AS_INT[torch.empty(0, dtype=dtype).element_size()]
    return dtype


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike[str],
                   index: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Write ``weight`` to ``<offload_folder>/<weight_name>.dat``; returns ``index`` with its entry added."""
    import numpy as np

    stored = weight.detach().cpu().contiguous()
    array = stored.view(_storage(stored.dtype)).numpy()
    if index is not None:
        index[weight_name] = {"dtype": str(weight.dtype).removeprefix("torch."), "shape": list(weight.shape)}
    out = np.memmap(Path(offload_folder) / f"{weight_name}.dat", dtype=array.dtype, mode="w+",
                    shape=array.shape or (1,))
    out[:] = array.reshape(out.shape)
    out.flush()
    return index


def load_offloaded_weight(weight_file: str | os.PathLike[str], weight_info: Mapping[str, Any]) -> torch.Tensor:
    """The tensor ``offload_weight`` wrote to ``weight_file`` (``weight_info``: its index entry)."""
    import numpy as np

    dtype = getattr(torch, weight_info["dtype"])
    shape = tuple(weight_info["shape"])
    storage = _storage(dtype)
    array = np.memmap(weight_file, dtype=torch.empty(0, dtype=storage).numpy().dtype, mode="r", shape=shape or (1,))
    tensor = torch.from_numpy(np.array(array)).reshape(shape)
    return tensor.view(dtype) if storage != dtype else tensor


def stored_tensors(folder: str | os.PathLike[str]) -> dict[str, StoredTensor]:
    """Where each tensor of the peer's offload folder lies (``index.json``: a ``.dat`` file, or a
    safetensors file's tensor), without reading any; ``{}`` when ``folder`` has no ``index.json``."""
    file = Path(folder) / INDEX
    if not file.is_file():
        return {}
    found: dict[str, StoredTensor] = {}
    for name, info in json.loads(file.read_text()).items():
        if "safetensors_file" in info:
            found[name] = read_header(info["safetensors_file"])[info.get("weight_name", name)]
            continue
        dtype, shape = getattr(torch, info["dtype"]), tuple(info["shape"])
        size = max(torch.Size(shape).numel(), 1) * torch.empty((), dtype=dtype).element_size()
        found[name] = StoredTensor(os.fspath(Path(folder) / f"{name}.dat"), dtype, shape, 0, size)
    return found


def save_offload_index(index: dict[str, Any], offload_folder: str | os.PathLike[str]) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json``."""
    if not index:
        return
    file = Path(offload_folder) / INDEX
    merged = json.loads(file.read_text()) if file.is_file() else {}
    merged.update(index)
    file.write_text(json.dumps(merged, indent=2))


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor]) -> None:
    """Write every tensor of ``state_dict`` to ``save_dir`` (created), with its ``index.json``."""
    os.makedirs(save_dir, exist_ok=True)
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index)
    save_offload_index(index, save_dir)


class OffloadedWeightsLoader(Mapping):
    """A read-only mapping of tensor names to tensors: those of ``state_dict`` as they are, the
    others read from ``save_folder`` when asked for (``.dat`` files, or the safetensors file an
    index entry names with ``safetensors_file`` / ``weight_name``).

    Args:
        state_dict: tensors in memory.
        save_folder: a folder ``offload_state_dict`` wrote (its ``index.json`` is read).
        index: the index itself, instead of (or besides) the folder's.
        device: where tensors read from safetensors files are put (default: the CPU).
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor] | None = None,
                 save_folder: str | os.PathLike[str] | None = None, index: Mapping[str, Any] | None = None,
                 device: Any = None) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index")
        self.state_dict = dict(state_dict or {})
        self.save_folder = save_folder
        if index is None and save_folder is not None and (Path(save_folder) / INDEX).is_file():
            index = json.loads((Path(save_folder) / INDEX).read_text())
        self.index = dict(index or {})
        self.all_keys = list(self.state_dict) + [k for k in self.index if k not in self.state_dict]
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        if "safetensors_file" in info:
            from safetensors import safe_open

            with safe_open(info["safetensors_file"], framework="pt", device=str(self.device or "cpu")) as f:
                tensor = f.get_tensor(info.get("weight_name", key))
            return tensor.to(getattr(torch, info["dtype"])) if "dtype" in info else tensor
        return load_offloaded_weight(Path(self.save_folder) / f"{key}.dat", info)

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


class PrefixedDataset(Mapping):
    """The entries of ``dataset`` under ``prefix``: ``PrefixedDataset(d, "a.")["w"]`` is ``d["a.w"]``;
    iterating gives the full keys that start with ``prefix``, as the peer's does."""

    def __init__(self, dataset: Mapping[str, Any], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return (key for key in self.dataset if key.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def extract_submodules_state_dict(state_dict: Mapping[str, Any], submodule_names: Iterable[str]) -> dict[str, Any]:
    """The entries of ``state_dict`` that belong to one of ``submodule_names`` (the name itself, or below it)."""
    names = list(submodule_names)
    return {key: value for key, value in state_dict.items()
            if any(key == name or key.startswith(f"{name}.") for name in names)}
