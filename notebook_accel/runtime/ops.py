"""Collectives on nested structures of tensors (lists, tuples, dicts, namedtuples).

Every function works on the default ``torch.distributed`` group when one exists
with more than one process, and is an identity (or a copy) otherwise, so the same
code runs in one plain process. A tensor's device kind (``runtime.device``) runs its
collectives; objects go through the kind of the default group.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from notebook_accel.runtime import op_checks
from notebook_accel.runtime.device import device_kind, group_kind

REDUCTIONS = ("sum", "mean", "max", "min", "none")


def world_size() -> int:
    """Number of processes in the default group (1 when there is none)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class CannotPadNestedTensorWarning(UserWarning):
    """``pad_across_processes`` was given a nested tensor, which it returns as it is."""


def is_torch_tensor(data: Any) -> bool:
    """Whether ``data`` is a tensor (the default leaf test of ``recursively_apply``)."""
    return isinstance(data, torch.Tensor)


def is_namedtuple(data: Any) -> bool:
    """Whether ``data`` is a namedtuple (``collections.namedtuple`` or ``typing.NamedTuple``, subclasses too)."""
    return isinstance(data, tuple) and hasattr(data, "_asdict") and hasattr(data, "_fields")


def honor_type(obj: Any, generator: Any) -> Any:
    """``generator``'s items in a container of ``obj``'s type (a namedtuple takes them as fields)."""
    return type(obj)(*generator) if is_namedtuple(obj) else type(obj)(generator)


def recursively_apply(
    func: Callable[..., Any], data: Any, *args: Any, test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False, **kwargs: Any,
) -> Any:
    """Apply ``func(leaf, *args, **kwargs)`` to every leaf of ``data`` that passes ``test_type``
    (a tensor by default), keeping the structure (lists, tuples, namedtuples, mappings).

    Raises:
        TypeError: when ``error_on_other_type`` and a leaf fails ``test_type`` (the peer's words).
    """
    if test_type(data):
        return func(data, *args, **kwargs)
    if isinstance(data, (list, tuple)):
        return honor_type(data, (recursively_apply(func, x, *args, test_type=test_type,
                                                   error_on_other_type=error_on_other_type, **kwargs) for x in data))
    if isinstance(data, Mapping):
        return type(data)({k: recursively_apply(func, v, *args, test_type=test_type,
                                                error_on_other_type=error_on_other_type, **kwargs)
                           for k, v in data.items()})
    if error_on_other_type:
        raise TypeError(
            f"Unsupported types ({type(data)}) passed to `{getattr(func, '__name__', func)}`. Only nested "
            f"list/tuple/dicts of objects that are valid for `{getattr(test_type, '__name__', test_type)}` "
            "should be passed."
        )
    return data


def is_tensor_structure(data: Any) -> bool:
    """Whether every leaf of ``data`` is a tensor."""
    try:
        recursively_apply(lambda t: t, data, error_on_other_type=True)
    except TypeError:
        return False
    return True


def _verify(name: str, data: Any, skip_dim: int | None = None) -> None:
    """In debug mode (``op_checks``), raise unless every process passes tensors of the same shapes."""
    if op_checks.debug_enabled():
        op_checks.verify_shapes(name, recursively_apply(lambda t: op_checks.shape_of(t, skip_dim), data))


def send_to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor (or object with a ``.to`` method) in ``data`` to ``device``."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if isinstance(data, (list, tuple)):
        moved = [send_to_device(x, device, non_blocking) for x in data]
        return type(data)(*moved) if hasattr(data, "_fields") else type(data)(moved)
    if isinstance(data, Mapping):
        return type(data)({k: send_to_device(v, device, non_blocking) for k, v in data.items()})
    if hasattr(data, "to"):
        try:
            return data.to(device, non_blocking=non_blocking)
        except TypeError:
            return data.to(device)
    return data


def _all_gather_sizes(tensor: torch.Tensor, dim: int) -> list[int]:
    size = torch.tensor([tensor.shape[dim]], device=tensor.device, dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(world_size())]
    dist.all_gather(sizes, size)
    return [int(s.item()) for s in sizes]


def _pad(tensor: torch.Tensor, dim: int, length: int, pad_index: Any, pad_first: bool) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    filler = tensor.new_full(shape, pad_index)
    return torch.cat([filler, tensor] if pad_first else [tensor, filler], dim=dim)


