"""Where a user switching from ``accelerate.utils`` finds the helpers: a re-export module, no code of its own.

Also serves the peer's ``accelerate.utils.dataclasses`` and
``accelerate.utils.operations`` names (the same objects). ``merge_fsdp_weights`` is imported
on first use (torch's distributed checkpoint is slow to import).
"""

from notebook_accel.big_model import (
    compute_module_sizes,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    load_checkpoint_in_model,
)
from notebook_accel.big_model.align_hooks import align_module_device, has_offloaded_params
from notebook_accel.big_model.dat_offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from notebook_accel.big_model.layerwise_casting import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
from notebook_accel.big_model.modeling import (
    check_device_map,
    clean_device_map,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_module_size_with_ties,
    get_state_dict_offloaded_model,
    retie_parameters,
)
from notebook_accel.big_model.tensor_placement import (
    get_non_persistent_buffers,
    named_module_tensors,
    set_module_tensor_to_device,
)
from notebook_accel.checkpoint.project import ProjectConfiguration
from notebook_accel.checkpoint.saving import save
from notebook_accel.data.prepare import DataLoaderConfiguration
from notebook_accel.flags import str_to_bool
from notebook_accel.machine.availability import (
    is_bf16_available,
    is_bnb_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_fp16_available,
    is_hpu_available,
    is_ipex_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_npu_available,
    is_numpy_available,
    is_peft_available,
    is_pytest_available,
    is_rocm_available,
    is_safetensors_available,
    is_schedulefree_available,
    is_sdaa_available,
    is_tensorboard_available,
    is_torch_xla_available,
    is_torchdata_available,
    is_torchdata_stateful_dataloader_available,
    is_transformers_available,
    is_wandb_available,
    is_xpu_available,
)
from notebook_accel.machine.versions import check_os_kernel, compare_versions, is_torch_version
from notebook_accel.observe.progress import tqdm
from notebook_accel.runtime.compilation import (
    compile_regions,
    has_compiled_regions,
    is_compiled_module,
)
from notebook_accel.runtime.compilation import compile_regions_in_place as compile_regions_deepspeed
from notebook_accel.runtime.compilation import compile_regions_in_place as compile_regions_fsdp2
from notebook_accel.runtime.dynamo import DynamoBackend, TorchDynamoPlugin
from notebook_accel.runtime.helpers import (
    clear_environment,
    concatenate,
    convert_dict_to_env_variables,
    convert_outputs_to_fp32,
    copy_tensor_to_devices,
    extract_model_from_parallel,
    find_batch_size,
    find_device,
    get_model_tp_size,
    listify,
    pad_input_tensors,
    patch_environment,
    purge_accelerate_environment,
    wait_for_everyone,
)
from notebook_accel.runtime.memory import (
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)
from notebook_accel.runtime.op_checks import DistributedOperationException
from notebook_accel.runtime.ops import (
    CannotPadNestedTensorWarning,
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    honor_type,
    is_namedtuple,
    is_torch_tensor,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
)
from notebook_accel.runtime.plugins import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
)
from notebook_accel.runtime.precision import convert_to_fp32
from notebook_accel.runtime.profiling import PROFILE_PATTERN_NAME, ProfileKwargs
from notebook_accel.runtime.rng_sync import RNGType, synchronize_rng_state, synchronize_rng_states
from notebook_accel.runtime.seeding import set_seed
from notebook_accel.runtime.state import DistributedType
from notebook_accel.strategies.deepspeed.plugin import DeepSpeedPlugin, DummyOptim, DummyScheduler
from notebook_accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

__all__ = [
    "AutocastKwargs", "DDPCommunicationHookType", "DataLoaderConfiguration", "DistributedDataParallelKwargs", "DistributedOperationException",
    "DistributedType", "DynamoBackend", "GradScalerKwargs", "GradientAccumulationPlugin", "KwargsHandler", "ProfileKwargs",
    "DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "InitProcessGroupKwargs", "PROFILE_PATTERN_NAME", "tqdm",
    "CannotPadNestedTensorWarning", "check_os_kernel", "convert_dict_to_env_variables", "get_model_tp_size",
    "has_offloaded_params", "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING", "honor_type", "is_namedtuple", "is_torch_tensor", "save",
    "align_module_device", "check_device_map", "clean_device_map", "compute_module_total_buffer_size",
    "convert_file_size_to_int", "dtype_byte_size", "find_tied_parameters", "get_non_persistent_buffers",
    "get_module_size_with_ties", "get_state_dict_offloaded_model", "named_module_tensors", "retie_parameters", "set_module_tensor_to_device",
    "ProjectConfiguration", "TorchDynamoPlugin",
    "OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict", "load_offloaded_weight",
    "offload_state_dict", "offload_weight", "save_offload_index",
    "RNGType", "broadcast", "broadcast_object_list", "clear_device_cache", "clear_environment", "compare_versions", "compile_regions",
    "compile_regions_deepspeed", "compile_regions_fsdp2", "compute_module_sizes", "concatenate", "convert_outputs_to_fp32",
    "convert_to_fp32", "copy_tensor_to_devices", "DummyOptim", "DummyScheduler", "extract_model_from_parallel", "find_batch_size", "find_device",
    "find_executable_batch_size", "get_balanced_memory", "get_max_memory", "infer_auto_device_map",
    "gather", "gather_object", "has_compiled_regions", "is_bf16_available", "is_bnb_available", "is_compiled_module", "is_cuda_available",
    "is_datasets_available", "is_deepspeed_available", "is_fp16_available", "is_hpu_available",
    "is_ipex_available", "is_matplotlib_available", "is_mlflow_available", "is_mlu_available", "is_mps_available", "is_musa_available", "is_npu_available",
    "is_numpy_available", "is_peft_available", "is_pytest_available", "is_rocm_available",
    "is_safetensors_available", "is_schedulefree_available", "is_sdaa_available", "is_tensorboard_available", "is_torch_version", "is_torch_xla_available",
    "is_torchdata_available", "is_torchdata_stateful_dataloader_available",
    "is_transformers_available", "is_wandb_available", "is_xpu_available", "listify", "load_checkpoint_in_model", "pad_across_processes",
    "pad_input_tensors", "patch_environment", "purge_accelerate_environment", "recursively_apply", "reduce", "release_memory", "send_to_device", "set_seed", "should_reduce_batch_size",
    "str_to_bool", "synchronize_rng_state", "synchronize_rng_states", "wait_for_everyone",
]


def __getattr__(name: str) -> object:
    if name == "merge_fsdp_weights":
        from notebook_accel.strategies.fsdp.state_dict import merge_fsdp_weights

        return merge_fsdp_weights
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
