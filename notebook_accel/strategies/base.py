"""``Strategy``: how one worker trains, the interface every strategy implements.

An ``Accelerator`` holds one strategy, chosen once by ``registry.select``, and asks it
for everything that differs between DDP, XLA, FSDP2 and DeepSpeed: how models and
optimizers are set up, how the loss goes backward, how gradients skip their sync, are
clipped and come out, how a model is unwrapped and its weights gathered, and how the
checkpoint stores models and optimizers. Kernel side, a strategy names its config-file
section and the workers' variables it becomes.

The defaults here are the plain behaviour (one device, nothing to synchronise); a
strategy overrides what it does differently. Each method has one signature for all.
"""

from __future__ import annotations

import contextlib
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel

from notebook_accel.checkpoint.model_files import PlainCheckpointer
from notebook_accel.runtime import compilation, precision
from notebook_accel.runtime.device import TorchDevice, device_kind
from notebook_accel.runtime.gradient_state import GradientState
from notebook_accel.runtime.optim import AcceleratedOptimizer
from notebook_accel.runtime.state import DistributedType, collective_backend


@dataclass
class StrategyContext:
    """What a strategy knows about its worker and its ``Accelerator``.

    Args:
        state: where this process stands (a ``PartialState``: ``device``, ``process_index``,
            ``num_processes``, ``local_process_index``, ``distributed_type``), read when needed.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        gradient_state: the Accelerator's accumulation bookkeeping.
        say: prints a line in the cell (the Accelerator's ``print``).
        ddp_kwargs: extra ``DistributedDataParallel`` arguments.
        ddp_comm_hook: DDP's communication hook: ``(hook, wrapper, PowerSGD options)``.
    """

    state: Any
    mixed_precision: str = "no"
    gradient_state: GradientState = field(default_factory=GradientState)
    say: Callable[[str], None] = print
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    ddp_comm_hook: tuple[str, str, dict] = ("no", "no", {})

    @classmethod
    def on_device(cls, device: torch.device, mixed_precision: str = "no", num_processes: int = 1,
                  **kwargs: Any) -> StrategyContext:
        """A context without a ``PartialState``: this process (rank 0 of ``num_processes``) on ``device``."""
        kind = DistributedType.NO if num_processes == 1 else DistributedType.MULTI_CPU
        state = SimpleNamespace(device=device, process_index=0, num_processes=num_processes,
                                local_process_index=0, distributed_type=kind)
        return cls(state, mixed_precision, **kwargs)


