"""``DeepSpeedRuntime``: what an ``Accelerator`` does differently when it trains through DeepSpeed.

The Accelerator keeps one of these when it has a DeepSpeed plugin (one process gets a
one-process group: DeepSpeed needs one). ``prepare`` hands it the model and optimizer of the call (they go into
``deepspeed.initialize`` together); the user gets the engine (an ``nn.Module``: call it,
``.train()``, ``.parameters()``) and a ``DeepSpeedOptimizerWrapper``. The loop stays as it
is: ``accelerator.backward(loss)`` runs the engine's backward *and* its step (an
optimizer step only at an accumulation boundary, clipping inside it, as in the peer);
``optimizer.step()`` / ``zero_grad()`` are then no-ops, and schedulers keep the
Accelerator's semantics (they are not given to the engine). ``"auto"`` config values
are filled from the job (``fill_auto``) just before the engine is made.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from notebook_accel.deepspeed_zero.plugin import DeepSpeedPlugin, get_value, is_auto, set_value
from notebook_accel.fsdp.state_dict import meta_skeleton, module_from_weights
from notebook_accel.gradient_state import GradientState
from notebook_accel.optim import AcceleratedOptimizer
from notebook_accel.state import ensure_one_process_group

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
    _fill_precision(config, mixed_precision)
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


def _fill_precision(config: dict[str, Any], mixed_precision: str) -> None:
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


def _restore_linear() -> None:
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
        """Nothing: ``accelerator.backward`` ran the engine's step."""

    @property
    def step_was_skipped(self) -> bool:
        return self.gradient_state.sync_gradients and not self.engine.was_step_applied()

    def state_dict(self) -> dict[str, Any]:
        return self.engine.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.engine.optimizer.load_state_dict(state_dict)


