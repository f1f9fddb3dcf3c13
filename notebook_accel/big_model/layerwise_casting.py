"""Layer-wise casting: weights stored in a small dtype (fp8, fp16) and cast up to the compute dtype
only while their layer runs (the peer's ``attach_layerwise_casting_hooks``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import nn

from notebook_accel.big_model.model_hooks import ModelHook, add_hook_to_module

# the layers whose weights are cast (norms and the like keep theirs)
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear,
)


class LayerwiseCastingHook(ModelHook):
    """The module in ``storage_dtype``, cast to ``compute_dtype`` for its forward."""

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        self.storage_dtype, self.compute_dtype, self.non_blocking = storage_dtype, compute_dtype, non_blocking

    def init_hook(self, module):
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    def pre_forward(self, module, *args, **kwargs):
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module, output):
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output

    def forward_failed(self, module):
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)


def attach_layerwise_casting_hooks(module: nn.Module, storage_dtype: torch.dtype, compute_dtype: torch.dtype,
                                   skip_modules_pattern: str | Sequence[str] | None = None,
                                   skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
                                   non_blocking: bool = False, _prefix: str = "") -> None:
    """A ``LayerwiseCastingHook`` on every supported layer (``SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING``)
    inside ``module``, except those whose name matches a ``skip_modules_pattern`` (``re.search``) or
    whose class is one of ``skip_modules_classes`` (with everything inside them)."""
    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else skip_modules_pattern or ()
    if (skip_modules_classes and isinstance(module, skip_modules_classes)) or any(
            re.search(pattern, _prefix) for pattern in patterns):
        return
    if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
        add_hook_to_module(module, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True)
        return
    for name, child in module.named_children():
        attach_layerwise_casting_hooks(child, storage_dtype, compute_dtype, patterns, skip_modules_classes,
                                       non_blocking, f"{_prefix}.{name}" if _prefix else name)
