"""``check_collectives``: before each collective the ranks compare what they are about to call.

A rank that calls ``broadcast`` where its peers call ``all_reduce``, or passes another shape,
hangs the job (or, worse, reduces the wrong bytes). With the launch option
``check_collectives=True`` (``NOTEBOOK_ACCEL_CHECK_COLLECTIVES=1`` in the workers), every
``torch.distributed`` collective called from Python (the user's own, ours, a library's)
first all-gathers a fixed-size descriptor on the same group: the operation, its root, and
the first tensor's dtype and shape. If the ranks differ, each raises
:class:`~notebook_accel.runtime.op_checks.DistributedOperationException` on its own line,
with what every rank passed, instead of entering the collective. A rank that never comes
still hangs the others, in the descriptor's exchange: the hang watch names it.

The peer's debug mode (``runtime/op_checks``) checks shapes of its own operations only;
this checks every collective, and the operation too. DDP's gradient reductions run in C++
and are not checked (they are alike on every rank by construction). It costs one small
collective per collective: ``benchmarks/flight_recorder.py`` says how much.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from notebook_accel.runtime.op_checks import DistributedOperationException

# operation -> (its tensor's parameter, its root's parameter): what must agree besides the op
_CHECKED: dict[str, tuple[str | None, str | None]] = {
    "all_reduce": ("tensor", None), "broadcast": ("tensor", "src"), "reduce": ("tensor", "dst"),
    "all_gather": ("tensor", None), "all_gather_into_tensor": ("input_tensor", None),
    "reduce_scatter": ("output", None), "reduce_scatter_tensor": ("input", None),
    "all_to_all": (None, None), "all_to_all_single": (None, None),  # uneven splits are valid
    "gather": ("tensor", "dst"), "scatter": ("tensor", "src"), "barrier": (None, None),
    "all_gather_object": (None, None), "broadcast_object_list": (None, "src"),
    "gather_object": (None, "dst"), "scatter_object_list": (None, "src"),
}
_OPS = tuple(_CHECKED)
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_DIMS = 8  # dimensions a descriptor holds (a tensor of more compares its first 8 and its rank)
_SIZE = 5 + _DIMS  # op, root, dtype, rank (dimensions), has a tensor; then the dimensions
_RANKS_LISTED = 12
_inside = threading.local()  # a checked collective that calls others (all_gather_object)
_originals: dict[str, Callable[..., Any]] = {}


def install() -> None:
    """Check every collective of ``torch.distributed`` from now on, in this process (again:
    nothing more)."""
    if _originals:
        return
    c10d = dist.distributed_c10d
    for name in _OPS:
        original = getattr(c10d, name)
        _originals[name] = original
        checked = _checked(name, original)
        setattr(c10d, name, checked)  # the module's own calls (all_gather_object's) too
        setattr(dist, name, checked)


def _checked(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)
    tensor_param, root_param = _CHECKED[name]

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # the error reads from the caller's line  # noqa: F841
        if getattr(_inside, "depth", 0):
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs).arguments
        group = bound.get("group")
        if dist.get_world_size(group) > 1:
            tensor = bound.get(tensor_param) if tensor_param else None
            root = bound.get(root_param) if root_param else None
            _agree(name, group, _descriptor(name, tensor, root), tensor)
        _inside.depth = 1
        try:
            return original(*args, **kwargs)
        finally:
            _inside.depth = 0

    return collective


def _descriptor(name: str, tensor: Any, root: Any) -> list[int]:
    """The fixed-size description of a call that every rank must make alike."""
    row = [_OPS.index(name), -1 if root is None else int(root), -1, -1, 0] + [-1] * _DIMS
    if isinstance(tensor, torch.Tensor):
        dtype = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else len(_DTYPES)
        row[2:5] = [dtype, tensor.dim(), 1]
        for index, size in enumerate(tensor.shape[:_DIMS]):
            row[5 + index] = int(size)
    return row


def _agree(name: str, group: Any, row: list[int], tensor: Any) -> None:
    """All-gather ``row`` on ``group`` and raise, on every rank, unless all are alike."""
    __tracebackhide__ = True  # noqa: F841
    device = _device(group, tensor)
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    _inside.depth = 1
    try:
        _originals["all_gather"](everyone, mine, group=group)
    finally:
        _inside.depth = 0
    rows = [tuple(t.tolist()) for t in everyone]
    if all(other == rows[0] for other in rows):
        return
    raise DistributedOperationException(_table(name, group, rows))


def _device(group: Any, tensor: Any) -> torch.device:
    if isinstance(tensor, torch.Tensor):
        return tensor.device
    backend = str(dist.get_backend(group))
    if "nccl" in backend and "gloo" not in backend:  # a group of GPUs only
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _table(name: str, group: Any, rows: list[tuple[int, ...]]) -> str:
    """``check_collectives: the ranks called different collectives ... rank 0: ...`` (ranks
    alike on one line; the group's ranks as the group numbers them)."""
    me = dist.get_rank(group)
    alike: dict[tuple[int, ...], list[int]] = {}
    for rank, row in enumerate(rows):
        alike.setdefault(row, []).append(rank)
    ops = {row[0] for row in rows}
    what = "different collectives" if len(ops) > 1 else f"{name} with different arguments"
    group_name = "the default group" if group is None or group is dist.group.WORLD else "a group"
    lines = [f"check_collectives: the ranks of {group_name} called {what} "
             f"(this is rank {me}):"]
    for row, ranks in sorted(alike.items(), key=lambda item: item[1][0]):
        listed = ", ".join(str(r) for r in ranks[:_RANKS_LISTED])
        more = f" and {len(ranks) - _RANKS_LISTED} more" if len(ranks) > _RANKS_LISTED else ""
        lines.append(f"  rank{'s' if len(ranks) > 1 else ''} {listed}{more}: {_call_text(row)}")
    lines.append("every rank must call the same collectives, with the same dtypes and shapes, "
                 "in the same order")
    return "\n".join(lines)


def _call_text(row: tuple[int, ...]) -> str:
    """``broadcast(float32[10], src=0)``."""
    op, root, dtype, dims, has_tensor = row[:5]
    name = _OPS[op]
    parts = []
    if has_tensor:
        kind = str(_DTYPES[dtype]).replace("torch.", "") if dtype < len(_DTYPES) else "other"
        shape = ",".join(str(size) for size in row[5:5 + min(dims, _DIMS)])
        parts.append(f"{kind}[{shape}{',...' if dims > _DIMS else ''}]")
    if root >= 0:
        parts.append(f"{_CHECKED[name][1]}={root}")
    return f"{name}({', '.join(parts)})"
