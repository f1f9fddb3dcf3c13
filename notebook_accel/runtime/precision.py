"""Mixed precision: the autocast context, the gradient scaler, fp32 outputs.

Choices: ``"no"``, ``"bf16"`` (CPU, CUDA, XLA; no scaler) and ``"fp16"`` (with a
``GradScaler``).

fp16 on CPU: the peer silently trains in fp32 there. We instead do what was
asked: CPU autocast in float16 with torch's own CPU ``GradScaler``
(``torch.amp.GradScaler("cpu")``, torch >= 2.3). It works but is slow on most
CPUs; bf16 is the better choice on CPU. With an older torch a ``ValueError``
says so. A device kind refuses what it cannot run (XLA: fp16; use bf16).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from notebook_accel import contract
from notebook_accel.runtime.device import device_kind
from notebook_accel.runtime.ops import recursively_apply

PEER_MIXED_PRECISION = "ACCELERATE_MIXED_PRECISION"


def resolve_mixed_precision(value: str | None) -> str:
    """The mixed precision to use: ``value``, else our env variable, else the peer's, else ``"no"``.

    Raises:
        ValueError: for a value outside ``("no", "fp16", "bf16")``, naming where it came from.
    """
    for source, raw in (
        ("mixed_precision", value),
        (contract.MIXED_PRECISION_ENV, os.environ.get(contract.MIXED_PRECISION_ENV)),
        (PEER_MIXED_PRECISION, os.environ.get(PEER_MIXED_PRECISION)),
    ):
        if raw is None or raw == "":
            continue
        choice = str(raw).lower()
        if choice not in contract.MIXED_PRECISIONS:
            raise ValueError(
                f"{source}={raw!r} is not valid; choose one of {contract.MIXED_PRECISIONS}"
            )
        return choice
    return "no"


def autocast_dtype(mixed_precision: str) -> torch.dtype | None:
    """The autocast dtype for a mixed precision choice (``None`` for ``"no"``)."""
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mixed_precision)


def autocast_context(
    mixed_precision: str, device: torch.device, enabled: bool = True
) -> contextlib.AbstractContextManager[Any]:
    """A ``torch.autocast`` for ``device`` and ``mixed_precision``, or a null context."""
    dtype = autocast_dtype(mixed_precision)
    if dtype is None or not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_grad_scaler(mixed_precision: str, device: torch.device, **kwargs: Any) -> Any:
    """A ``GradScaler`` under fp16, else ``None``.

    Raises:
        ValueError: fp16 on a device without a scaler in this torch.
    """
    if mixed_precision != "fp16":
        return None
    device_kind(device).check_mixed_precision(mixed_precision)
    amp_scaler = getattr(torch.amp, "GradScaler", None)
    if amp_scaler is None:
        if device.type == "cuda":
            return torch.cuda.amp.GradScaler(**kwargs)
        raise ValueError(
            f"fp16 mixed precision on {device.type!r} needs torch >= 2.3 (torch.amp.GradScaler); "
            f"this is torch {torch.__version__}. Use mixed_precision='bf16' or 'no'."
        )
    return amp_scaler(device.type, **kwargs)


def unscale(scaler: Any, optimizers: list[torch.optim.Optimizer]) -> None:
    """Unscale the fp16 gradients of ``optimizers`` (once per step: a second call is a no-op)."""
    for optimizer in optimizers:
        try:
            scaler.unscale_(optimizer)
        except RuntimeError as exc:  # already unscaled for this step
            if "already been called" not in str(exc):
                raise


def convert_to_fp32(data: Any) -> Any:
    """Turn fp16/bf16 tensors in a nested output into float32 ones."""

    def _one(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor

    return recursively_apply(_one, data)


class AutocastForward:
    """A model's ``forward`` run under autocast, its outputs turned back to fp32.

    Installed on the model instance by ``prepare``; ``original`` is the forward it wraps.
    """

    def __init__(self, original: Callable[..., Any], mixed_precision: str, device: torch.device) -> None:
        self.original = original
        self.mixed_precision = mixed_precision
        self.device = device
        functools.update_wrapper(self, original)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with autocast_context(self.mixed_precision, self.device):
            out = self.original(*args, **kwargs)
        return convert_to_fp32(out)


def wrap_forward(model: torch.nn.Module, mixed_precision: str, device: torch.device) -> None:
    """Install an ``AutocastForward`` on ``model`` (no-op without mixed precision or if present)."""
    if autocast_dtype(mixed_precision) is None or isinstance(model.__dict__.get("forward"), AutocastForward):
        return
    model.forward = AutocastForward(model.forward, mixed_precision, device)


def unwrap_forward(model: torch.nn.Module) -> None:
    """Remove the ``AutocastForward`` that ``wrap_forward`` installed, if any; or a wrapper set by
    hand with the original kept in ``model._original_forward`` (the peer's convention)."""
    current = model.__dict__.get("forward")
    by_hand = model.__dict__.pop("_original_forward", None)
    if isinstance(current, AutocastForward):
        _restore_forward(model, current.original)
    elif by_hand is not None and current is not None:
        _restore_forward(model, by_hand)


def _restore_forward(model: torch.nn.Module, original: Any) -> None:
    bound_here = getattr(original, "__self__", None) is model
    if bound_here and getattr(original, "__func__", None) is type(model).forward:
        del model.forward  # the class's own forward again (picklable)
    else:
        model.forward = original