class DeepSpeedRuntime:
    """DeepSpeed behaviour for one Accelerator.

    Args:
        plugin: the validated plugin.
        mixed_precision: the Accelerator's choice.
        gradient_state: the Accelerator's (accumulation steps come from it, or go to it
            when only the DeepSpeed config sets them).
        num_processes: the world size.
        say: prints a line in the cell (main process).

    Raises:
        ImportError: deepspeed is not installed.
        ValueError: fp16 where DeepSpeed's device has no fp16 support.
    """

    def __init__(self, plugin: DeepSpeedPlugin, mixed_precision: str, gradient_state: GradientState,
                 num_processes: int, say: Callable[[str], None], device: torch.device) -> None:
        self.deepspeed = import_deepspeed()
        from deepspeed.accelerator import get_accelerator

        if num_processes == 1:
            os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed's engine insists on it
            ensure_one_process_group(device)  # DeepSpeed needs a group even alone (ZeRO-Offload on one GPU)

        if mixed_precision == "fp16" and not get_accelerator().is_fp16_supported():
            raise ValueError(f"mixed_precision 'fp16' is not supported by DeepSpeed on "
                             f"{get_accelerator().device_name()!r}; use 'bf16' or 'no'")
        self.plugin = plugin
        _fill_precision(plugin.deepspeed_config, mixed_precision)  # zero.Init builds in this dtype
        self.mixed_precision = mixed_precision
        self.gradient_state = gradient_state
        self.num_processes = num_processes
        self.say = say
        gas = plugin.deepspeed_config.get("gradient_accumulation_steps", "auto")
        if isinstance(gas, int) and gradient_state.num_steps == 1:
            gradient_state.num_steps = gas  # the plugin's or config's accumulation, as in the peer
        self.engine: Any = None
        self.optimizer: DeepSpeedOptimizerWrapper | None = None
        self.skeleton: torch.nn.Module | None = None
        self.config: dict[str, Any] | None = None
        self._warned_clip = False

    def owns(self, model: Any) -> bool:
        """Whether ``model`` is this runtime's engine."""
        return self.engine is not None and model is self.engine

    def initialize(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batch: int | None,
                   wrap_forward: Callable[[torch.nn.Module], None]) -> tuple[Any, DeepSpeedOptimizerWrapper]:
        """The engine for ``model`` and ``optimizer`` and the optimizer to hand back.

        Raises:
            ValueError: a second model with an optimizer (one engine per Accelerator).
        """
        if self.engine is not None:
            raise ValueError("this Accelerator already prepared a model with DeepSpeed; one model and its "
                             "optimizer per Accelerator are supported (prepare other models without an optimizer)")
        self.config = fill_auto(self.plugin.deepspeed_config, micro_batch=micro_batch,
                                accumulation=self.gradient_state.num_steps, world_size=self.num_processes,
                                mixed_precision=self.mixed_precision, model=model)
        if self.plugin.is_zero3():
            self.skeleton = meta_skeleton(model)
        if self.mixed_precision in ("bf16", "fp16"):
            wrap_forward(model)  # float inputs meet the engine's half-precision weights under autocast
        announce_op_builds(self.deepspeed, self.say)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
            engine, ds_optimizer, _, _ = self.deepspeed.initialize(
                model=model, optimizer=optimizer, config=self.config, dist_init_required=False)
        self.engine = engine
        self.optimizer = DeepSpeedOptimizerWrapper(engine, optimizer, self.gradient_state)
        return engine, self.optimizer

    def release(self) -> None:
        """Forget the engine (its hooks removed), so the Accelerator can prepare another model."""
        if self.engine is not None:
            self.engine.destroy()
        self.engine = self.optimizer = self.skeleton = self.config = None
        _restore_linear()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """The engine's backward (it divides by the accumulation steps) and step."""
        self.engine.set_gradient_accumulation_boundary(self.gradient_state.sync_gradients)
        self.engine.backward(loss, **kwargs)
        self.engine.step()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor | None:
        """The global gradient norm the engine measured in the step ``backward`` just ran (``None``
        where the engine does not measure it: stage 0 with a torch optimizer, as in the peer).

        DeepSpeed clips inside its step, which has run by the time the loop calls this: the
        config's ``gradient_clipping`` is what clips. Without one, ``max_norm`` becomes the
        engine's threshold from the next step on (with a warning saying to configure it).
        """
        configured = self.config.get("gradient_clipping", 0.0)
        if not configured or float(configured) != float(max_norm):
            if not self._warned_clip:
                warnings.warn(f"under DeepSpeed, gradients are clipped inside the engine's step, which "
                              f"accelerator.backward() already ran: set gradient_clipping={max_norm} in the "
                              f"DeepSpeedPlugin or the DeepSpeed config (now {configured or 'unset'}); "
                              f"clip_grad_norm_'s max_norm applies from the next step", stacklevel=3)
                self._warned_clip = True
            self._set_clipping(float(max_norm))
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else torch.tensor(float(norm))  # stage 0 with a torch optimizer: unknown

    def _set_clipping(self, max_norm: float) -> None:
        self.config["gradient_clipping"] = max_norm
        self.engine._config.gradient_clipping = max_norm
        if hasattr(self.engine.optimizer, "clip_grad"):
            self.engine.optimizer.clip_grad = max_norm

    def full_weights(self) -> dict[str, torch.Tensor]:
        """ZeRO-3: every parameter, full, on the CPU of every rank (every rank calls it), gathered
        one parameter at a time, so the device never holds more than one extra parameter."""
        weights: dict[str, torch.Tensor] = {}
        done: dict[int, torch.Tensor] = {}
        for name, param in self.engine.module.named_parameters(remove_duplicate=False):
            if id(param) not in done:
                with self.deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                    done[id(param)] = param.detach().cpu().clone()
            weights[name] = done[id(param)]
        return weights

    def unwrap(self, keep_fp32_wrapper: bool = True) -> torch.nn.Module:
        """The user's module; under ZeRO-3 (its parameters partitioned) a full, plain copy on the CPU
        instead (a collective: every process must call it)."""
        if not self.plugin.is_zero3():
            from notebook_accel.helpers import extract_model_from_parallel

            return extract_model_from_parallel(self.engine.module, keep_fp32_wrapper)
        buffers = dict(self.engine.module.named_buffers())
        return module_from_weights(self.skeleton, self.full_weights(), buffers, torch.device("cpu"))

    def state_dict(self) -> dict[str, Any]:
        """The full weights: under ZeRO-3 gathered to rank 0 (``{}`` elsewhere) when
        ``zero3_save_16bit_model`` is on; every rank calls it.

        Raises:
            ValueError: ZeRO-3 without ``zero3_save_16bit_model``.
        """
        if not self.plugin.is_zero3():
            return self.engine.module.state_dict()
        if not get_value(self.config or {}, "zero_optimization.stage3_gather_16bit_weights_on_model_save"):
            raise ValueError("under ZeRO-3 the weights are partitioned over the processes: set "
                             "zero3_save_16bit_model=True in the DeepSpeedPlugin (config file: "
                             "deepspeed_config: zero3_save_16bit_model: true) to gather them for "
                             "get_state_dict/save_model, or use save_state")
        state = self.engine._zero3_consolidated_16bit_state_dict()
        return {} if state is None else dict(state)
