"""What ``auto`` means on this machine: the device, how many processes "every device" is, and the
best mixed precision the hardware supports.

The one place that decides it: the launch plan (``launch/plan.py``) and the config panel
(``magics/panel/rules.py``) both ask here, so they never disagree (on a TPU both say XLA).
Pure functions of :class:`~notebook_accel.machine.hardware.Hardware`: nothing here touches CUDA
or the XLA runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from notebook_accel.machine.gpu_support import bf16_verdicts
from notebook_accel.machine.hardware import Hardware

MAX_DEFAULT_CPU_PROCESSES = 8  # "every device" on CPU: one process per core, at most this many
_TRUE = ("1", "true", "yes")


def auto_device(hw: Hardware, environ: Mapping[str, str] | None = None) -> str:
    """The device a launch uses when none is named: ``"cpu"`` when the peer's ``ACCELERATE_USE_CPU``
    asks for it, else ``"cuda"`` with a visible NVIDIA GPU, else ``"xla"`` on a TPU, else ``"cpu"``."""
    environ = os.environ if environ is None else environ
    if environ.get("ACCELERATE_USE_CPU", "").strip().lower() in _TRUE:
        return "cpu"
    return "cuda" if hw.gpu_count else "xla" if hw.tpu else "cpu"


def every_device(device: str, hw: Hardware) -> int | None:
    """How many processes ``num_processes=None`` starts on ``device``: one per GPU on CUDA, one per
    TPU core on XLA (None: not known before the runtime starts), one per CPU core (at most
    :data:`MAX_DEFAULT_CPU_PROCESSES`) on the CPU."""
    if device == "cuda":
        return max(1, hw.gpu_count)
    if device == "xla":
        return hw.tpu_cores
    return max(1, min(hw.cpu_count, MAX_DEFAULT_CPU_PROCESSES))


def best_precision(device: str, hw: Hardware) -> str:
    """What ``mixed_precision="auto"`` becomes: ``"bf16"`` on a TPU, on GPUs that all have native
    bf16 (compute capability 8.0+) and on a CPU with bf16 instructions; ``"fp16"`` on other GPUs
    (T4, V100, or one whose support cannot be told); ``"no"`` on other CPUs, where bf16 is
    emulated and slower than float32."""
    if device == "xla":
        return "bf16"
    if device == "cuda":
        verdicts = bf16_verdicts(hw).values()
        return "bf16" if verdicts and all(v is True for v in verdicts) else "fp16"
    return "bf16" if hw.cpu_bf16 else "no"


def precision_why(device: str, hw: Hardware) -> str:
    """Why :func:`best_precision` chose what it did, in a few words (for the launch's note)."""
    best = best_precision(device, hw)
    if device == "xla":
        return "bf16 is the TPU's native precision"
    if device == "cuda":
        return ("every GPU here has native bf16" if best == "bf16" else
                "bf16 is not native on these GPUs (compute capability below 8.0 or unknown)")
    return ("this CPU has bf16 instructions" if best == "bf16" else
            "this CPU has no bf16 instructions, so bf16 would be emulated, slower than float32")
