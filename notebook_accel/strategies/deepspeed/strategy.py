"""DeepSpeed ZeRO: the model and its optimizer trained by one DeepSpeed engine.

``prepare`` hands the strategy the model and optimizer of the call (they go into
``deepspeed.initialize`` together); the user gets the engine (an ``nn.Module``: call it,
``.train()``, ``.parameters()``) and a ``DeepSpeedOptimizerWrapper``. The loop stays as it
is: ``accelerator.backward(loss)`` runs the engine's backward *and* its step (an
optimizer step only at an accumulation boundary, clipping inside it, as in the peer);
``optimizer.step()`` / ``zero_grad()`` are then no-ops, and schedulers keep the
Accelerator's semantics (they are not given to the engine). ``"auto"`` config values
are filled from the job (``fill_auto``) just before the engine is made. One process gets a
one-process group (DeepSpeed needs one), made where every group is made (``runtime.state.ensure_process_group``).
The helpers live in ``notebook_accel.strategies.deepspeed``;
``deepspeed`` itself is imported when the strategy is built.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, ClassVar

import torch

from notebook_accel.runtime import compilation
from notebook_accel.runtime.device import device_kind
from notebook_accel.runtime.optim import AcceleratedOptimizer
from notebook_accel.runtime.state import DistributedType, ensure_process_group
from notebook_accel.strategies.base import Strategy, StrategyContext
from notebook_accel.strategies.deepspeed.plugin import get_value, resolve_plugin


class DeepSpeedStrategy(Strategy):
    """Training through a DeepSpeed ZeRO engine (``DistributedType.DEEPSPEED``).

    Raises:
        ImportError: deepspeed is not installed.
        ValueError: a device kind that is not torch-native (XLA); fp16 where DeepSpeed's device has no fp16 support.
    """

    name: ClassVar[str] = "deepspeed"
    joint_setup: ClassVar[bool] = True

    def __init__(self, context: StrategyContext, plugin: Any = None) -> None:
        device_kind(context.state.device).refuse("DeepSpeed")
        super().__init__(context, plugin)
        from notebook_accel.strategies.deepspeed.runtime import fill_precision, import_deepspeed

        self.deepspeed = import_deepspeed()
        from deepspeed.accelerator import get_accelerator

        if self.num_processes == 1:  # DeepSpeed needs a group even alone (ZeRO-Offload on one GPU)
            os.environ.setdefault("LOCAL_RANK", "0")  # its engine insists on it
            ensure_process_group(self.collective_backend, 0, 1, None, self.device, alone=True)
        if self.mixed_precision == "fp16" and not get_accelerator().is_fp16_supported():
            raise ValueError(f"mixed_precision 'fp16' is not supported by DeepSpeed on "
                             f"{get_accelerator().device_name()!r}; use 'bf16' or 'no'")
        fill_precision(plugin.deepspeed_config, self.mixed_precision)  # zero.Init builds in this dtype
        self.say = context.say
        gas = plugin.deepspeed_config.get("gradient_accumulation_steps", "auto")
        if isinstance(gas, int) and self.gradient_state.num_steps == 1:
            self.gradient_state.num_steps = gas  # the plugin's or config's accumulation, as in the peer
        self.engine: Any = None
        self.optimizer: AcceleratedOptimizer | None = None
        self.skeleton: torch.nn.Module | None = None
        self.config: dict[str, Any] | None = None
        self._warned_clip = False

    @classmethod
    def resolve_plugin(cls, given: Any) -> Any:
        return resolve_plugin(given)

    @classmethod
    def wanted(cls, context: StrategyContext, plugin: Any) -> bool:
        return plugin is not None

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.DEEPSPEED

    def resolved_config(self) -> dict[str, Any] | None:
        """The config with its ``"auto"`` values filled once a model is prepared; the plugin's before."""
        return self.config if self.config is not None else self.plugin.deepspeed_config

    def loss_scaler(self, scaler: Any) -> Any:
        return None  # DeepSpeed scales fp16 losses itself

    def owns(self, model: Any) -> bool:
        """Whether ``model`` is this strategy's engine."""
        return self.engine is not None and model is self.engine

    # ---- set-up ---------------------------------------------------------------------------
    def compile_model(self, model: torch.nn.Module, plugin: Any) -> torch.nn.Module:
        """The engine's module is compiled in place (as the peer's ``compile_regions_deepspeed``):
        the engine stays the prepared model, its hooks and offloaded parameters untouched."""
        if self.owns(model):
            compilation.compile_model(model.module, plugin, in_place=True)
            return model
        return super().compile_model(model, plugin)

    def setup_model(self, model: torch.nn.Module, place: bool, evaluation_mode: bool,
                    optimizers: list[torch.optim.Optimizer]) -> torch.nn.Module:
        """Models that do not train (a teacher...) are placed; a trained one goes with its optimizer.

        Raises:
            ValueError: a model to train, prepared without its optimizer.
        """
        if not evaluation_mode:
            raise ValueError("under DeepSpeed a model is prepared together with its optimizer: "
                             "accelerator.prepare(model, optimizer, ...)")
        return super().setup_model(model, place, evaluation_mode, optimizers)

    def setup_model_and_optimizer(self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer],
                                  loaders: list[Any]) -> tuple[torch.nn.Module, AcceleratedOptimizer]:
        """The engine for the one trainable model and its optimizer, and the optimizer to hand back;
        its micro batch is the first loader's per-process batch.

        Raises:
            ValueError: not exactly one trainable model and one optimizer; a second engine (one
                model and its optimizer per Accelerator).
        """
        if len(models) != 1 or len(optimizers) != 1:
            raise ValueError(f"under DeepSpeed, pass one trainable model and its optimizer to the same prepare() "
                             f"call (got {len(models)} trainable models and {len(optimizers)} optimizers)")
        if self.engine is not None:
            raise ValueError("this Accelerator already prepared a model with DeepSpeed; one model and its "
                             "optimizer per Accelerator are supported (prepare other models without an optimizer)")
        from notebook_accel.runtime import precision
        from notebook_accel.strategies.deepspeed.runtime import (
            DeepSpeedOptimizerWrapper,
            announce_op_builds,
            fill_auto,
        )
        from notebook_accel.strategies.fsdp.state_dict import meta_skeleton

        model, optimizer = models[0], optimizers[0]
        total = loaders[0].total_batch_size if loaders else None
        micro_batch = total // self.num_processes if total else None
        self.config = fill_auto(self.plugin.deepspeed_config, micro_batch=micro_batch,
                                accumulation=self.gradient_state.num_steps, world_size=self.num_processes,
                                mixed_precision=self.mixed_precision, model=model)
        if self.plugin.is_zero3():
            self.skeleton = meta_skeleton(model)
        if self.mixed_precision in ("bf16", "fp16"):
            # float inputs meet the engine's half-precision weights under autocast
            precision.wrap_forward(model, self.mixed_precision, self.device)
        announce_op_builds(self.deepspeed, self.say)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
            engine, _, _, _ = self.deepspeed.initialize(
                model=model, optimizer=optimizer, config=self.config, dist_init_required=False)
        self.engine = engine
        self.optimizer = DeepSpeedOptimizerWrapper(engine, optimizer, self.gradient_state)
        return engine, self.optimizer

    def release(self) -> None:
        """Forget the engine (its hooks removed), so the Accelerator can prepare another model."""
        from notebook_accel.strategies.deepspeed.runtime import restore_linear

        if self.engine is not None:
            self.engine.destroy()
        self.engine = self.optimizer = self.skeleton = self.config = None
        restore_linear()

    # ---- training step --------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler: Any, **kwargs: Any) -> None:
        """The engine's backward (it divides by the accumulation steps) and step."""
        if self.engine is None:
            super().backward(loss, scaler, **kwargs)
            return
        self.engine.set_gradient_accumulation_boundary(self.gradient_state.sync_gradients)
        self.engine.backward(loss, **kwargs)
        self.engine.step()

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """The global gradient norm the engine measured in the step ``backward`` just ran (``None``
        where the engine does not measure it: stage 0 with a torch optimizer, as in the peer).

        DeepSpeed clips inside its step, which has run by the time the loop calls this: the
        config's ``gradient_clipping`` is what clips. Without one, ``max_norm`` becomes the
        engine's threshold from the next step on (with a warning saying to configure it).
        ``parameters`` and ``norm_type`` are the engine's (all its parameters, the 2-norm).
        """
        if self.engine is None:
            return super().clip_grad_norm_(parameters, max_norm, norm_type)
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

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Raises ``ValueError``: DeepSpeed's engine clips by norm only."""
        raise ValueError("DeepSpeed clips gradients by norm only: use clip_grad_norm_ or the "
                         "DeepSpeed config's gradient_clipping")

    # ---- models out and checkpoints -------------------------------------------------------
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

    def unwrap(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True,
               keep_torch_compile: bool = False) -> torch.nn.Module:
        """The engine: the user's module; under ZeRO-3 (its parameters partitioned) a full, plain copy
        on the CPU instead (a collective: every process must call it)."""
        if not self.owns(model):
            return super().unwrap(model, keep_fp32_wrapper, keep_torch_compile)
        if not self.plugin.is_zero3():
            return super().unwrap(self.engine.module, keep_fp32_wrapper, keep_torch_compile=True)
        from notebook_accel.strategies.fsdp.state_dict import module_from_weights

        buffers = dict(self.engine.module.named_buffers())
        return module_from_weights(self.skeleton, self.full_weights(), buffers, torch.device("cpu"))

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The engine: its full weights, under ZeRO-3 gathered to rank 0 (``{}`` elsewhere) when
        ``zero3_save_16bit_model`` is on; every rank calls it.

        Raises:
            ValueError: ZeRO-3 without ``zero3_save_16bit_model``.
        """
        if not self.owns(model):
            return super().model_state_dict(model, unwrap)
        if not self.plugin.is_zero3():
            return self.engine.module.state_dict()
        if not get_value(self.config or {}, "zero_optimization.stage3_gather_16bit_weights_on_model_save"):
            raise ValueError("under ZeRO-3 the weights are partitioned over the processes: set "
                             "zero3_save_16bit_model=True in the DeepSpeedPlugin (config file: "
                             "deepspeed_config: zero3_save_16bit_model: true) to gather them for "
                             "get_state_dict/save_model, or use save_state")
        state = self.engine._zero3_consolidated_16bit_state_dict()
        return {} if state is None else dict(state)

    def checkpointer(self, models: list[torch.nn.Module], optimizers: list[AcceleratedOptimizer]) -> Any:
        """The engine writes its own checkpoint (``pytorch_model/``, one ZeRO partition per rank)."""
        from notebook_accel.strategies.deepspeed.checkpointing import DeepSpeedCheckpointer

        return DeepSpeedCheckpointer(self, models, optimizers)
