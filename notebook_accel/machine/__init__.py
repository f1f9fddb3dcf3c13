"""What this machine has, found without initialising CUDA or XLA in this process.

``hardware`` (CPUs, GPUs, TPU: what a launch can use), ``availability`` (the peer's
``is_*_available`` probes) and ``tpu`` (TPU facts and XLA launch decisions, without
importing torch_xla).
"""
