"""Small helpers users of the peer import from ``accelerate.utils`` (re-exported by ``notebook_accel.utils``)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from notebook_accel._peer_paths import peer_logger
from notebook_accel.runtime.compilation import has_compiled_regions, is_compiled_module
from notebook_accel.runtime.ops import recursively_apply
from notebook_accel.runtime.precision import convert_to_fp32, unwrap_forward

logger = peer_logger(__name__)


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables (names upper-cased, values ``str``-ed) inside the block, then restore them.

    Example:
        >>> with patch_environment(master_port=29501):
        ...     os.environ["MASTER_PORT"]
        '29501'
    """
    saved = {}
    for key, value in kwargs.items():
        name = key.upper()
        saved[name] = os.environ.get(name)
        os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; the environment is restored afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


_FORBIDDEN_IN_ENV = (";", "\n", "<", ">", " ")


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    """``NAME=value\n`` lines for an environment file, leaving out (with a warning) each variable that is
    empty or holds a character a shell would read otherwise (``; < > space newline``)."""
    lines = []
    for key, value in current_env.items():
        text = f"{key}{value}"
        if key and value and not any(char in text for char in _FORBIDDEN_IN_ENV):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning(f"Skipping {key}={value}: empty, or holds one of {_FORBIDDEN_IN_ENV}")
    return lines


@contextlib.contextmanager
def _restored_accelerate_variables() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_")}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
            os.environ.pop(key)
        os.environ.update(saved)


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: the ``ACCELERATE_*`` variables a function (each ``test*`` method of a class and of its
    subclasses) sets are removed after it, changed ones restored; for tests that must not leak settings."""
    if not isinstance(func_or_cls, type):
        wrapped = _restored_accelerate_variables()(func_or_cls)
        wrapped._purges_environment = True
        return wrapped
    for name in dir(func_or_cls):
        method = getattr(func_or_cls, name)
        if name.startswith("test") and callable(method) and not hasattr(method, "_purges_environment"):
            setattr(func_or_cls, name, purge_accelerate_environment(method))
    func_or_cls.__init_subclass__ = classmethod(lambda cls, **kwargs: purge_accelerate_environment(cls))
    return func_or_cls


_PARALLEL = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)


def _strip_parallel(model: torch.nn.Module) -> torch.nn.Module:
    while isinstance(model, _PARALLEL):
        model = model.module
    return model


def _plain(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside every DDP / DataParallel / ``torch.compile`` layer (and regional copy)."""
    while True:
        if isinstance(model, _PARALLEL):
            model = model.module
        elif is_compiled_module(model):
            model = model._orig_mod
        elif "_orig_mod" in model.__dict__:  # a copy made by compile_regions
            model = model.__dict__["_orig_mod"]
        else:
            return model


def extract_model_from_parallel(
    model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True,
) -> torch.nn.Module:
    """The user's module inside ``DistributedDataParallel`` / ``DataParallel`` (and ``torch.compile``).

    Args:
        model: a prepared (possibly compiled, whole or by regions) model.
        keep_fp32_wrapper: keep the mixed-precision forward that ``prepare`` installed.
        keep_torch_compile: a compiled model comes back compiled: an ``OptimizedModule`` around
            the user's module (``model`` itself is left as it is), or the module with its compiled
            regions; otherwise the plain module, whose ``state_dict`` has no ``_orig_mod.`` keys.
    """
    plain = _plain(model)
    if not keep_fp32_wrapper:
        unwrap_forward(plain)
    if not keep_torch_compile:
        return plain
    kept = _strip_parallel(model)
    if is_compiled_module(kept) and kept._orig_mod is not plain:  # compiled around DDP
        return type(kept)(plain, kept.dynamo_ctx)
    return kept if is_compiled_module(kept) or has_compiled_regions(kept) else plain


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a forward so fp16/bf16 tensors in its output come back as float32."""

    @functools.wraps(model_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(model_forward(*args, **kwargs))

    return forward


def listify(data: Any) -> Any:
    """Tensors in a nested structure turned into (nested) Python lists / numbers."""
    return recursively_apply(lambda t: t.tolist(), data)


def _first_tensor(data: Any) -> torch.Tensor | None:
    if isinstance(data, torch.Tensor):
        return data
    items = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor in a nested structure (``None`` without tensors)."""
    tensor = _first_tensor(data)
    return None if tensor is None else tensor.device


def find_batch_size(data: Any) -> int:
    """The first dimension of the first tensor in a nested structure.

    Raises:
        TypeError: there is no tensor in ``data``.
    """
    tensor = _first_tensor(data)
    if tensor is None:
        raise TypeError(f"can only find the batch size of tensors, not of {type(data).__name__}")
    return tensor.shape[0]


_PLAIN = (str, bytes, int, float, bool, type(None))


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of same-shaped nested structures tensor by tensor along ``dim``.

    Lists of plain values (strings, numbers: ``[["a", "b"], ["c"]]``) are joined into one
    list; a single structure is returned as it is (as the peer does).

    Raises:
        TypeError: ``data`` is not a non-empty list of structures of tensors (or of plain values).
    """
    if not isinstance(data, (list, tuple)) or not data:
        raise TypeError(f"concatenate takes a non-empty list of tensor structures, not {data!r}")
    first = data[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(data), dim=dim)
    if len(data) == 1 and not isinstance(first, (list, tuple, Mapping)):
        return first
    if (isinstance(first, list) or (isinstance(first, tuple) and not hasattr(first, "_fields"))) and all(
            isinstance(d, type(first)) and all(isinstance(v, _PLAIN) for v in d) for d in data):
        return type(first)(value for d in data for value in d)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(concatenate([d[i] for d in data], dim) for i in range(len(first))))
    if isinstance(first, (list, tuple)):
        return type(first)(concatenate([d[i] for d in data], dim) for i in range(len(first)))
    if isinstance(first, Mapping):
        return type(first)({k: concatenate([d[k] for d in data], dim) for k in first})
    raise TypeError(f"concatenate: cannot concatenate objects of type {type(first).__name__}")


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Zero-pad tensors (nested) along ``dim`` from ``batch_size`` to the next multiple of ``num_processes``.

    So a batch can be split evenly before a collective; drop the padding afterwards.
    """
    target = -(-batch_size // num_processes) * num_processes

    def _pad(t: torch.Tensor) -> torch.Tensor:
        missing = target - t.shape[dim]
        if missing <= 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t, t.new_zeros(shape)], dim=dim)

    return recursively_apply(_pad, tensor)


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """The main process's ``tensor`` on every process's device (others pass ``None``).

    A collective: every process must call it.
    """
    from notebook_accel.runtime.ops import broadcast_object_list
    from notebook_accel.runtime.state import PartialState

    state = PartialState()
    sent = tensor.cpu() if state.is_main_process and tensor is not None else None
    received = broadcast_object_list([sent])[0]
    if received is None:
        raise ValueError("copy_tensor_to_devices: the main process passed no tensor")
    return received.to(state.device)


def wait_for_everyone() -> None:
    """Barrier across all processes (no-op for one process)."""
    from notebook_accel.runtime.state import PartialState

    PartialState().wait_for_everyone()


def get_model_tp_size(model: Any) -> int | None:
    """The tensor-parallel degree transformers recorded for ``model`` (``model.tp_size``, or since
    transformers 5 its ``config.distributed_config``'s ``tp_size``), or ``None``."""
    size = getattr(model, "tp_size", None)
    if size is not None:
        return size
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed, Mapping):
        return distributed.get("tp_size")
    return getattr(distributed, "tp_size", None)
