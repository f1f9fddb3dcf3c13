"""What this machine has, found without initialising CUDA or XLA in this process.

``hardware`` (CPUs, GPUs and their compute capabilities, TPU, /dev/shm: what a launch can
use), ``gpu_support`` (native bf16, and whether the installed torch runs these GPUs: the one
check the launcher and the config panel share), ``availability`` (the peer's
``is_*_available`` probes), ``tpu`` (TPU facts and XLA launch decisions, without
importing torch_xla) and ``launch_kinds`` (how the kernel launches on each device type).
"""
