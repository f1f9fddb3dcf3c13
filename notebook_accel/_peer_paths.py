"""The peer's module paths (Hugging Face Accelerate's), importable under our name.

A user switching from Accelerate changes ``accelerate`` to ``notebook_accel`` in an import
and keeps it working: ``from notebook_accel.state import PartialState``, ``from
notebook_accel.data_loader import prepare_data_loader``, ``notebook_accel.fsdp.state_dict``...
Each such path is the module that owns the concept, under a second name: the same module
object (patching either name patches both; ``isinstance`` holds), and its classes keep their
real ``__module__``, so pickles name the real path. A package's submodules come with it.

``notebook_accel.accelerator`` and ``notebook_accel.utils`` are modules of their own (the
``Accelerator``; the ``accelerate.utils`` re-exports); every other module path is internal.
The peer's ``accelerate.checkpointing`` has no path here: its functions have other names
(``save_state`` / ``load_state`` are ``Accelerator`` methods).

A peer module also holds names another of our modules owns (``accelerate.state.GradientState``,
``accelerate.accelerator.gather``...): ``PEER_NAMES`` lists them per path, and the module serving
the path resolves them on first access (``add_peer_names``), so they stay the owner's objects.

The peer's logger names, one rule: a module of ours that logs what a peer module logs gets its
logger from ``peer_logger(__name__)``; it keeps our module's name and is heard under that peer
module's logger name as well (``PEER_LOGGERS``: ``accelerate.utils.environment``...). A level set
on that logger or an ``accelerate.*`` ancestor silences ours, its handlers see our records, and its
``propagate = False`` stops them there, as for the peer's own; then the record goes on through our
names to the root logger, once.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

# the peer's path, under our name -> the module that owns it
PEER_PATHS: dict[str, str] = {
    "notebook_accel.state": "notebook_accel.runtime.state",
    "notebook_accel.optimizer": "notebook_accel.runtime.optim",
    "notebook_accel.scheduler": "notebook_accel.runtime.optim",
    "notebook_accel.test_utils": "notebook_accel.runtime.testing",
    "notebook_accel.data_loader": "notebook_accel.data.loader",
    "notebook_accel.logging": "notebook_accel.observe.logging",
    "notebook_accel.tracking": "notebook_accel.observe.tracking",
    "notebook_accel.big_modeling": "notebook_accel.big_model",
    "notebook_accel.hooks": "notebook_accel.big_model.model_hooks",
    "notebook_accel.fsdp": "notebook_accel.strategies.fsdp",
    "notebook_accel.local_sgd": "notebook_accel.strategies.local_sgd",
}

_AVAILABILITY = "notebook_accel.machine.availability"
# the peer path -> {the module that owns them -> names the peer's module has there, which its
# serving module does not define}: the public names of the peer's module we have
PEER_NAMES: dict[str, dict[str, str]] = {
    "notebook_accel.state": {
        "notebook_accel.runtime.accelerator_state": "AcceleratorState",
        "notebook_accel.runtime.gradient_state": "GradientState",
        "notebook_accel.runtime.plugins": "GradientAccumulationPlugin",
        "notebook_accel.runtime.dynamo": "DynamoBackend",
        _AVAILABILITY: "is_datasets_available is_deepspeed_available is_hpu_available is_mlu_available "
                       "is_mps_available is_musa_available is_npu_available is_sdaa_available "
                       "is_torch_xla_available is_xpu_available",
    },
    "notebook_accel.optimizer": {
        "notebook_accel.runtime.ops": "honor_type",
        "notebook_accel.runtime.accelerator_state": "AcceleratorState",
        "notebook_accel.runtime.state": "DistributedType",
        _AVAILABILITY: "is_torch_xla_available",
    },
    "notebook_accel.scheduler": {"notebook_accel.runtime.accelerator_state": "AcceleratorState"},
    "notebook_accel.data_loader": {
        _AVAILABILITY: "is_datasets_available is_torch_xla_available is_torchdata_stateful_dataloader_available",
        "notebook_accel.machine.versions": "compare_versions is_torch_version",
        "notebook_accel.observe.logging": "get_logger",
        "notebook_accel.runtime.helpers": "concatenate find_batch_size",
        "notebook_accel.runtime.ops": "broadcast broadcast_object_list send_to_device",
        "notebook_accel.runtime.rng_sync": "RNGType synchronize_rng_states",
        "notebook_accel.runtime.state": "DistributedType",
    },
    "notebook_accel.tracking": {
        "notebook_accel.flags": "str_to_bool",
        _AVAILABILITY: "is_mlflow_available is_tensorboard_available is_wandb_available",
        "notebook_accel.machine.versions": "compare_versions",
        "notebook_accel.observe.logging": "get_logger",
        "notebook_accel.runtime.helpers": "listify",
        "notebook_accel.runtime.state": "PartialState",
    },
    "notebook_accel.big_modeling": {
        "notebook_accel.big_model.modeling": "check_device_map find_tied_parameters retie_parameters",
        "notebook_accel.big_model.align_hooks": "AlignDevicesHook attach_align_device_hook "
                                                "attach_align_device_hook_on_blocks",
        "notebook_accel.big_model.cpu_offload_hooks": "CpuOffload UserCpuOffloadHook",
        "notebook_accel.big_model.model_hooks": "add_hook_to_module",
        "notebook_accel.big_model.dat_offload": "OffloadedWeightsLoader extract_submodules_state_dict "
                                                "offload_state_dict",
        "notebook_accel.big_model.layerwise_casting": "LayerwiseCastingHook SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
        _AVAILABILITY: "is_bnb_available is_mlu_available is_musa_available is_npu_available "
                       "is_sdaa_available is_xpu_available",
    },
    "notebook_accel.hooks": {
        "notebook_accel.big_model.align_hooks": "AlignDevicesHook attach_align_device_hook "
                                                "attach_align_device_hook_on_blocks attach_execution_device_hook",
        "notebook_accel.big_model.cpu_offload_hooks": "CpuOffload UserCpuOffloadHook",
        "notebook_accel.big_model.dat_offload": "PrefixedDataset",
        "notebook_accel.big_model.tensor_placement": "get_non_persistent_buffers named_module_tensors "
                                                     "set_module_tensor_to_device",
        "notebook_accel.big_model.layerwise_casting": "LayerwiseCastingHook",
        "notebook_accel.runtime.state": "PartialState",
        "notebook_accel.utils": "clear_device_cache find_device send_to_device",
        _AVAILABILITY: "is_mlu_available is_musa_available is_npu_available",
    },
    "notebook_accel.local_sgd": {"notebook_accel.accelerator": "Accelerator"},
    "notebook_accel.accelerator": {
        "notebook_accel.data.dispatch": "DataLoaderDispatcher",
        "notebook_accel.data.prepare": "skip_first_batches",
        "notebook_accel.data.loader": "prepare_data_loader",
        _AVAILABILITY: "is_bf16_available is_deepspeed_available is_mlu_available is_musa_available "
                       "is_npu_available is_torch_xla_available is_xpu_available",
        "notebook_accel.machine.versions": "compare_versions is_torch_version",
        "notebook_accel.observe.logging": "get_logger",
        "notebook_accel.observe.tracking": "GeneralTracker LOGGER_TYPE_TO_CLASS",
        "notebook_accel.runtime.compilation": "compile_regions is_compiled_module",
        "notebook_accel.runtime.dynamo": "DynamoBackend",
        "notebook_accel.utils": "compile_regions_deepspeed compile_regions_fsdp2 check_os_kernel get_model_tp_size "
                                "has_offloaded_params save",
        "notebook_accel.big_model.modeling": "get_state_dict_offloaded_model",
        "notebook_accel.runtime.helpers": "convert_outputs_to_fp32 extract_model_from_parallel wait_for_everyone",
        "notebook_accel.runtime.ops": "gather gather_object pad_across_processes recursively_apply reduce",
        "notebook_accel.runtime.plugins": "AutocastKwargs DistributedDataParallelKwargs GradScalerKwargs "
                                          "GradientAccumulationPlugin KwargsHandler InitProcessGroupKwargs",
        "notebook_accel.runtime.profiling": "PROFILE_PATTERN_NAME",
        "notebook_accel.runtime.rng_sync": "RNGType",
        "notebook_accel.runtime.state": "DistributedType PartialState",
        "notebook_accel.strategies.deepspeed.plugin": "DeepSpeedPlugin DummyOptim DummyScheduler",
        "notebook_accel.strategies.fsdp.plugin": "FullyShardedDataParallelPlugin",
    },
}


def real_name(name: str) -> str | None:
    """The module ``name`` stands for (``"notebook_accel.fsdp.plugin"`` ->
    ``"notebook_accel.strategies.fsdp.plugin"``), or ``None`` if it is no peer path."""
    for alias, real in PEER_PATHS.items():
        if name == alias or name.startswith(alias + "."):
            return real + name[len(alias):]
    return None


class _PeerPathFinder:
    """Imports a peer path as the module it stands for (that module, not a copy): a meta path
    finder and its loader (``importlib.abc``'s protocols, without importing that module)."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        return ModuleSpec(name, self) if real_name(name) else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(real_name(spec.name))
        add_peer_names(module)
        spec.loader_state = module.__spec__  # the import system sets __spec__ to ours next
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state  # the real path again (reload, pickle)


def peer_names(module_name: str) -> dict[str, str]:
    """The names ``PEER_NAMES`` gives the module ``module_name`` (under any of its peer paths),
    each with the module that owns it."""
    names: dict[str, str] = {}
    for path, owners in PEER_NAMES.items():
        if path == module_name or real_name(path) == module_name:
            for owner, listed in owners.items():
                names.update(dict.fromkeys(listed.split(), owner))
    return names


def add_peer_names(module: ModuleType) -> None:
    """Let ``module`` answer its ``peer_names``: imported from their owner on first access
    (the owner's object, kept in ``module``), after the module's own ``__getattr__``, if any."""
    names = peer_names(module.__name__)
    own = module.__dict__.get("__getattr__")
    if not names or getattr(own, "peer_names", None) is not None:  # none, or already added
        return
    namespace = module.__dict__

    def __getattr__(name: str) -> object:
        owner = names.get(name)
        if owner is None:
            if own is not None:
                return own(name)
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(owner), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    __getattr__.peer_names = names  # type: ignore[attr-defined]
    namespace["__getattr__"], namespace["__dir__"] = __getattr__, __dir__


def install() -> None:
    """Make the peer paths importable (once per interpreter; ``notebook_accel`` calls it)."""
    if not any(isinstance(finder, _PeerPathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PeerPathFinder())


# our module that logs -> the peer module that logs the same messages (its logger's name)
PEER_LOGGERS: dict[str, str] = {
    "notebook_accel.runtime.helpers": "accelerate.utils.environment",
    "notebook_accel.big_model.loading": "accelerate.utils.modeling",
    "notebook_accel.big_model.planner": "accelerate.utils.modeling",
    "notebook_accel.checkpoint.weight_shards": "accelerate.utils.other",
    "notebook_accel.machine.versions": "accelerate.utils.other",
    "notebook_accel.observe.mlflow_tracker": "accelerate.tracking",
}


class _AlsoPeerLogger(logging.Filter):
    """On one of our module loggers: the record passes through the peer's logger ``peer`` and its
    ancestors (not the root, which ours reach) before it goes on through ours."""

    def __init__(self, peer: str) -> None:
        super().__init__()
        self.peer = peer

    def filter(self, record: logging.LogRecord) -> bool:
        chain = []
        node: logging.Logger | None = logging.getLogger(self.peer)
        while node is not None and node is not logging.root:
            chain.append(node)
            node = node.parent
        level = next((n.level for n in chain if n.level), logging.NOTSET)
        if record.levelno < level or any(n.disabled for n in chain):
            return False  # silenced under the peer's name
        for node in chain:
            for handler in node.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
            if not node.propagate:
                return False
        return True


def peer_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` for our module ``name``, heard under its peer module's logger
    name as well (``PEER_LOGGERS``; the rule: this module's docstring).

    Raises:
        KeyError: ``name`` is not in ``PEER_LOGGERS`` (add it there, with the peer's module).
    """
    if name not in PEER_LOGGERS:
        raise KeyError(f"{name!r} has no peer logger name: add it to PEER_LOGGERS in {__name__}")
    logger = logging.getLogger(name)
    if not any(isinstance(f, _AlsoPeerLogger) for f in logger.filters):
        logger.addFilter(_AlsoPeerLogger(PEER_LOGGERS[name]))
    return logger
