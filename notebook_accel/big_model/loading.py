"""``load_checkpoint_in_model``: put each checkpoint tensor straight where the device map says."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from notebook_accel._peer_paths import peer_logger
from notebook_accel.big_model.checkpoint_files import checkpoint_files, open_weights
from notebook_accel.big_model.devices import (
    DeviceKey,
    check_gpus,
    current_devices,
    normalize_device,
)
from notebook_accel.big_model.hooks import WeightSource
from notebook_accel.big_model.memory import as_dtype
from notebook_accel.big_model.model_tensors import (
    buffer_names,
    entries_of_tensors,
    get_tensor,
    set_tensor,
    shared_names,
)
from notebook_accel.big_model.planner import main_device, offload_tiers
from notebook_accel.big_model.safetensors_io import StoredTensor, read_tensor, write_safetensors

# Set on a model by load_checkpoint_in_model: {tensor name: WeightSource} of its offloaded tensors,
# consumed by dispatch_model.
OFFLOADED = "_notebook_accel_offloaded"

logger = peer_logger(__name__)


def _cast(dtype: torch.dtype | None, stored_dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype is not None and stored_dtype.is_floating_point else stored_dtype


def _materialize(entry: StoredTensor | torch.Tensor, fd: int | None, device: torch.device,
                 dtype: torch.dtype) -> torch.Tensor:
    """An owned tensor on ``device`` holding ``entry`` (read with one ``preadv`` on the CPU)."""
    if isinstance(entry, StoredTensor):
        host = read_tensor(entry, fd)
        return host.to(device=device, dtype=dtype)
    # A tensor of a memory-mapped torch file: copy it out, so the file's pages can be let go.
    return entry.to(device=device, dtype=dtype, copy=True)


def _meta_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")


def resident_device(device: DeviceKey, tiers: set[DeviceKey], is_buffer: bool,
                    offload_buffers: bool, main: DeviceKey) -> DeviceKey | None:
    """Where a tensor placed on ``device`` lives for good, or ``None`` when it is offloaded."""
    if device not in tiers:
        return device
    return None if offload_buffers or not is_buffer else main


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: Mapping[str, DeviceKey | torch.device] | None = None,
    offload_folder: str | os.PathLike | None = None,
    dtype: torch.dtype | str | None = None,
    offload_buffers: bool = False,
    strict: bool = False,
    offload_state_dict: bool | None = None,
    keep_in_fp32_modules: list[str] | None = None,
) -> None:
    """Load ``checkpoint`` into ``model`` file by file, each tensor straight to its device.

    Tensors placed on a GPU or on the CPU are read into their final memory. Offloaded tensors
    (``"disk"``, and ``"cpu"`` when a GPU runs the model) stay meta in the model and are recorded for
    ``dispatch_model``: disk-placed tensors of safetensors files are not read at all, they are later
    streamed from the checkpoint itself; those of torch ``.bin`` files are written to
    ``offload_folder`` as safetensors first. Tied parameters stay tied.

    Args:
        model: usually built under ``init_empty_weights``.
        checkpoint: a file, an ``*.index.json``, or a folder (see ``checkpoint_files``).
        device_map: ``{module or tensor name: device}``; default: everything on the CPU.
        offload_folder: where disk-placed tensors of ``.bin`` checkpoints are written.
        dtype: cast floating-point tensors to this dtype.
        offload_buffers: offload buffers with their module (default: they stay on the main device).
        strict: raise on checkpoint tensors the model lacks, and on model tensors it lacks
            (without it, the first are named in a logged warning, in the peer's words).
        offload_state_dict: the peer's switch to stage the CPU part of the state dict on disk when
            it does not fit in memory; accepted, and needless here: tensors are read one at a time.
        keep_in_fp32_modules: names of modules whose floating-point weights stay in float32 when
            ``dtype`` casts the others.

    Raises:
        ValueError: a tensor the model needs is neither in the checkpoint nor already real; with
            ``strict``, any missing or unexpected names; disk placement of a ``.bin`` checkpoint
            without ``offload_folder``.
    """
    device_map = {"": "cpu"} if device_map is None else {k: normalize_device(v) for k, v in device_map.items()}
    check_gpus(device_map)
    dtype = as_dtype(dtype)
    devices = current_devices()
    entries = entries_of_tensors(model, device_map)
    placed = {name: device_map[entry] for name, entry in entries.items()}
    tiers = offload_tiers(device_map.values())
    main = main_device(device_map.values())
    buffers, shared = buffer_names(model), shared_names(model)
    record: dict[str, WeightSource] = dict(getattr(model, OFFLOADED, {}))

    def home(name: str) -> DeviceKey | None:
        return resident_device(placed[name], tiers, name in buffers, offload_buffers, main)

    def put(names: list[str], value: torch.Tensor, offload_as: WeightSource) -> None:
        """Share one tensor (one Parameter for tied names) among the resident names; offloaded
        names get a meta placeholder and a source."""
        placeholder = _meta_like(value)
        for name in names:
            if home(name) is not None:
                set_tensor(model, name, value)
                value = get_tensor(model, name)  # the Parameter the next tied name shares
            else:
                set_tensor(model, name, placeholder)
                placeholder = get_tensor(model, name)
                record[name] = offload_as

    kept = set(keep_in_fp32_modules or ())

    def dtype_of(key: str) -> torch.dtype | None:  # float32 inside a keep_in_fp32_modules module
        return torch.float32 if dtype is not None and kept & set(key.split(".")[:-1]) else dtype

    found: set[str] = set()
    unexpected: list[str] = []
    for path in checkpoint_files(checkpoint):
        to_write: dict[str, list[str]] = {}
        with open_weights(path) as (stored, fd):
            for key, entry in stored.items():
                if key not in placed:
                    unexpected.append(key)
                    continue
                names = shared[key]
                found.update(names)
                target = _cast(dtype_of(key), entry.dtype)
                homes = [home(n) for n in names if home(n) is not None]
                if homes:
                    value = _materialize(entry, fd, devices.torch_device(homes[0]), target)
                    put(names, value, WeightSource(value))
                elif "cpu" in {placed[n] for n in names}:
                    value = _materialize(entry, fd, torch.device("cpu"), target)
                    put(names, value, WeightSource(value))
                elif isinstance(entry, StoredTensor):
                    put(names, torch.empty(entry.shape, dtype=target, device="meta"),
                        WeightSource(entry, dtype_of(key)))
                else:
                    to_write[key] = names
            if to_write:
                if offload_folder is None:
                    raise ValueError(
                        f"device_map puts {', '.join(list(to_write)[:3])}... on disk, and {path.name} "
                        "is not a safetensors file: pass offload_folder= to hold them"
                    )
                os.makedirs(offload_folder, exist_ok=True)
                out = Path(offload_folder) / f"{path.stem}.offload.safetensors"
                written = write_safetensors(out, {key: stored[key] for key in to_write})
                for key, names in to_write.items():
                    meta = torch.empty(written[key].shape, dtype=_cast(dtype_of(key), written[key].dtype),
                                       device="meta")
                    put(names, meta, WeightSource(written[key], dtype_of(key)))

    missing = [name for name in placed if name not in found]
    if strict and (missing or unexpected):
        raise ValueError(f"checkpoint {checkpoint}: missing {_few(missing)}, unexpected {_few(unexpected)}")
    if unexpected:
        logger.warning(f"Some weights of the model checkpoint at {checkpoint} were not used when initializing "
                       f"{type(model).__name__}: {_few(unexpected)}")
    _place_missing(model, missing, home, placed, record, devices)
    setattr(model, OFFLOADED, record)


def _few(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (", ".join(names[:shown]) or "none") + more


def _place_missing(model, missing, home, placed, record, devices) -> None:
    """Tensors the checkpoint does not hold: real ones (non-persistent buffers, weights the user
    set) move to their place; meta ones that nothing will fill are an error now, not at run time."""
    empty = [name for name in missing if get_tensor(model, name).is_meta and name not in record]
    if empty:
        raise ValueError(
            f"{_few(empty)} are in neither the checkpoint nor memory (still on the meta device); "
            "build buffers outside init_empty_weights(include_buffers=True), or add them to the checkpoint"
        )
    for name in missing:
        tensor = get_tensor(model, name)
        if tensor.is_meta:
            continue
        target = home(name)
        if target is None:
            record[name] = WeightSource(tensor.detach().to("cpu"))
            set_tensor(model, name, _meta_like(tensor))
        else:
            set_tensor(model, name, tensor.detach().to(devices.torch_device(target)))
