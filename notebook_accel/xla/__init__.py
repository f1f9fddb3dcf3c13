"""Everything specific to XLA devices (TPUs through torch_xla), in one place.

``detect``: TPU facts and launch decisions, without importing torch_xla (the
kernel uses these before any worker starts). ``runtime``: what the Accelerator
does on an XLA device (device, step boundary, optimizer step, parallel loader,
collectives, moving to CPU for saving), importing torch_xla lazily.
"""

from notebook_accel.xla.detect import (
    XlaJob,
    pjrt_device,
    resolve_job,
    runtime_initialised,
    tpu_core_count,
    xla_job,
)

__all__ = [
    "XlaJob", "pjrt_device", "resolve_job",
    "runtime_initialised", "tpu_core_count", "xla_job",
]
