"""Build models without allocating their weights: ``init_empty_weights`` / ``init_on_device``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool = False) -> Iterator[None]:
    """Create every parameter (and, with ``include_buffers``, every buffer) of modules built inside
    the block directly on ``device``.

    Args:
        device: where new parameters go (``"meta"`` allocates nothing).
        include_buffers: make every tensor built inside the block on ``device`` (buffers and
            ``torch.empty``, ``torch.zeros``... alike), through torch's device context.

    Example::

        with init_on_device("meta"):
            model = MyModel()          # every parameter is a meta tensor
    """
    device = torch.device(device)
    if include_buffers:  # every tensor made inside: torch's own device context, nothing patched
        with device:
            yield
        return
    register_parameter = nn.Module.register_parameter

    def place_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register_parameter(module, name, param)
        if param is not None and param.device != device:
            moved = type(param)(param.to(device), requires_grad=param.requires_grad)
            moved.__dict__.update(param.__dict__)
            module._parameters[name] = moved

    try:
        nn.Module.register_parameter = place_parameter
        yield
    finally:
        nn.Module.register_parameter = register_parameter


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build modules with their parameters on the meta device: no memory, any size.

    Buffers stay real (they are small and often not in the checkpoint) unless
    ``include_buffers=True``. Load real weights afterwards with ``load_checkpoint_and_dispatch``.

    Example::

        with init_empty_weights():
            model = MyModel()
        model = load_checkpoint_and_dispatch(model, "ckpt/", device_map="auto")
    """
    with init_on_device("meta", include_buffers=include_buffers):
        yield
