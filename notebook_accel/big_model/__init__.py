"""Big-model inference: build a model without memory, plan it over GPUs, CPU and disk, load its
checkpoint straight into place and run it, streaming offloaded weights in layer by layer.

Peer-compatible names (Hugging Face Accelerate's ``big_modeling``), no IPython: usable in the kernel
itself and in workers.
"""

from notebook_accel.big_model.cpu_offload_hooks import cpu_offload_with_hook
from notebook_accel.big_model.dispatch import dispatch_model, undispatch_model
from notebook_accel.big_model.empty_init import init_empty_weights, init_on_device
from notebook_accel.big_model.layerwise_casting import attach_layerwise_casting_hooks
from notebook_accel.big_model.load_and_dispatch import load_checkpoint_and_dispatch
from notebook_accel.big_model.loading import load_checkpoint_in_model
from notebook_accel.big_model.memory import (
    compute_module_sizes,
    get_balanced_memory,
    get_max_memory,
)
from notebook_accel.big_model.offload import cpu_offload, disk_offload
from notebook_accel.big_model.planner import infer_auto_device_map

__all__ = [
    "attach_layerwise_casting_hooks",
    "compute_module_sizes",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "get_balanced_memory",
    "get_max_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "undispatch_model",
]