class Strategy(ABC):
    """How one worker trains (see the module docstring); subclasses override what differs.

    Args:
        context: the worker and its Accelerator.
        plugin: the strategy's validated plugin (``resolve_plugin``'s result), if it has one.
    """

    name: ClassVar[str]  # the registry's key
    joint_setup: ClassVar[bool] = False  # a model is set up together with its optimizer (one prepare call)

    def __init__(self, context: StrategyContext, plugin: Any = None) -> None:
        self.context = context
        self.plugin = plugin
        self.state = context.state
        self.device: torch.device = context.state.device
        self.device_kind = device_kind(self.device)  # the device seam (runtime.device)
        self.num_processes: int = context.state.num_processes
        self.mixed_precision = context.mixed_precision
        self.gradient_state = context.gradient_state

    # ---- choice (registry) and kernel side ------------------------------------------------
    @classmethod
    def resolve_plugin(cls, given: Any) -> Any:
        """The validated plugin this strategy runs with: ``given`` (ours or the peer's), or one from
        the environment when ``given`` is ``None``; ``None`` when it is not asked for."""
        return None

    @classmethod
    @abstractmethod
    def wanted(cls, context: StrategyContext, plugin: Any) -> bool:
        """Whether this strategy runs the job (the registry asks in its order; the first wins)."""

    @property
    def distributed_type(self) -> DistributedType:
        """What ``Accelerator.distributed_type`` says (the peer's enum)."""
        return self.state.distributed_type

    @property
    def collective_backend(self) -> str:
        """The ``torch.distributed`` backend of this worker's process group."""
        return collective_backend(self.device.type)

    def resolved_config(self) -> dict[str, Any] | None:
        """The strategy's own config as this job resolved it (DeepSpeed's), or ``None``."""
        return None

    # ---- set-up ---------------------------------------------------------------------------
    def loss_scaler(self, scaler: Any) -> Any:
        """The fp16 ``GradScaler`` the Accelerator should use, given the one it made (``None``: the
        strategy scales losses itself)."""
        return scaler

    def owns(self, model: Any) -> bool:
        """Whether ``model`` was wrapped or sharded by this strategy in a way only it can undo."""
        return False

    def setup_model(self, model: torch.nn.Module, place: bool, evaluation_mode: bool,
                    optimizers: list[torch.optim.Optimizer]) -> torch.nn.Module:
        """The prepared model: moved to the device (``place``), its forward under autocast.

        Args:
            model: the user's model (not prepared before).
            place: move it to the device.
            evaluation_mode: it will not be trained (no wrapper that synchronises gradients).
            optimizers: the (unwrapped) optimizers prepared so far, whose parameters may need
                pointing at the prepared model's.
        """
        if place:
            model = model.to(self.device)
        precision.wrap_forward(model, self.mixed_precision, self.device)
        return model

    def compile_model(self, model: torch.nn.Module, plugin: Any) -> torch.nn.Module:
        """The prepared (wrapped) ``model`` compiled as ``plugin`` (a ``TorchDynamoPlugin``) says:
        ``torch.compile`` around it, or its repeated blocks (``runtime.compilation``)."""
        return compilation.compile_model(model, plugin)

    def setup_model_and_optimizer(self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer],
                                  loaders: list[Any]) -> tuple[torch.nn.Module, AcceleratedOptimizer]:
        """For a ``joint_setup`` strategy: the prepared model and optimizer from one ``prepare`` call's
        trainable ``models`` and ``optimizers``; ``loaders``: the data loaders prepared so far."""
        raise NotImplementedError(f"the {self.name} strategy sets models and optimizers up one at a time")

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, scaler: Any) -> AcceleratedOptimizer:
        """``optimizer`` wrapped (see ``optim.AcceleratedOptimizer``)."""
        return AcceleratedOptimizer(optimizer, self.gradient_state, scaler)

    def release(self) -> None:
        """Forget what ``setup_*`` built (``Accelerator.free_memory``)."""
        return None

    # ---- training step --------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, scaler: Any, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled by ``scaler`` (fp16)."""
        if self.gradient_state.num_steps > 1:
            loss = loss / self.gradient_state.num_steps
        if scaler is not None:
            scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """A context in which ``model``'s gradients accumulate locally (not synchronised)."""
        if self.num_processes > 1 and isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """A context whose backward synchronises ``model``'s gradients although its forward ran under
        ``no_sync`` (a DDP-wrapped model; elsewhere a null context)."""
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        saved = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any]) -> Iterator[None]:
        """Let processes train on inputs of different lengths (DDP's ``Join``); elsewhere a
        null context, with a warning where the job is distributed."""
        self._warn_join_unsupported()
        yield

    def _warn_join_unsupported(self) -> None:
        if self.distributed_type is not DistributedType.NO:
            warnings.warn(  # stacklevel: the user's `with accelerator.join_uneven_inputs(...)` line
                f"join_uneven_inputs is only supported for multi-GPU/multi-CPU DDP training, not "
                f"{self.distributed_type.value}; it has no effect here", UserWarning, stacklevel=6,
            )

    def settle_gradients(self, optimizers: list[AcceleratedOptimizer]) -> None:
        """Make the (unscaled) gradients what the optimizers' next step will use, before they are
        clipped or inspected (XLA averages them across the cores here); nothing here."""
        return None

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip the (unscaled) gradients to ``max_norm``; returns their total norm."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clip each (unscaled) gradient to ``[-clip_value, clip_value]``."""
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # ---- models out and checkpoints -------------------------------------------------------
    def unwrap(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True,
               keep_torch_compile: bool = False) -> torch.nn.Module:
        """The user's module inside the prepared ``model`` (see ``Accelerator.unwrap_model``)."""
        from notebook_accel.runtime.helpers import extract_model_from_parallel

        return extract_model_from_parallel(model, keep_fp32_wrapper, keep_torch_compile)

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """``model``'s full weights (see ``Accelerator.get_state_dict``); a dispatched model's
        offloaded ones read in (``big_model.dispatch``)."""
        from notebook_accel.big_model.dispatch import DISPATCHED, state_dict_with_offloaded

        if DISPATCHED in model.__dict__:
            return state_dict_with_offloaded(model)
        return (self.unwrap(model) if unwrap else model).state_dict()

    def to_cpu(self, obj: Any) -> Any:
        """``obj`` with its tensors where ``torch.save`` can write them without this device's runtime
        (the device kind's copy; on XLA every process takes part)."""
        return self.device_kind.to_cpu(obj)

    def checkpointer(self, models: list[torch.nn.Module], optimizers: list[AcceleratedOptimizer]) -> Any:
        """What writes and reads the models and optimizers in ``save_state`` / ``load_state``: an object
        with ``save(files)`` and ``load(files)`` (``checkpoint.training_state.CheckpointFiles``); here the
        plain files, copied to the CPU first (``checkpoint.model_files.PlainCheckpointer``)."""
        return PlainCheckpointer(models, optimizers, self.to_cpu,
                                 live=type(self.device_kind).to_cpu is TorchDevice.to_cpu)
