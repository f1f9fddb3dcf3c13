"""``Accelerator``: the peer's training-loop surface, as a thin composition of small parts.

The strategy (``strategies/``) decides how the models train; state and process control
come from ``runtime.state.PartialState``, mixed precision from ``runtime.precision``,
optimizer/scheduler wrappers from ``runtime.optim``, collectives from ``runtime.ops``, data
sharding from ``data/``, checkpoints from ``checkpoint/`` and trackers from
``observe.tracking``. Every ``Accelerator`` owns its own bookkeeping, so several in
one process never interfere.

Example:
    >>> accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)
    >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    >>> for x, y in loader:
    ...     with accelerator.accumulate(model):
    ...         loss = torch.nn.functional.mse_loss(model(x), y)
    ...         accelerator.backward(loss)
    ...         optimizer.step()
    ...         optimizer.zero_grad()
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.hooks import RemovableHandle

from notebook_accel import _peer_paths, contract
from notebook_accel.checkpoint import auto_resume, orchestration, resume, snapshot_place, snapshots
from notebook_accel.checkpoint.project import ProjectConfiguration
from notebook_accel.checkpoint.weight_files import save_weights
from notebook_accel.checkpoint.weight_shards import save_object
from notebook_accel.data.prepare import (
    DataLoaderConfiguration,
    DataLoaderShard,
    shard_data_loader,
    skip_first_batches,
)
from notebook_accel.data.uneven import even_batches_for
from notebook_accel.machine.versions import check_os_kernel
from notebook_accel.observe import run_trackers, tracking
from notebook_accel.runtime import ops, precision, profiling
from notebook_accel.runtime.accelerator_state import AcceleratorState
from notebook_accel.runtime.dynamo import TorchDynamoPlugin, parse_backend
from notebook_accel.runtime.gradient_state import GradientState
from notebook_accel.runtime.kwargs_handlers import (
    comm_hook,
    find_handler,
    handler_kwargs,
    process_group_kwargs,
)
from notebook_accel.runtime.memory import release_memory
from notebook_accel.runtime.optim import AcceleratedOptimizer, AcceleratedScheduler
from notebook_accel.runtime.profiling import ProfileKwargs
from notebook_accel.runtime.state import DistributedType
from notebook_accel.strategies.base import StrategyContext
from notebook_accel.strategies.preparation import mark_prepared, prepare_objects
from notebook_accel.strategies.registry import select


class Accelerator:
    """Runs one training loop on CPU, one GPU, many GPUs or TPU (see the module docstring).

    Args:
        device_placement: move prepared models and batches to ``device``.
        split_batches: see ``DataLoaderConfiguration`` (overridden by ``dataloader_config``).
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``; default from
            ``NOTEBOOK_ACCEL_MIXED_PRECISION``, then ``ACCELERATE_MIXED_PRECISION``, then ``"no"``.
        gradient_accumulation_steps: micro-batches per optimizer step under ``accumulate``.
        cpu: use the CPU even when a GPU is present.
        log_with: tracker names (``"jsonl"``, ``"tensorboard"``, ``"wandb"``, ``"mlflow"``; ``"all"``:
            every one installed) or tracker objects.
        project_dir: default place for logs and checkpoints (sets ``project_config.project_dir``).
        even_batches: see ``DataLoaderConfiguration``.
        step_scheduler_with_optimizer: step schedulers as the peer does (see ``optim``).
        dataloader_config: a ``DataLoaderConfiguration``.
        project_config: a ``ProjectConfiguration`` (automatic checkpoint naming, total limit).
        gradient_accumulation_plugin: an object with ``num_steps`` (and optionally
            ``sync_with_dataloader``, ``sync_each_batch``), like the peer's
            ``GradientAccumulationPlugin``; overrides ``gradient_accumulation_steps``.
        ddp_kwargs: extra ``DistributedDataParallel`` arguments.
        scaler_kwargs: extra ``GradScaler`` arguments.
        kwargs_handlers: the peer's ``DistributedDataParallelKwargs`` (also its ``comm_hook``),
            ``ProfileKwargs`` / ``GradScalerKwargs`` / ``InitProcessGroupKwargs``
            objects are understood too.
        fsdp_plugin: a ``FullyShardedDataParallelPlugin`` (ours or the peer's): shard models with FSDP2;
            default: one from the environment when ``ACCELERATE_USE_FSDP`` is true.
        deepspeed_plugin: a ``DeepSpeedPlugin`` (ours or the peer's): train through a DeepSpeed ZeRO
            engine; default: one from the environment when ``ACCELERATE_USE_DEEPSPEED`` is true.
        dynamo_backend: ``torch.compile`` prepared models with this backend (``"inductor"``...; ``"no"``:
            not compiled); default: ``ACCELERATE_DYNAMO_BACKEND``, else ``"no"``.
        dynamo_plugin: a ``TorchDynamoPlugin`` (backend, mode, fullgraph, dynamic, options,
            regional compilation), instead of ``dynamo_backend``.
        resume: ``"auto"``: go on from the newest complete snapshot (``snapshot_every``'s directory,
            or the launch option ``snapshot_dir``'s, or the default one) as soon as ``prepare`` has
            prepared the model, the optimizer and every other object the snapshot holds (said
            here, and in one line when loaded); ``resumed_step`` is then the step to go on from:
            ``for step in range(accelerator.resumed_step, total_steps)``. None (default): only
            ``accelerator.resume()`` loads one.

    Raises:
        ValueError: an invalid mixed precision, fp16 where no scaler exists, a bad dynamo
            backend, both ``dynamo_backend`` and ``dynamo_plugin``, or a ``resume`` other than
            None and ``"auto"``.
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = False,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        log_with: Any = None,
        project_dir: str | os.PathLike[str] | None = None,
        even_batches: bool = True,
        step_scheduler_with_optimizer: bool = True,
        dataloader_config: DataLoaderConfiguration | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: Any = None,
        ddp_kwargs: dict[str, Any] | None = None,
        scaler_kwargs: dict[str, Any] | None = None,
        kwargs_handlers: list[Any] | None = None,
        fsdp_plugin: Any = None,
        deepspeed_plugin: Any = None,
        dynamo_backend: Any = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        resume: str | None = None,
    ) -> None:
        resume = auto_resume.check(resume)
        if dynamo_plugin is not None and dynamo_backend is not None:
            raise ValueError(f"Accelerator(dynamo_backend={dynamo_backend!r}, dynamo_plugin=...): give one "
                             "of them (the plugin has a backend field)")
        self.state = AcceleratorState(mixed_precision, cpu=cpu, **process_group_kwargs(kwargs_handlers))
        # how prepare compiles models (the peer keeps it on its state)
        if dynamo_backend is not None:
            dynamo_backend = parse_backend(dynamo_backend, "Accelerator(dynamo_backend=...)")
        self.state.dynamo_plugin = dynamo_plugin or TorchDynamoPlugin(backend=dynamo_backend)
        self.mixed_precision = self.state.mixed_precision
        self.dataloader_config = dataloader_config or DataLoaderConfiguration(split_batches, even_batches)
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        plugin = gradient_accumulation_plugin
        self.gradient_state = GradientState(
            getattr(plugin, "num_steps", gradient_accumulation_steps),
            getattr(plugin, "sync_with_dataloader", True),
        )
        self.sync_each_batch = bool(getattr(plugin, "sync_each_batch", False))  # all-reduce every micro-step
        check_os_kernel()  # a warning on Linux below 5.5, as the peer's
        AcceleratorState.adopt(self.state)  # what AcceleratorState() / GradientState() answer (runtime.latest)
        GradientState.adopt(self.gradient_state)
        ddp_kwargs = {**handler_kwargs(kwargs_handlers, "DistributedDataParallelKwargs"), **(ddp_kwargs or {})}
        scaler_kw = {**handler_kwargs(kwargs_handlers, "GradScalerKwargs"), **(scaler_kwargs or {})}
        self.scaler = precision.make_grad_scaler(self.mixed_precision, self.device, **scaler_kw)
        self.log_with = log_with
        self.project_configuration = project_config or ProjectConfiguration()
        if project_dir is not None:
            self.project_configuration.project_dir = project_dir
        tracking.check_log_with(log_with, self.logging_dir)
        self.trackers: list[Any] = []
        self.step = 0
        self.flag_tensor: torch.Tensor | None = None
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[DataLoaderShard] = []
        self._custom_objects: list[Any] = []
        self._state_hooks = orchestration.StateHooks()
        self._snapshots: snapshots.Snapshots | None = None
        self._resumed_at = 0
        self.profile_handler = find_handler(kwargs_handlers, "ProfileKwargs")
        # the state's print, not self.print: a bound method here would keep this Accelerator alive in a cycle
        context = StrategyContext(self.state, self.mixed_precision, self.gradient_state, self.state.print, ddp_kwargs,
                                  comm_hook(kwargs_handlers))
        # how this worker trains (DDP, XLA, FSDP2, DeepSpeed): chosen once, from the plugins and the environment
        self.strategy, plugins = select(context, {"fsdp": fsdp_plugin, "deepspeed": deepspeed_plugin})
        self.fsdp_plugin = self.state.fsdp_plugin = plugins["fsdp"]
        self.deepspeed_plugin = self.state.deepspeed_plugin = plugins["deepspeed"]
        self.scaler = self.strategy.loss_scaler(self.scaler)
        self._snapshots_from_launch()
        self._auto_resume = auto_resume.AutoResume(self) if resume == "auto" else None

    def _snapshots_from_launch(self) -> None:
        """The launch option ``snapshot_every`` (the workers get it in ``NOTEBOOK_ACCEL_SNAPSHOT_EVERY``):
        snapshots every N steps into the default directory, as ``snapshot_every(steps=N)``."""
        value = os.environ.get(contract.SNAPSHOT_EVERY_ENV, "").strip()
        if not value:
            return
        where = f"snapshot_every={value!r} (environment variable {contract.SNAPSHOT_EVERY_ENV})"
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{where}: must be an integer >= 1 (optimizer steps between snapshots)")
        try:
            self.snapshot_every(steps=int(value))
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None

    def __repr__(self) -> str:
        return f"Accelerator({self.state!r}, mixed_precision={self.mixed_precision!r})"

    # ---- where am I ---------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def distributed_type(self) -> DistributedType:
        return self.strategy.distributed_type

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """Extra ``DistributedDataParallel`` arguments (the strategy reads them when it wraps a model)."""
        return self.strategy.context.ddp_kwargs

    @ddp_kwargs.setter
    def ddp_kwargs(self, value: dict[str, Any]) -> None:
        self.strategy.context.ddp_kwargs = value

    @property
    def deepspeed_config(self) -> dict[str, Any] | None:
        """The DeepSpeed config (``"auto"`` values filled once a model is prepared), or ``None``."""
        return self.strategy.resolved_config()

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def project_dir(self) -> Path | None:
        directory = self.project_configuration.project_dir
        return None if directory is None else Path(directory)

    @property
    def logging_dir(self) -> str | os.PathLike[str] | None:
        """Where trackers write: the project configuration's ``logging_dir``, else ``project_dir``."""
        project = self.project_configuration
        return project.logging_dir if project.logging_dir is not None else project.project_dir

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @property
    def sync_gradients(self) -> bool:
        """Whether this step's gradients are synchronised and the optimizer steps."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.sync_gradients = value

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self.gradient_state.num_steps = value

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the fp16 scaler skipped the last optimizer step (inf/NaN gradients)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    # ---- prepare ------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and data loaders, returned in the given order.

        Schedulers are prepared last, so they can find their prepared optimizers.
        Other objects are returned unchanged.
        """
        self.distributed_type.check_supported()
        placement = device_placement or [self.device_placement] * len(args)
        if len(placement) != len(args):
            raise ValueError(f"device_placement has {len(placement)} entries for {len(args)} objects")
        out = prepare_objects(self, list(args), placement)
        if self._auto_resume is not None:
            self._auto_resume.after_prepare(self)
        return out[0] if len(out) == 1 else tuple(out)

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        """Move ``model`` to the device, autocast its forward, wrap it in DDP when distributed
        (or shard it with FSDP2 when there is an FSDP plugin; mixed precision is then its policy),
        then ``torch.compile`` it when the dynamo plugin says so (the whole wrapped model, or
        each repeated block with ``use_regional_compilation``).

        A model prepared before (or the module inside one) is returned as prepared then.
        """
        for prepared in self._models:
            if model is prepared or model is getattr(prepared, "module", None):
                return prepared
        if getattr(model, "_is_accelerate_prepared", False):  # by another Accelerator: never wrapped twice
            self._models.append(model)
            return model
        place = device_placement if device_placement is not None else self.device_placement
        model = self.strategy.setup_model(model, place, evaluation_mode, [opt.optimizer for opt in self._optimizers])
        model = self.strategy.compile_model(model, self.state.dynamo_plugin)
        self._models.append(model)
        return mark_prepared(model)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` (see ``optim.AcceleratedOptimizer``)."""
        wrapped = self.strategy.setup_optimizer(optimizer, self.scaler)
        self._optimizers.append(wrapped)
        if self._snapshots is not None:
            self._snapshots.watch_optimizer(wrapped)
        return mark_prepared(wrapped)

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap ``scheduler`` (see ``optim.AcceleratedScheduler``)."""
        mine = [opt for opt in self._optimizers if opt.optimizer is getattr(scheduler, "optimizer", None)]
        wrapped = AcceleratedScheduler(
            scheduler, mine or self._optimizers, self.gradient_state, self.num_processes,
            split_batches=self.split_batches, step_with_optimizer=self.step_scheduler_with_optimizer,
        )
        self._schedulers.append(wrapped)
        if self._snapshots is not None:
            self._snapshots.watch_scheduler(wrapped)
        return mark_prepared(wrapped)

    def prepare_data_loader(self, loader: DataLoader, device_placement: bool | None = None) -> DataLoaderShard:
        """Shard ``loader`` across processes (see ``data``)."""
        place = device_placement if device_placement is not None else self.device_placement
        shard = shard_data_loader(
            loader, num_processes=self.num_processes, process_index=self.process_index,
            device=self.device if place else None, gradient_state=self.gradient_state,
            loader_index=len(self._dataloaders), collective_device=self.device, **self.dataloader_config.shard_kwargs())
        self._dataloaders.append(shard)
        return mark_prepared(shard)

    def skip_first_batches(self, dataloader: DataLoaderShard, num_batches: int | None = None) -> DataLoaderShard:
        """A loader that skips the first ``num_batches`` (default: where ``load_state`` left off)."""
        return skip_first_batches(dataloader, num_batches)

    # ---- training step ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled under fp16 (the strategy's)."""
        self.strategy.backward(loss, self.scaler, **kwargs)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One micro-step: gradients sync (and the optimizer steps) every N-th time, or at the loader's end."""
        self.gradient_state.do_sync()
        with contextlib.ExitStack() as stack:
            if not (self.gradient_state.sync_gradients or self.sync_each_batch):
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip the gradients' synchronisation inside the block (DDP's all-reduce; the strategy's)."""
        return self.strategy.no_sync(model)

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Make the next backward all-reduce DDP gradients although the forward ran under ``no_sync``
        (wrap the last of several backwards; a null context when ``model`` is not DDP-wrapped)."""
        return self.strategy.trigger_sync_in_backward(model)

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager[Any]:
        """Autocast for this accelerator's mixed precision and device (``autocast_handler.enabled``:
        the peer's ``AutocastKwargs``)."""
        enabled = getattr(autocast_handler, "enabled", True)
        return precision.autocast_context(self.mixed_precision, self.device, enabled=enabled)

    def unscale_gradients(self) -> None:
        """Unscale fp16 gradients before inspecting them (done once per optimizer step)."""
        if self.scaler is not None and self.sync_gradients:
            precision.unscale(self.scaler, [opt.optimizer for opt in self._optimizers])

    def _settle_gradients(self) -> None:
        """Make the gradients final before they are inspected: unscaled (fp16), then as the strategy
        has them at a step (``Strategy.settle_gradients``)."""
        self.unscale_gradients()
        if self.sync_gradients:
            self.strategy.settle_gradients(self._optimizers)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Unscale (fp16), then clip as the strategy does (FSDP2: the global norm; DeepSpeed: the
        engine's ``gradient_clipping``); returns the total norm."""
        self._settle_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Unscale (fp16), then ``torch.nn.utils.clip_grad_value_`` (``ValueError`` under DeepSpeed)."""
        self._settle_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value)

    # ---- collectives and process control ------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate tensors (nested) from all processes along dim 0."""
        return ops.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``gather``, dropping the duplicates that ``even_batches`` added to the last batch."""
        ending = self.gradient_state.end_of_dataloader
        return ops.gather_for_metrics(input_data, use_gather_object, self.gradient_state.remainder if ending else 0)

    def gather_object(self, obj: Any) -> list[Any]:
        """Gather picklable objects from all processes (lists are flattened)."""
        return ops.gather_object(obj)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce tensors (nested): ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"none"``."""
        return ops.reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False) -> Any:
        """Pad tensors (nested) to the largest size along ``dim`` on any process."""
        return ops.pad_across_processes(tensor, dim, pad_index, pad_first)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        """Overwrite tensors (nested) with those of ``from_process``."""
        return ops.broadcast(tensor, from_process)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        self.state.print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """Barrier across all processes."""
        self.state.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.local_main_process_first()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> contextlib.AbstractContextManager[Any]:
        return self.state.split_between_processes(inputs, apply_padding)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.on_local_main_process(function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.on_process(function, process_index=self.num_processes - 1)

    def on_process(self, function: Callable[..., Any] | None = None, *, process_index: int) -> Any:
        return self.state.on_process(function, process_index=process_index)

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Let DDP models train on loaders of different lengths (``torch.distributed.algorithms.Join``).

        ``even_batches`` (when given) overrides the setting of the loaders prepared so far,
        for the duration of the block.
        """
        with even_batches_for(self._dataloaders, even_batches), self.strategy.join_uneven_inputs(joinables):
            yield

    def set_trigger(self) -> None:
        """Raise a flag on this process that ``check_trigger`` sees on every process."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """Whether any process called ``set_trigger`` since the last check (resets it)."""
        flag = self.flag_tensor if self.flag_tensor is not None else torch.tensor(0, device=self.device)
        fired = bool(ops.reduce(flag, "sum").item() >= 1)
        self.flag_tensor = None
        return fired

    # ---- models and checkpoints ---------------------------------------------------------
    def unwrap_model(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool = True) -> torch.nn.Module:
        """The user's module inside DDP; optionally without the autocast forward. A compiled model stays
        compiled with ``keep_torch_compile`` (as the peer), else comes back plain (no ``_orig_mod.``
        keys); an FSDP-sharded one comes back as a full, plain copy (every process must call it)."""
        return self.strategy.unwrap(model, keep_fp32_wrapper, keep_torch_compile)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The model's state dict (of the unwrapped model by default), on the CPU-visible device.

        Under FSDP: the full weights, gathered on the main process's CPU (``{}`` on the others);
        every process must call it. A dispatched model's offloaded weights are read in (to the CPU).
        """
        return self.strategy.model_state_dict(model, unwrap)

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save ``obj`` on the main process (``torch.save``, or safetensors for a tensor dict: tensors
        sharing memory stored once); on each machine's with ``ProjectConfiguration(save_on_each_node=True)``.

        Tensors go to the CPU first where the device needs it (XLA), so the file loads without its runtime.
        """
        obj = self.strategy.to_cpu(obj)
        on_each_node = self.project_configuration.save_on_each_node
        if self.is_local_main_process if on_each_node else self.is_main_process:
            save_object(obj, Path(f), safe_serialization)

    def save_model(self, model: torch.nn.Module, save_directory: str | os.PathLike[str],
                   max_shard_size: int | str = "10GB", safe_serialization: bool = True) -> Path | None:
        """Save the unwrapped model's weights on the main process; returns the file (else ``None``).

        ``model.safetensors`` (tied weights stored once) or, with ``safe_serialization=False``,
        ``pytorch_model.bin``; written to a temporary name, then renamed. Above
        ``max_shard_size`` (bytes, or ``"10GB"``, ``"500MB"``...) the weights are split into
        ``model-00001-of-0000N.safetensors``... and the returned index file maps each weight to its shard.
        """
        state = self.strategy.to_cpu(self.get_state_dict(model))
        if not self.is_main_process:
            return None
        return save_weights(state, Path(save_directory), safe_serialization, max_shard_size)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Add objects with ``state_dict`` / ``load_state_dict`` to ``save_state`` (``ValueError`` naming
        every object that lacks them)."""
        self._custom_objects.extend(orchestration.checkpointable(objects))
        if self._auto_resume is not None:
            self._auto_resume.after_prepare(self)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` at the start of every ``save_state``.

        ``weights`` holds the models' state dicts; a hook may change it or remove entries
        (with the matching ``models`` entries) to save something else or nothing.
        Returns a handle whose ``remove()`` unregisters the hook.
        """
        return self._state_hooks.add(self._state_hooks.save, hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` at the start of every ``load_state``.

        A hook may remove entries from ``models`` to load them itself. Returns a removable handle.
        """
        return self._state_hooks.add(self._state_hooks.load, hook)

    def save_state(self, output_dir: str | os.PathLike[str] | None = None,
                   safe_serialization: bool = True) -> Path:
        """Atomically checkpoint models, optimizers, schedulers, loaders, scaler and RNGs (all processes call it).

        Without ``output_dir``: the next automatic checkpoint when ``automatic_checkpoint_naming``
        is on (older ones beyond ``total_limit`` are removed), else ``<project_dir>/checkpoint``.
        The peer's layout (``checkpoint.layout``): the peer loads it, and ``load_state`` loads the
        peer's. ``safe_serialization`` (the default, as the peer's) stores the models as safetensors
        (``model.safetensors``...), else ``pytorch_model.bin``...; ``load_state`` reads either.
        """
        return orchestration.save_accelerator_state(self, output_dir, safe_serialization)

    def load_state(self, input_dir: str | os.PathLike[str] | None = None, weights_only: bool = True,
                   *, strict: bool = True) -> Path:
        """Restore what ``save_state`` wrote (default: the latest automatic checkpoint, or ``<project_dir>/checkpoint``).

        ``weights_only=False`` can run code from the files: use it on trusted checkpoints only.
        ``strict=False`` (the peer's ``load_model_func_kwargs``) accepts model weights missing from or
        extra to the checkpoint, e.g. one a save hook cut down to a LoRA adapter; unsharded models only.
        """
        return orchestration.load_accelerator_state(self, input_dir, weights_only, strict)

    def snapshot_every(self, steps: int | None = None, seconds: float | None = None,
                       dir: str | os.PathLike[str] | None = None, keep: int = 2) -> None:  # noqa: A002 - the issue's name
        """Snapshot the training state every ``steps`` optimizer steps and/or ``seconds``, in the background.

        At the end of a step where one falls due, everything ``save_state`` saves (models, optimizers,
        schedulers, RNG, registered objects, the loaders' positions, the step) is copied to host memory;
        only that copy holds training up. Each rank then writes its part in a background thread, in
        ``save_state``'s layout, into ``dir/snapshot_<step>``, atomically (a half-written snapshot is
        never the newest); the newest ``keep`` are kept. ``resume()`` loads the newest. Every process
        must call it (after or before ``prepare``).

        Args:
            steps: every this many optimizer steps (of every prepared optimizer; accumulation's
                micro-steps are not steps).
            seconds: when this many seconds have passed since the last snapshot (rank 0's clock).
            dir: any local path every rank sees (a mounted Drive folder is one); default the
                launch option ``snapshot_dir`` (``snapshot_dir:`` in the config file), else
                ``<project_dir>/snapshots``, else ``./snapshots/<run>`` (``$NOTEBOOK_ACCEL_RUN_NAME``,
                else ``default``).
            keep: how many complete snapshots to keep.

        Raises:
            ValueError: neither ``steps`` nor ``seconds``, a bad value, a sharding strategy (FSDP2,
                DeepSpeed: not built yet), or a directory some rank does not see.

        Example:
            >>> accelerator.snapshot_every(steps=200)
            >>> for step in range(accelerator.resume(), total_steps):
            ...     ...
        """
        directory = snapshot_place.snapshot_directory(self.project_dir, dir)
        if self._snapshots is not None:
            self._snapshots.wait()
        self._snapshots = snapshots.Snapshots(self, steps, seconds, directory, keep)
        self._snapshots.restart_at(self._resumed_at)

    def resume(self, dir: str | os.PathLike[str] | None = None) -> int:  # noqa: A002 - as snapshot_every's
        """Load the newest complete snapshot (``snapshot_every``'s directory, or ``dir``, or the default
        one) and return the optimizer step to go on from (0 if there is none), saying so in one line.

        The prepared loaders' next pass leaves out the batches already seen, so a loop reads
        ``for step in range(accelerator.resume(), total_steps)``. Call it after ``prepare`` (every
        process). A snapshot of another world size, strategy or model shape is refused (``ValueError``
        naming the difference).
        """
        self._resumed_at = resume.resume(self, self._snapshot_directory(dir))
        if self._snapshots is not None:
            self._snapshots.restart_at(self._resumed_at)
        return self._resumed_at

    @property
    def resumed_step(self) -> int:
        """The optimizer step the last resume went on from (``resume()``, or ``Accelerator(resume="auto")``
        once ``prepare`` has loaded the snapshot); 0 when nothing was resumed. The loop:
        ``for step in range(accelerator.resumed_step, total_steps)``."""
        return self._resumed_at

    def _snapshot_directory(self, dir: str | os.PathLike[str] | None = None) -> Path:  # noqa: A002
        """``dir``, else the snapshot schedule's directory, else the default one (``snapshot_place``)."""
        if dir is None and self._snapshots is not None:
            return self._snapshots.directory
        return snapshot_place.snapshot_directory(self.project_dir, dir)

    def _arrived(self) -> None:
        """This Accelerator was copied into a new process (a warm pool's heal): set up what
        belongs to a process: which states ``AcceleratorState()`` / ``GradientState()`` answer
        with (``runtime.latest``), and the snapshot schedule's count of the optimizers' steps."""
        AcceleratorState.adopt(self.state)
        GradientState.adopt(self.gradient_state)
        if self._snapshots is not None:
            self._snapshots.watch_all()

    def wait_for_snapshots(self) -> None:
        """Wait until the snapshot being written (if any) is on disk."""
        if self._snapshots is not None:
            self._snapshots.wait()

    def profile(self, profile_handler: ProfileKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """Profile the block with ``torch.profiler`` (settings: ``profile_handler``, else the
        ``ProfileKwargs`` among ``kwargs_handlers``); yields the profiler. With ``output_trace_dir``
        each process writes ``profile_<process_index>.json`` there."""
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        return profiling.profile(handler, self.process_index, self.wait_for_everyone)

    def free_memory(self, *objects: Any) -> list[None]:
        """Forget prepared objects, collect garbage, empty the CUDA cache; returns ``None`` for each object."""
        self.strategy.release()
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self.step = 0
        return release_memory(*objects)

    clear = free_memory

    # ---- trackers -----------------------------------------------------------------------
    def init_trackers(self, project_name: str, config: dict[str, Any] | None = None,
                      init_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Start the ``log_with`` trackers on the main process and record ``config``."""
        if self.is_main_process:
            self.trackers = run_trackers.start(self.log_with, project_name, self.logging_dir, config, init_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The started tracker called ``name`` (``unwrap``: the library's own run); see ``run_trackers.find``."""
        return run_trackers.find(self.trackers, name, unwrap)

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None) -> None:
        """Send ``values`` to every tracker (main process only) and to the notebook's live plots."""
        run_trackers.log(self.trackers, values, step, log_kwargs, self.is_main_process)

    def end_training(self) -> None:
        """Finish every tracker, wait for all processes, then destroy the process group (as the peer)."""
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        self.wait_for_snapshots()
        self.wait_for_everyone()
        self.state.destroy_process_group()


# the peer's ``accelerate.accelerator`` also holds names other modules own (gather, PartialState...)
_peer_paths.add_peer_names(sys.modules[__name__])