def _gather_one(tensor: torch.Tensor, uneven: bool) -> torch.Tensor:
    if tensor.ndim == 0:
        tensor = tensor[None]
    kind = device_kind(tensor.device)
    if not (uneven and kind.gathers_uneven()):  # XLA's: shapes must match
        return kind.all_gather(tensor, world_size())
    sizes = _all_gather_sizes(tensor, 0)
    out = kind.all_gather(_pad(tensor, 0, max(sizes), 0, False), world_size())
    if not max(sizes):
        return out
    return torch.cat([chunk[:n] for chunk, n in zip(out.split(max(sizes)), sizes, strict=True)], dim=0)


def gather(data: Any, uneven: bool = False) -> Any:
    """Gather tensors from every process, concatenated along the first dimension.

    Args:
        data: a tensor or a nested structure of tensors; 0-dim tensors become 1-dim.
        uneven: allow first dimensions that differ between processes (one more,
            small collective per tensor; not on XLA). Otherwise shapes must match, as in the peer.

    Returns:
        The same structure, each tensor holding rank 0's rows, then rank 1's, ...
    """
    if world_size() == 1:
        return recursively_apply(lambda t: t[None] if t.ndim == 0 else t, data, error_on_other_type=True)
    _verify("gather", data, skip_dim=0 if uneven else None)
    return recursively_apply(lambda t: _gather_one(t, uneven), data, error_on_other_type=True)


def gather_for_metrics(data: Any, use_gather_object: bool = False, remainder: int = 0) -> Any:
    """``gather`` (``gather_object`` for objects), keeping the first ``remainder`` rows when above 0:
    the last batch's without the duplicates that ``even_batches`` added."""
    use_object = use_gather_object or not is_tensor_structure(data)
    out = gather_object(data) if use_object else gather(data, uneven=True)
    if remainder <= 0:
        return out
    return out[:remainder] if use_object else recursively_apply(lambda t: t[:remainder], out)


def gather_object(obj: Any) -> list[Any]:
    """Gather picklable objects from every process.

    A list (or tuple) from each process is flattened into one list, rank by rank;
    any other object gives a list of one entry per process.
    """
    flatten = isinstance(obj, (list, tuple))
    if world_size() == 1:
        return list(obj) if flatten else [obj]
    out = group_kind().gather_object(obj, world_size())
    if flatten:
        return [x for part in out for x in part]
    return out


def reduce(data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """All-reduce tensors across processes, returning new tensors.

    Args:
        data: a tensor or nested structure of tensors.
        reduction: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` (element-wise over the
            processes) or ``"none"``.
        scale: factor applied to the result.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not valid; choose one of {REDUCTIONS}")
    n = world_size()
    if n > 1 and reduction != "none":
        _verify("reduce", data)

    def _one(tensor: torch.Tensor) -> torch.Tensor:
        distributed = n > 1 and reduction != "none"
        out = device_kind(tensor.device).all_reduce(tensor, reduction, n) if distributed else tensor.clone()
        if scale != 1.0:
            out *= scale
        return out

    return recursively_apply(_one, data, error_on_other_type=True)


def broadcast(data: Any, from_process: int = 0) -> Any:
    """Overwrite tensors in place with those of ``from_process``; returns ``data``."""
    if world_size() == 1:
        return data
    _verify("broadcast", data)

    def _one(tensor: torch.Tensor) -> torch.Tensor:
        return device_kind(tensor.device).broadcast(tensor, from_process)

    return recursively_apply(_one, data, error_on_other_type=True)


def broadcast_object_list(objects: list[Any], from_process: int = 0) -> list[Any]:
    """Overwrite the items of ``objects`` in place with those of ``from_process``."""
    if world_size() > 1:
        return group_kind().broadcast_object_list(objects, from_process)
    return objects


def pad_across_processes(data: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False) -> Any:
    """Pad tensors along ``dim`` to the largest size found on any process.

    Args:
        data: a tensor or nested structure of tensors.
        dim: the dimension to pad.
        pad_index: the fill value.
        pad_first: pad at the start instead of the end.

    A nested tensor is returned as it is, with a ``CannotPadNestedTensorWarning`` (as the peer).
    """
    distributed = world_size() > 1
    if distributed:
        _verify("pad_across_processes", data, skip_dim=dim)

    def _one(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_nested:
            warnings.warn("pad_across_processes: a nested tensor cannot be padded; it is returned as it is",
                          CannotPadNestedTensorWarning, stacklevel=4)
            return tensor
        if not distributed or dim >= tensor.ndim or dim < -tensor.ndim:
            return tensor
        return _pad(tensor, dim, max(_all_gather_sizes(tensor, dim)), pad_index, pad_first)

    return recursively_apply(_one, data, error_on_other_type=True)
