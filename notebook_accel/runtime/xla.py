"""The XLA device kind (``XlaDevice``, see ``runtime.device``) and what it does, through torch_xla.

Every function imports torch_xla only when called, so this module is importable
(and the rest of the package works) where torch_xla is not installed. It is the one
worker-side module outside ``strategies/xla.py`` that names torch_xla.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch

from notebook_accel.runtime.device import Placement, TorchDevice


def _import(module: str) -> Any:
    """Import a torch_xla module, with an install hint when torch_xla is missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        from notebook_accel.machine.tpu import install_hint

        raise ImportError(f"the XLA device needs torch_xla, which is not importable here ({exc}); "
                          f"on a TPU machine without it: {install_hint()}") from exc


def _xm() -> Any:
    return _import("torch_xla.core.xla_model")


def device() -> torch.device:
    """This process's (or thread's) XLA device; initialises the runtime."""
    return torch.device(_import("torch_xla").device())


def ranks() -> tuple[int, int, int]:
    """``(global ordinal, world size, local ordinal)`` of this XLA process."""
    xr = _import("torch_xla.runtime")
    return int(xr.global_ordinal()), int(xr.world_size()), int(xr.local_ordinal())


def devices_per_process() -> int:
    """XLA devices driven by this process (2 on TPU v2/v3: one thread each)."""
    return max(1, len(_xm().get_xla_supported_devices()))


def sync() -> None:
    """The step boundary: compile and run the graph traced so far (``torch_xla.sync``)."""
    sync_fn = getattr(_import("torch_xla"), "sync", None)
    if sync_fn is not None:
        sync_fn()
    else:  # torch_xla < 2.5
        _xm().mark_step()


class _Once:
    """An iterable over an existing iterator (torch_xla's loaders call ``iter`` on it once)."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self.iterator = iterator

    def __iter__(self) -> Iterator[Any]:
        return self.iterator

    def __len__(self) -> int:  # ParallelLoader asks; unknown here
        raise TypeError("length unknown")


def device_batches(batches: Iterable[Any], xla_device: torch.device) -> Iterator[Any]:
    """Batches moved to ``xla_device`` by torch_xla's parallel loader, in the background.

    The loader also marks the step boundary before each batch, so a loop over it
    needs no XLA calls.
    """
    pl = _import("torch_xla.distributed.parallel_loader")
    iterator = iter(batches)
    return iter(pl.MpDeviceLoader(_Once(iterator), xla_device))


def all_reduce(tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Sum (average, max, min: ``reduction``) ``tensor`` across the cores; a new tensor."""
    xm = _xm()
    if reduction in ("max", "min"):
        return xm.all_reduce(xm.REDUCE_MAX if reduction == "max" else xm.REDUCE_MIN, tensor)
    scale = 1.0 / ranks()[1] if reduction == "mean" else 1.0
    return xm.all_reduce(xm.REDUCE_SUM, tensor, scale=scale)


