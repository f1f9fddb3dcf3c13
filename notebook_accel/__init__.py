"""notebook_accel: distributed PyTorch training started from inside a notebook.

Public names are imported lazily, so ``import notebook_accel`` stays cheap in the
kernel and does not import torch until something needs it.
"""

from __future__ import annotations

from typing import Any

from notebook_accel import _peer_paths
from notebook_accel._lazy import lazy_exports
from notebook_accel._version import __version__ as __version__
from notebook_accel.launch.views import register_front_end

_peer_paths.install()  # notebook_accel.state, .data_loader, .fsdp...: the peer's module paths

_EXPORTS = {
    "notebook_launcher": "notebook_accel.launch.launcher",
    "WorkerPool": "notebook_accel.launch.pools.pool",
    "WorkerError": "notebook_accel.launch.supervision.errors",
    "last_launch": "notebook_accel.launch.views.record",
    "tqdm": "notebook_accel.observe.progress",
    "PartialState": "notebook_accel.runtime.state",
    "DistributedType": "notebook_accel.runtime.state",
    "DataLoaderConfiguration": "notebook_accel.data.prepare",
    "ProjectConfiguration": "notebook_accel.checkpoint.project",
    "Accelerator": "notebook_accel.accelerator",
    "set_seed": "notebook_accel.runtime.seeding",
    "get_logger": "notebook_accel.observe.logging",
    "LaunchConfig": "notebook_accel.config",
    "load_config": "notebook_accel.config",
    "save_config": "notebook_accel.config",
    "AcceleratorState": "notebook_accel.runtime.accelerator_state",
    "GradientState": "notebook_accel.runtime.gradient_state",
    "GradientAccumulationPlugin": "notebook_accel.runtime.plugins",
    "KwargsHandler": "notebook_accel.runtime.plugins",
    "DistributedDataParallelKwargs": "notebook_accel.runtime.plugins",
    "GradScalerKwargs": "notebook_accel.runtime.plugins",
    "InitProcessGroupKwargs": "notebook_accel.runtime.plugins",
    "AutocastKwargs": "notebook_accel.runtime.plugins",
    "DDPCommunicationHookType": "notebook_accel.runtime.plugins",
    "ProfileKwargs": "notebook_accel.runtime.profiling",
    "TorchDynamoPlugin": "notebook_accel.runtime.dynamo",
    "DynamoBackend": "notebook_accel.runtime.dynamo",
    "find_executable_batch_size": "notebook_accel.runtime.memory",
    "synchronize_rng_states": "notebook_accel.runtime.rng_sync",
    "SeedableRandomSampler": "notebook_accel.data.samplers",
    "SkipBatchSampler": "notebook_accel.data.samplers",
    "SkipDataLoader": "notebook_accel.data.skip",
    "DataLoaderDispatcher": "notebook_accel.data.dispatch",
    "BatchSamplerShard": "notebook_accel.data.loader",
    "prepare_data_loader": "notebook_accel.data.loader",
    "skip_first_batches": "notebook_accel.data.prepare",
    "debug_launcher": "notebook_accel.launch.debug",
    "init_empty_weights": "notebook_accel.big_model",
    "init_on_device": "notebook_accel.big_model",
    "compute_module_sizes": "notebook_accel.big_model",
    "get_max_memory": "notebook_accel.big_model",
    "get_balanced_memory": "notebook_accel.big_model",
    "infer_auto_device_map": "notebook_accel.big_model",
    "load_checkpoint_in_model": "notebook_accel.big_model",
    "dispatch_model": "notebook_accel.big_model",
    "undispatch_model": "notebook_accel.big_model",
    "load_checkpoint_and_dispatch": "notebook_accel.big_model",
    "cpu_offload": "notebook_accel.big_model",
    "disk_offload": "notebook_accel.big_model",
    "cpu_offload_with_hook": "notebook_accel.big_model",
    "FullyShardedDataParallelPlugin": "notebook_accel.strategies.fsdp.plugin",
    "merge_fsdp_weights": "notebook_accel.strategies.fsdp.state_dict",
    "DeepSpeedPlugin": "notebook_accel.strategies.deepspeed.plugin",
}

__all__ = sorted(_EXPORTS)


def _deferred_interrupts() -> Any:
    from notebook_accel.launch.control.interrupts import deferred_interrupts

    return deferred_interrupts()


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), guard=_deferred_interrupts)


def _front_end() -> Any:
    """The engine's one door into the notebook front end: the ``magics`` package, imported
    on first use (by ``%load_ext notebook_accel``, and by a launch inside a kernel, for
    the live view that ``magics`` registers with the engine when it is imported)."""
    import magics

    return magics


register_front_end(_front_end)  # the engine opens the front end through this door, never by import


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_accel``: register the ``%%accelerate`` magics."""
    _front_end().load_ipython_extension(ipython)
