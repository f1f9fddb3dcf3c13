"""``Accelerator``: the peer's training-loop surface, as a thin composition of small parts.

The strategy (``strategies/``) decides how the models train; state and process control
come from ``runtime.state.PartialState``, mixed precision from ``runtime.precision``,
optimizer/scheduler wrappers from ``runtime.optim``, collectives from ``runtime.ops``, data
sharding from ``data/``, checkpoints from ``checkpoint/`` and trackers from
``observe.tracking``. Every ``Accelerator`` owns its own bookkeeping, so several in
one process never interfere. Its surface is in parts, one job each (``accelerating/``):
``prepare`` (``preparing``), the training step (``training_step``), collectives and process
control (``process_control``), weights and ``save_state`` (``saving``), background snapshots
and ``resume`` (``snapshotting``); this module holds the settings, where the process stands,
profiling, memory and trackers.

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
from pathlib import Path
from typing import Any

import torch

from notebook_accel import _peer_paths
from notebook_accel.accelerating.forwarding import forwarded
from notebook_accel.accelerating.preparing import Preparing
from notebook_accel.accelerating.process_control import ProcessControl
from notebook_accel.accelerating.saving import Saving
from notebook_accel.accelerating.snapshotting import Snapshotting
from notebook_accel.accelerating.training_step import TrainingStep
from notebook_accel.checkpoint import auto_resume, orchestration, snapshots
from notebook_accel.checkpoint.project import ProjectConfiguration
from notebook_accel.data.prepare import DataLoaderConfiguration, DataLoaderShard
from notebook_accel.machine.versions import check_os_kernel
from notebook_accel.observe import run_trackers, tracking
from notebook_accel.runtime import precision, profiling
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
from notebook_accel.strategies.base import StrategyContext
from notebook_accel.strategies.registry import select


class Accelerator(Preparing, TrainingStep, ProcessControl, Saving, Snapshotting):
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

    def __repr__(self) -> str:
        return f"Accelerator({self.state!r}, mixed_precision={self.mixed_precision!r})"

    # ---- where am I: the peer's names for facts its parts own --------------------------
    device = forwarded("state", "device")
    process_index = forwarded("state", "process_index")
    local_process_index = forwarded("state", "local_process_index")
    num_processes = forwarded("state", "num_processes")
    is_main_process = forwarded("state", "is_main_process")
    is_local_main_process = forwarded("state", "is_local_main_process")
    is_last_process = forwarded("state", "is_last_process")
    use_distributed = forwarded("state", "use_distributed")
    distributed_type = forwarded("strategy", "distributed_type")
    ddp_kwargs = forwarded("strategy.context", "ddp_kwargs", settable=True, doc=(
        "Extra ``DistributedDataParallel`` arguments (the strategy reads them when it wraps a model)."))
    split_batches = forwarded("dataloader_config", "split_batches")
    even_batches = forwarded("dataloader_config", "even_batches")
    sync_gradients = forwarded("gradient_state", "sync_gradients", settable=True,
                               doc="Whether this step's gradients are synchronised and the optimizer steps.")
    gradient_accumulation_steps = forwarded("gradient_state", "num_steps", settable=True)

    @property
    def deepspeed_config(self) -> dict[str, Any] | None:
        """The DeepSpeed config (``"auto"`` values filled once a model is prepared), or ``None``."""
        return self.strategy.resolved_config()

    @property
    def project_dir(self) -> Path | None:
        directory = self.project_configuration.project_dir
        return None if directory is None else Path(directory)

    @property
    def logging_dir(self) -> str | os.PathLike[str] | None:
        """Where trackers write: the project configuration's ``logging_dir``, else ``project_dir``."""
        project = self.project_configuration
        return project.logging_dir if project.logging_dir is not None else project.project_dir

    # ---- the rest of the surface: preparing, training_step, process_control, saving, snapshotting
    def _arrived(self) -> None:
        """This Accelerator was copied into a new process (a warm pool's heal): set up what
        belongs to a process: which states ``AcceleratorState()`` / ``GradientState()`` answer
        with (``runtime.latest``), and the snapshot schedule's count of the optimizers' steps."""
        AcceleratorState.adopt(self.state)
        GradientState.adopt(self.gradient_state)
        if self._snapshots is not None:
            self._snapshots.watch_all()

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
