"""``dispatch_model``: run a model spread over GPUs, CPU and disk; ``undispatch_model``: the way back
to an ordinary model on one device (also what ``.to()`` on a dispatched model does)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from notebook_accel.big_model import model_hooks
from notebook_accel.big_model.dat_offload import stored_tensors
from notebook_accel.big_model.devices import (
    DeviceKey,
    check_gpus,
    current_devices,
    normalize_device,
)
from notebook_accel.big_model.hooks import ModuleHook, WeightSource
from notebook_accel.big_model.loading import OFFLOADED, resident_device
from notebook_accel.big_model.model_tensors import (
    buffer_names,
    entries_of_tensors,
    get_tensor,
    set_tensor,
    shared_names,
    split_name,
)
from notebook_accel.big_model.planner import main_device as first_main_device
from notebook_accel.big_model.safetensors_io import StoredTensor, write_safetensors

DISPATCHED = model_hooks.DISPATCHED


@dataclass
class _Dispatch:
    hooks: list[ModuleHook]
    sources: dict[str, WeightSource]  # offloaded tensor name -> where its values are
    ties: dict[str, list[str]]  # offloaded tensor name -> every name sharing its placeholder
    main: torch.device

    def undo(self, model: nn.Module) -> None:
        """What removing the model's hooks does (``model_hooks``): hooks off, offloaded weights
        loaded onto the CPU (where the peer's hooks put them back), resident ones left in place."""
        self.restore(model, torch.device("cpu"))

    def restore(self, model: nn.Module, device: torch.device) -> None:
        """Undo the dispatch of ``model``: hooks, movers and ``hf_device_map`` gone, offloaded
        weights loaded onto ``device`` (tied ones stay tied)."""
        model.__dict__.pop(DISPATCHED, None)
        for method in model_hooks.MOVERS:
            model.__dict__.pop(method, None)
        for hook in self.hooks:
            hook.remove()
        done: set[str] = set()
        for name, source in self.sources.items():
            if name in done:
                continue
            value = source.materialize(device)
            for other in self.ties[name]:
                set_tensor(model, other, value)
                value = get_tensor(model, other)
                done.add(other)
        model.__dict__.pop("hf_device_map", None)


def _meta_error(name: str) -> ValueError:
    return ValueError(
        f"{name} is still on the meta device: load its weights first (load_checkpoint_in_model, or "
        "load_checkpoint_and_dispatch), or build it outside init_empty_weights"
    )


def dispatch_model(
    model: nn.Module,
    device_map: Mapping[str, DeviceKey | torch.device],
    main_device: DeviceKey | torch.device | None = None,
    offload_dir: str | os.PathLike | None = None,
    offload_buffers: bool = False,
    skip_keys: Iterable[str] | None = None,
    force_hooks: bool = False,
    preload_module_classes: Iterable[str] | None = None,
) -> nn.Module:
    """Place ``model`` as ``device_map`` says and hook it so it runs across those devices.

    Pieces on a GPU (or on the CPU when the CPU runs the model) are moved there once. Offloaded
    pieces (``"disk"``, and ``"cpu"`` when a GPU is the main device) stay meta in the model and are
    brought to the main device just before they run, then dropped: weights of a safetensors
    checkpoint (recorded by ``load_checkpoint_in_model``) are memory-mapped from the checkpoint
    itself, in-memory weights placed on disk are written once to ``offload_dir``. Inputs move to each
    piece's device; outputs come back to the device of the input. Sets ``model.hf_device_map``.

    Args:
        model: the model, loaded (real tensors) or loaded with ``load_checkpoint_in_model``.
        device_map: ``{module or tensor name: device}``, e.g. from ``infer_auto_device_map``.
        main_device: where offloaded pieces run; default: the first GPU of the map, else the CPU.
        offload_dir: where in-memory weights placed on disk are written; a folder the peer
            offloaded into (its ``index.json`` and ``.dat`` files) gives the weights it holds instead.
        offload_buffers: offload buffers with their module (default: they stay on the main device).
        skip_keys: keys of dict outputs left where they are when outputs go back.
        force_hooks: hook the model even when it all sits on one device.
        preload_module_classes: class names of modules whose offloaded weights, their submodules'
            included, are all brought in when the module starts (a module that reads a submodule's
            weights without calling it).

    Returns:
        ``model`` itself. ``undispatch_model(model)`` or ``model.to(device)`` turn it back.

    Raises:
        ValueError: an unplaced tensor, a GPU this machine lacks, a model already dispatched,
            or in-memory weights placed on disk without ``offload_dir``.
    """
    if DISPATCHED in model.__dict__:
        raise ValueError("this model is already dispatched; undispatch_model(model) first")
    device_map = {name: normalize_device(device) for name, device in device_map.items()}
    check_gpus(device_map)
    devices = current_devices()
    entries = entries_of_tensors(model, device_map)
    main = normalize_device(main_device) if main_device is not None else first_main_device(device_map.values())
    tiers = {"disk"} if main == "cpu" else {"cpu", "disk"}
    record: dict[str, WeightSource] = model.__dict__.pop(OFFLOADED, {})
    buffers = buffer_names(model)

    sources: dict[str, WeightSource] = {}
    offloaded = stored_tensors(offload_dir) if offload_dir is not None else {}
    moved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    to_write: dict[int, list[str]] = {}
    for name, entry in entries.items():
        placed = device_map[entry]
        home = resident_device(placed, tiers, name in buffers, offload_buffers, main)
        tensor = get_tensor(model, name)
        if home is not None:
            _make_resident(model, name, tensor, record, devices.torch_device(home), moved)
        elif name in record:
            sources[name] = record[name]
        elif placed == "disk" and name in offloaded:  # the folder the peer offloaded into: read where it lies
            sources[name] = WeightSource(_matching(offloaded[name], name, tensor))
        elif tensor.is_meta:
            raise _meta_error(name)
        elif placed == "cpu":
            sources[name] = WeightSource(tensor.detach().to("cpu"))
        else:
            to_write.setdefault(id(tensor), []).append(name)
    if to_write:
        sources.update(_write_offloaded(model, to_write, offload_dir))
    _replace_with_placeholders(model, sources)

    model.hf_device_map = dict(device_map)
    if len(set(device_map.values())) == 1 and not sources and not force_hooks:
        return model
    hooks = _hook(model, device_map, entries, sources, devices.torch_device(main), tiers, skip_keys,
                  set(preload_module_classes or ()))
    ties = shared_names(model)
    setattr(model, DISPATCHED, _Dispatch(hooks, sources, {n: ties[n] for n in sources}, devices.torch_device(main)))
    for method in model_hooks.MOVERS:
        setattr(model, method, _undispatching_mover(model, method))
    return model


def _make_resident(model, name, tensor, record, device, moved) -> None:
    """Put one resident tensor on ``device``, once per tensor object, so tied names stay tied.
    ``moved`` maps ``id(original)`` to ``(original, placed)``; holding the original keeps its id
    from being reused while the loop runs."""
    if id(tensor) in moved:
        set_tensor(model, name, moved[id(tensor)][1])
        return
    if tensor.is_meta:
        if name not in record:
            raise _meta_error(name)
        set_tensor(model, name, record[name].materialize(device))
    elif tensor.device != device:
        set_tensor(model, name, tensor.detach().to(device))
    moved[id(tensor)] = (tensor, get_tensor(model, name))


def _matching(stored: StoredTensor, name: str, tensor: torch.Tensor) -> StoredTensor:
    """``stored`` (the peer's offload folder's ``name``), refused unless it has ``tensor``'s shape."""
    if tuple(stored.shape) != tuple(tensor.shape):
        raise ValueError(f"{stored.path} holds {name} with shape {tuple(stored.shape)}, the model's has "
                         f"{tuple(tensor.shape)}: that offload folder is another model's; pass an empty offload_dir")
    return stored


def _write_offloaded(model, to_write, offload_dir) -> dict[str, WeightSource]:
    """Write in-memory tensors placed on disk to one safetensors file in ``offload_dir``."""
    if offload_dir is None:
        first = next(iter(to_write.values()))[0]
        raise ValueError(
            f"device_map puts in-memory weights ({first}, ...) on disk: pass offload_dir= to write "
            "them to, or load from a safetensors checkpoint with load_checkpoint_and_dispatch"
        )
    os.makedirs(offload_dir, exist_ok=True)
    handle, path = tempfile.mkstemp(prefix="offload-", suffix=".safetensors", dir=offload_dir)
    os.close(handle)
    written = write_safetensors(path, {names[0]: get_tensor(model, names[0]).detach().cpu()
                                       for names in to_write.values()})
    return {name: WeightSource(written[names[0]]) for names in to_write.values() for name in names}


def _replace_with_placeholders(model, sources) -> None:
    """Offloaded names hold meta tensors, one per tensor object (tied names share it), so the
    memory of in-memory weights is let go."""
    placeholders: dict[int, torch.Tensor] = {}
    for name in sources:
        tensor = get_tensor(model, name)
        if id(tensor) not in placeholders:
            if not tensor.is_meta:
                set_tensor(model, name, torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"))
            placeholders[id(tensor)] = get_tensor(model, name)
        set_tensor(model, name, placeholders[id(tensor)])


def _hook(model, device_map, entries, sources, main, tiers, skip_keys, preload=frozenset()) -> list[ModuleHook]:
    """One ``ModuleHook`` per placed module (and per module owning placed tensors), plus the root;
    a module of a ``preload`` class brings its submodules' offloaded weights with its own."""
    devices = current_devices()
    modules = dict(model.named_modules(remove_duplicate=False))
    specs: dict[str, dict] = {"": {"device": main, "sources": {}, "move_inputs": True}}
    for entry, placed in device_map.items():
        device = main if placed in tiers else devices.torch_device(placed)
        if entry in modules:
            specs.setdefault(entry, {"sources": {}})
            specs[entry].update(device=device, move_inputs=True)
        else:
            owner = split_name(entry)[0]
            specs.setdefault(owner, {"device": device, "sources": {}, "move_inputs": False})
    for name, source in sources.items():
        entry = entries[name]
        owner = entry if entry in modules else split_name(entry)[0]
        local = name[len(owner) + 1:] if owner else name
        specs[owner]["sources"][local] = source
        specs[owner]["device"] = main
    _preload(modules, specs, preload, main)
    hooks = []
    for name, spec in specs.items():
        hooks.append(ModuleHook(
            modules[name], spec["device"], spec["sources"], spec.get("move_inputs", False),
            restore_output=name == "", skip_keys=tuple(skip_keys or ()),
        ))
    streamed = [h for h in hooks if any(isinstance(s.value, StoredTensor) for s in h.sources.values())]
    for hook, following in zip(streamed, streamed[1:], strict=False):
        hook.next_streamed = following
    return hooks


def _preload(modules: dict[str, nn.Module], specs: dict[str, dict], preload: set[str], main: torch.device) -> None:
    """Move the sources of every module inside one of a ``preload`` class (outermost first) into
    that module's spec, named relative to it."""
    taken: set[str] = set()
    for name in sorted((n for n, m in modules.items() if type(m).__name__ in preload), key=len):
        if any(name.startswith(t + ".") for t in taken):
            continue  # inside a module that already brings everything in
        taken.add(name)
        spec = specs.setdefault(name, {"device": main, "sources": {}, "move_inputs": False})
        for inner, inner_spec in specs.items():
            if inner.startswith(name + ".") and inner_spec["sources"]:
                local = inner[len(name) + 1:]
                spec["sources"].update({f"{local}.{t}": s for t, s in inner_spec.pop("sources").items()})
                inner_spec["sources"] = {}
        if spec["sources"]:
            spec["device"] = main


def _undispatching_mover(model: nn.Module, method: str):
    def move(*args, **kwargs):
        if method == "to":
            device = torch._C._nn._parse_to(*args, **kwargs)[0]
        elif method == "cuda":
            index = args[0] if args else kwargs.get("device")
            device = torch.device("cuda", index) if isinstance(index, int) else torch.device(index or "cuda")
        else:
            device = torch.device("cpu")
        undispatch_model(model, device)
        return getattr(model, method)(*args, **kwargs)

    move.__doc__ = f"Undispatch the model onto one device, then nn.Module.{method}."
    return move


def undispatch_model(model: nn.Module, device: DeviceKey | torch.device | None = None) -> nn.Module:
    """Turn a dispatched model back into an ordinary one, every tensor real, on one device.

    Hooks are removed, offloaded weights are loaded (tied ones stay tied), ``hf_device_map`` goes.

    Args:
        device: where the whole model goes; default: the main device it ran on.

    Returns:
        ``model`` itself.

    Raises:
        ValueError: the model is not dispatched.
    """
    state: _Dispatch | None = model.__dict__.get(DISPATCHED)
    if state is None:
        raise ValueError("this model is not dispatched (dispatch_model / load_checkpoint_and_dispatch)")
    target = state.main if device is None else torch.device(device)
    if target.type == "cuda" and target.index is None:
        target = torch.device("cuda", 0)
    state.restore(model, target)
    return model.to(target)


def state_dict_with_offloaded(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()``, its offloaded weights (meta placeholders while it is dispatched)
    read into CPU memory; tied names share one tensor. An undispatched model's own state dict."""
    state = model.state_dict()
    dispatch: _Dispatch | None = model.__dict__.get(DISPATCHED)
    if dispatch is None:
        return state
    done: set[str] = set()
    for name, source in dispatch.sources.items():
        if name in done:
            continue
        value = source.materialize(torch.device("cpu"))
        for other in dispatch.ties[name]:
            done.add(other)
            if other in state:
                state[other] = value
    return state
