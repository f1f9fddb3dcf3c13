"""DeepSpeed helpers of the strategy (``notebook_accel.strategies.deepspeed.strategy``).

``import_deepspeed`` (with an install hint), ``fill_auto`` (the config's ``"auto"`` values
from the job), the notice when DeepSpeed compiles its ops, and ``DeepSpeedOptimizerWrapper``
(what ``prepare`` returns for the optimizer).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from notebook_accel.runtime.gradient_state import GradientState
from notebook_accel.runtime.optim import AcceleratedOptimizer
from notebook_accel.strategies.deepspeed.plugin import get_value, is_auto, set_value

OPS_NOTE = ("DeepSpeed is compiling its C++ ops for this machine ({ops}); the first time this takes "
            "30-60 s, later runs reuse the build")


def import_deepspeed() -> Any:
    """``deepspeed``, or an ImportError saying how to install it."""
    os.environ.setdefault("DS_BUILD_OPS", "0")  # never compile every op at import
    xpu = getattr(torch, "xpu", None)
    if not torch.cuda.is_available() and not (xpu is not None and xpu.is_available()):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # what it would detect, without its warning per rank
    try:
        import deepspeed
    except ImportError as err:
        raise ImportError("DeepSpeed is not installed: `pip install notebook_accel[deepspeed]` "
                          "(or `DS_BUILD_OPS=0 pip install deepspeed`)") from err
    return deepspeed


def fill_auto(config: dict[str, Any], *, micro_batch: int | None, accumulation: int, world_size: int,
              mixed_precision: str, model: torch.nn.Module) -> dict[str, Any]:
    """A copy of ``config`` with every ``"auto"`` value the job decides filled in.

    Args:
        micro_batch: the per-process batch size of the loader prepared with (or before) the
            model; ``None`` when there is none (then 1: DeepSpeed uses it only for its counters).
        accumulation: the Accelerator's gradient accumulation steps.
        world_size: number of processes.
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"``.
        model: the model (a ``config.hidden_size`` sizes ZeRO's buckets, as in the peer).

    Raises:
        ValueError: a config value that contradicts the job (naming both).
    """
    config = copy.deepcopy(config)
    if config.get("gradient_accumulation_steps", "auto") == "auto":
        config["gradient_accumulation_steps"] = accumulation
    elif config["gradient_accumulation_steps"] != accumulation:
        raise ValueError(f"the DeepSpeed config's gradient_accumulation_steps={config['gradient_accumulation_steps']} "
                         f"differs from the Accelerator's {accumulation}; set one of them (or 'auto')")
    if config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        config["train_micro_batch_size_per_gpu"] = micro_batch or 1
    expected = config["train_micro_batch_size_per_gpu"] * accumulation * world_size
    if config.get("train_batch_size", "auto") == "auto":
        config["train_batch_size"] = expected
    elif config["train_batch_size"] != expected:
        raise ValueError(f"the DeepSpeed config's train_batch_size={config['train_batch_size']} is not micro batch "
                         f"{config['train_micro_batch_size_per_gpu']} x accumulation {accumulation} x "
                         f"{world_size} processes = {expected}; set it to 'auto'")
    if config.get("gradient_clipping", "auto") == "auto":
        config["gradient_clipping"] = 0.0  # DeepSpeed's own default is 1.0: it would clip silently
    for section in ("optimizer", "scheduler"):
        if section in config:
            raise ValueError(f"the DeepSpeed config's {section!r} section is not supported: pass your torch "
                             f"{section} to accelerator.prepare() and remove the section")
    fill_precision(config, mixed_precision)
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    sizes = {"reduce_bucket_size": lambda h: h * h, "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
             "stage3_param_persistence_threshold": lambda h: 10 * h}
    for key, size in sizes.items():
        dotted = f"zero_optimization.{key}"
        if is_auto(config, dotted):
            if isinstance(hidden, int):
                set_value(config, dotted, size(hidden))
            else:  # DeepSpeed's default
                del config["zero_optimization"][key]
    gather = "zero_optimization.stage3_gather_16bit_weights_on_model_save"
    if is_auto(config, gather):
        set_value(config, gather, False)
    for kind in ("optimizer", "param"):  # pinned memory needs an accelerator
        entry = get_value(config, f"zero_optimization.offload_{kind}")
        if isinstance(entry, dict) and entry.get("device") not in (None, "none") and not torch.cuda.is_available():
            entry["pin_memory"] = False
    if get_value(config, "zero_optimization.offload_optimizer.device") not in (None, "none"):
        config.setdefault("zero_force_ds_cpu_optimizer", False)  # the user's torch optimizer steps on the CPU
    return config


def fill_precision(config: dict[str, Any], mixed_precision: str) -> None:
    for kind in ("fp16", "bf16"):
        section = config.get(kind)
        if not isinstance(section, dict):
            continue
        enabled = section.get("enabled", "auto")
        if enabled == "auto":
            section["enabled"] = mixed_precision == kind
        elif enabled and mixed_precision != kind:
            raise ValueError(f"the DeepSpeed config enables {kind} but the Accelerator's mixed_precision is "
                             f"{mixed_precision!r}; set mixed_precision={kind!r} or {kind}.enabled to 'auto'")
    if mixed_precision in ("fp16", "bf16"):
        config.setdefault(mixed_precision, {})["enabled"] = True


def restore_linear() -> None:
    """Undo the ``F.linear`` replacement a ZeRO-3 engine leaves in torch for the rest of the process."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    original = getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original


def announce_op_builds(deepspeed: Any, say: Callable[[str], None]) -> None:
    """Say in the cell that DeepSpeed compiles its CPU ops now, when they are not built yet."""
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return
    from torch.utils.cpp_extension import _get_build_directory

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return
    if not (Path(_get_build_directory(builder.NAME, verbose=False)) / f"{builder.NAME}.so").is_file():
        say(OPS_NOTE.format(ops=builder.NAME))


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The optimizer ``prepare`` returns under DeepSpeed: the engine steps it inside
    ``accelerator.backward``, so ``step`` and ``zero_grad`` do nothing; ``step_was_skipped``
    reports the engine's fp16 overflow skips."""

    def __init__(self, engine: Any, optimizer: torch.optim.Optimizer, gradient_state: GradientState) -> None:
        super().__init__(optimizer, gradient_state)
        self.engine = engine

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: the engine zeroes the gradients after its step."""

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        """Nothing to the weights: ``accelerator.backward`` ran the engine's step; at the end of an
        accumulation the step hooks run, as for any prepared optimizer (a snapshot's step count)."""
        if self.gradient_state.sync_gradients:
            self._stepped()

    @property
    def step_was_skipped(self) -> bool:
        return self.gradient_state.sync_gradients and not self.engine.was_step_applied()

    def state_dict(self) -> dict[str, Any]:
        return self.engine.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.engine.optimizer.load_state_dict(state_dict)
