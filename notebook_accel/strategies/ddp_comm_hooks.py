"""DDP communication hooks (``DistributedDataParallelKwargs(comm_hook=..., comm_wrapper=...)``):
how DDP all-reduces gradients, registered on the wrapped model."""

from __future__ import annotations

from typing import Any

from torch.nn.parallel import DistributedDataParallel


def register_comm_hook(model: DistributedDataParallel, spec: tuple[str, str, dict]) -> None:
    """Register the hook ``spec`` names (``(hook, wrapper, PowerSGD options)``) on ``model``.

    Raises:
        ValueError: a wrapper without a hook, or a hook or wrapper that is not one of the choices.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hooks: dict[str, Any] = {
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
        "power_sgd": powerSGD_hook.powerSGD_hook,
        "batched_power_sgd": powerSGD_hook.batched_powerSGD_hook,
    }
    wrappers = {"fp16": default_hooks.fp16_compress_wrapper, "bf16": default_hooks.bf16_compress_wrapper}
    name, wrapper, options = spec
    if name == "no":
        if wrapper != "no":
            raise ValueError(f"comm_wrapper={wrapper!r} wraps a comm_hook; none was given")
        return
    if name not in hooks or wrapper not in ("no", *wrappers):
        raise ValueError(f"comm_hook={name!r}, comm_wrapper={wrapper!r}: choose a hook from "
                         f"{sorted(hooks)} and a wrapper from {['no', *wrappers]}")
    hook = hooks[name] if wrapper == "no" else wrappers[wrapper](hooks[name])
    state = powerSGD_hook.PowerSGDState(None, **options) if "power_sgd" in name else None
    model.register_comm_hook(state=state, hook=hook)