def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every core along dim 0 (0-dim tensors become 1-dim)."""
    if tensor.ndim == 0:
        tensor = tensor[None]
    return _xm().all_gather(tensor, dim=0)


def broadcast(tensor: torch.Tensor, from_process: int = 0) -> torch.Tensor:
    """``tensor`` as it is on core ``from_process`` (others' values are replaced in place)."""
    _, world, _ = ranks()
    if world == 1:
        return tensor
    ordinal = ranks()[0]
    mine = tensor if ordinal == from_process else torch.zeros_like(tensor)
    tensor.copy_(all_reduce(mine, "sum"))
    return tensor


def rendezvous(tag: str) -> None:
    """Barrier across the cores."""
    _xm().rendezvous(tag)


def to_cpu(data: Any) -> Any:
    """``data`` (nested lists, tuples, dicts) with every XLA tensor copied to the CPU.

    Runs the pending graph once for all tensors together (not once per tensor).
    """
    tensors: list[torch.Tensor] = []

    def collect(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.device.type == "xla":
                tensors.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)
        return value

    collect(data)
    if not tensors:
        return data
    convert = getattr(_xm(), "_maybe_convert_to_cpu", None)  # one graph run for all tensors
    moved = convert(tensors) if convert is not None else [t.cpu() for t in tensors]
    cpu = dict(zip(map(id, tensors), moved, strict=True))

    def rebuild(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return cpu.get(id(value), value)
        if isinstance(value, dict):
            return type(value)({k: rebuild(v) for k, v in value.items()})
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(rebuild(v) for v in value))
        if isinstance(value, (list, tuple)):
            return type(value)(rebuild(v) for v in value)
        return value

    return rebuild(data)


def rng_state() -> int:
    """The XLA random generator's seed state of this device."""
    return int(_xm().get_rng_state())


def set_rng_state(seed: int) -> None:
    """Restore what :func:`rng_state` returned."""
    _xm().set_rng_state(int(seed))


def memory_used(xla_device: torch.device) -> int | None:
    """Bytes in use on ``xla_device`` (``xm.get_memory_info``); None before this process has started
    the XLA runtime (asking would start it, and take the TPU from the cores) or where PJRT keeps no
    figure (its CPU client)."""
    torch_xla = sys.modules.get("torch_xla")
    if torch_xla is None or not torch_xla._XLAC._xla_runtime_is_initialized():
        return None
    try:
        used = _xm().get_memory_info(xla_device).get("bytes_used")
    except RuntimeError:  # UNIMPLEMENTED: GetAllocatorStats is not supported
        return None
    return None if used is None else int(used)


def move_model(model: torch.nn.Module, xla_device: torch.device) -> dict[int, torch.nn.Parameter]:
    """Move ``model`` to ``xla_device``; returns ``id(old parameter) -> new parameter``.

    Unlike CUDA, moving to an XLA device creates new ``Parameter`` objects, so an
    optimizer built before the move still holds the CPU ones: pass the mapping to
    :func:`rebind_parameters`.
    """
    old = list(model.parameters())
    model.to(xla_device)
    return {id(before): after for before, after in zip(old, model.parameters(), strict=True)
            if before is not after}


def rebind_parameters(optimizer: torch.optim.Optimizer, moved: dict[int, torch.nn.Parameter]) -> None:
    """Point ``optimizer``'s parameter groups (and state) at the moved parameters."""
    if not moved:
        return
    for group in optimizer.param_groups:
        group["params"] = [moved.get(id(p), p) for p in group["params"]]
    state = optimizer.state
    for old_id, new in moved.items():
        for param in list(state):
            if id(param) == old_id:
                state[new] = state.pop(param)


def gather_object(obj: Any, tag: str = "notebook_accel.gather_object") -> list[Any]:
    """Every core's ``obj`` (picklable), in ordinal order.

    torch_xla's process group accepts only XLA tensors, so torch's object
    collectives (CPU byte tensors) fail there; this goes through ``xm.rendezvous``,
    which exchanges bytes between all cores.
    """
    import pickle

    payloads = _xm().rendezvous(tag, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    return [pickle.loads(bytes(p)) for p in payloads]


def broadcast_object_list(objects: list[Any], from_process: int = 0) -> list[Any]:
    """Overwrite the items of ``objects`` in place with those of core ``from_process``."""
    objects[:] = gather_object(list(objects), "notebook_accel.broadcast_object")[from_process]
    return objects


def on_device(tensor: torch.Tensor, xla_device: torch.device) -> torch.Tensor:
    """``tensor`` where torch_xla's collectives accept it (they refuse CPU tensors)."""
    return tensor if tensor.device.type == "xla" else tensor.to(xla_device)


class GradientReducer:
    """Averages an optimizer's gradients across the cores, once per optimizer step.

    Used as ``AcceleratedOptimizer``'s ``before_step``; ``clip_grad_norm_`` calls
    :meth:`reduce_now` first so it clips the averaged gradients (as with DDP), and
    the step then does not average them again.
    """

    def __init__(self) -> None:
        self.reduced = False

    def reduce_now(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the gradients now (before clipping); the next step will not repeat it."""
        if not self.reduced:
            _xm().reduce_gradients(optimizer)
            self.reduced = True

    def __call__(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.reduced:
            _xm().reduce_gradients(optimizer)
        self.reduced = False


class XlaDevice(TorchDevice):
    """The XLA kind (``runtime.device``): TPU cores through torch_xla, which owns its group's threads."""

    torch_native: ClassVar[bool] = False
    backend_fixed: ClassVar[bool] = True
    moves_batches: ClassVar[bool] = True

    def locate(self, device_type: str, cpu: bool) -> Placement:
        """Ranks and device from torch_xla's runtime (initialises it)."""
        process_index, num_processes, local_process_index = ranks()
        return Placement(process_index, num_processes, local_process_index, device())

    def meeting(self, init_method: str | None) -> str:
        _import("torch_xla.distributed.xla_backend")  # registers the backend
        return "xla://"

    def register_teardown(self) -> None:
        """Nothing: torch_xla's own runtime owns its threads."""

    def settle(self) -> None:
        """Nothing: torch_xla's own runtime owns its threads."""

    def barrier(self) -> None:
        rendezvous("notebook_accel.wait_for_everyone")

    def collective_device(self, device: torch.device | None = None) -> torch.device:
        return device if device is not None else torch.device(_import("torch_xla").device())

    def all_gather(self, tensor: torch.Tensor, world_size: int) -> torch.Tensor:
        return all_gather(tensor)

    def gathers_uneven(self) -> bool:
        return False

    def all_reduce(self, tensor: torch.Tensor, reduction: str, world_size: int) -> torch.Tensor:
        return all_reduce(tensor, reduction)

    def broadcast(self, tensor: torch.Tensor, from_process: int) -> torch.Tensor:
        return broadcast(tensor, from_process)

    def gather_object(self, obj: Any, world_size: int) -> list[Any]:
        """Through ``xm.rendezvous``: torch_xla's group takes XLA tensors only."""
        return gather_object(obj)

    def broadcast_object_list(self, objects: list[Any], from_process: int) -> list[Any]:
        return broadcast_object_list(objects, from_process)

    def checks_shapes(self) -> bool:
        return False  # torch_xla's group has no object collectives

    def broadcast_rng_state(self, state: torch.Tensor) -> torch.Tensor:
        return broadcast_object_list([state])[0]

    def rng_state(self) -> dict[str, Any]:
        return {**super().rng_state(), "xm_seed": rng_state()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        super().set_rng_state(state)
        if state.get("xm_seed") is not None:
            set_rng_state(state["xm_seed"])

    def synchronize_rng(self, broadcast_object_list: Any) -> None:
        set_rng_state(broadcast_object_list([rng_state()])[0])

    def to_cpu(self, obj: Any) -> Any:
        return to_cpu(obj)

    def keeps_memory_figure(self, device: torch.device) -> bool:
        return True

    def memory_reserved(self, device: torch.device) -> int | None:
        return memory_used(device)

    def has_storage(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type != "xla"

    def batches(self, batches: Any, device: torch.device) -> Any:
        """Moved by torch_xla's parallel loader, which also marks each step boundary."""
        return device_batches(batches, device)

    def check_mixed_precision(self, mixed_precision: str) -> None:
        if mixed_precision == "fp16":
            raise ValueError("fp16 mixed precision is not supported on XLA devices; use mixed_precision='bf16'")

    def refuse(self, strategy: str, alternatives: str = "") -> None:
        raise ValueError(f"{strategy} does not run on XLA devices; on TPU use the default data parallelism"
                         f"{alternatives}")
