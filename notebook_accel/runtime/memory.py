"""Device memory in a training loop: free it, and retry with a smaller batch when it runs out
(the peer's ``accelerate.utils.memory``)."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

_OUT_OF_MEMORY = (
    " out of memory.",  # CUDA, HIP, XPU
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Empty the accelerator's cache of freed blocks (after ``gc.collect()`` when asked)."""
    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.empty_cache()
    elif torch.backends.mps.is_available():
        torch.mps.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop this call's references to ``objects``, collect garbage and empty the device cache.

    Returns ``None`` for each object; assign it back: ``a, b = release_memory(a, b)``.
    """
    released: list[None] = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True when ``exception`` is an out-of-memory error (CUDA, XPU, MPS, HPU, CPU) or cuDNN's
    unsupported-size error: a smaller batch may fit."""
    return (isinstance(exception, RuntimeError) and len(exception.args) == 1
            and any(text in str(exception.args[0]) for text in _OUT_OF_MEMORY))


def find_executable_batch_size(function: Callable[..., Any] | None = None,
                               starting_batch_size: int = 128,
                               reduce_batch_size_fn: Callable[[], int] | None = None) -> Any:
    """Decorate ``function(batch_size, ...)``: call it with ``starting_batch_size``, and after an
    out-of-memory error free memory and call it again with a smaller one (0.9 times the last,
    as the peer's; ``reduce_batch_size_fn()`` returns the next instead).

    The batch size found is kept for later calls. Example::

        @find_executable_batch_size(starting_batch_size=64)
        def train(batch_size, model):
            ...
        train(model)          # no batch size: the decorator passes it

    Raises:
        TypeError: the caller passed the batch size itself.
        RuntimeError: the batch size reached zero (or ``function``'s own errors, unchanged).
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    batch_size = starting_batch_size

    def smaller() -> int:
        return int(batch_size * 0.9)

    reduce = reduce_batch_size_fn or smaller

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            given = ", ".join(f"{name}={value}" for name, value in zip(params[1:], args[1:], strict=False))
            raise TypeError(f"Batch size was passed into `{function.__name__}` as the first argument when "
                            f"called. Remove it: the decorator passes it: `{function.__name__}({given})`")
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
            clear_device_cache(garbage_collection=True)  # after the except: the failed frames are gone
            batch_size = reduce()

    return decorator
