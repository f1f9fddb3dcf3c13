"""Plain CPU tensors as their bytes: how a small tensor crosses between the kernel and the workers.

torch pickles a tensor through ``torch.save`` of its storage inside the pickle: here about 40 us
to write and 70 us to read a 1-element tensor, most of what a pool cell that assigns one costs
(its value comes back to the notebook). A plain dense CPU tensor travels instead as its storage's
bytes (one in-band buffer, pickle protocol 5) with its dtype, offset, size and stride, and is
read back without a copy: the same tensor as torch's pickling gives (each tensor with a copy of
its whole storage, a view's too), in a tenth of the time. Anything else takes torch's own way: a
subclass (a ``Parameter``), a tensor that requires grad, a quantized, conjugated, negated,
named, sparse or nested one, one with Python attributes or hooks, and one with an empty storage. Big tensors that the kernel sends to local workers go through shared
memory before this (``shared_tensors``).
"""

from __future__ import annotations

import pickle
import sys
from typing import Any


def reduce(obj: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """``obj``'s reduction as its storage's bytes when it is a plain CPU tensor, else None
    (pickle it as torch does)."""
    torch = sys.modules.get("torch")
    if torch is None or type(obj) is not torch.Tensor or not _plain(obj):
        return None
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    storage = obj.untyped_storage()
    if storage.nbytes() == 0:
        return None
    data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()  # a view: no copy
    return _rebuild, (pickle.PickleBuffer(data), obj.dtype, obj.storage_offset(), tuple(obj.shape),
                      obj.stride())


def _plain(tensor: Any) -> bool:
    return (tensor.device.type == "cpu" and tensor.layout is sys.modules["torch"].strided
            and not tensor.requires_grad
            and not tensor.is_quantized and not tensor.is_nested and not tensor.is_conj()
            and not tensor.is_neg() and not any(getattr(tensor, "names", ())) and not tensor._is_zerotensor()
            and tensor._backward_hooks is None and not tensor.__dict__)


def _rebuild(data: Any, dtype: Any, offset: int, size: tuple[int, ...],
             stride: tuple[int, ...]) -> Any:
    """The tensor :func:`reduce` describes, over ``data`` (the bytes pickle read; kept alive by it)."""
    import torch

    storage = torch.frombuffer(data, dtype=torch.uint8).untyped_storage()
    return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
