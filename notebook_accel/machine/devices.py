"""What ``auto`` means on this machine: the device, how many processes "every device" is, and the
best mixed precision the hardware supports.

The one place that decides it: the launch plan (``launch/planning/plan.py``) and the config panel
(``magics/panel/rules.py``) both ask here, so they never disagree (on a TPU both say XLA). Each
answer is the device's kind's (``machine/launch_kinds.py``); ``auto`` asks the kinds in order.
Pure functions of :class:`~notebook_accel.machine.hardware.Hardware`: nothing here touches CUDA
or the XLA runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from notebook_accel.machine.hardware import Hardware
from notebook_accel.machine.launch_kinds import KINDS, device_launch

_TRUE = ("1", "true", "yes")


def auto_device(hw: Hardware, environ: Mapping[str, str] | None = None) -> str:
    """The device a launch uses when none is named: ``"cpu"`` when the peer's ``ACCELERATE_USE_CPU``
    asks for it, else the first kind of ``KINDS`` this machine has (``"cuda"`` with a visible
    NVIDIA GPU, else ``"xla"`` on a TPU, ..., else ``"cpu"``).

    Raises:
        ValueError: that kind is one notebook_accel cannot run on yet (an Intel XPU, Apple's MPS),
            naming it: a launch never falls back to the CPU in silence.
    """
    environ = os.environ if environ is None else environ
    if environ.get("ACCELERATE_USE_CPU", "").strip().lower() in _TRUE:
        return "cpu"
    kind = next(kind for kind in KINDS.values() if kind.available(hw))
    if kind.refusal is not None:
        raise ValueError(f"device=auto: {kind.refusal}; pass device='cpu' (or set "
                         f"ACCELERATE_USE_CPU=yes) to run on the CPU cores")
    return kind.name


def every_device(device: str, hw: Hardware) -> int | None:
    """How many processes ``num_processes=None`` starts on ``device``: one per GPU on CUDA, one per
    TPU core on XLA (None: not known before the runtime starts), one per CPU core (at most
    ``launch_kinds.MAX_DEFAULT_CPU_PROCESSES``) on the CPU."""
    return device_launch(device).count(hw)


def best_precision(device: str, hw: Hardware) -> str:
    """What ``mixed_precision="auto"`` becomes: ``"bf16"`` on a TPU, on GPUs that all have native
    bf16 (compute capability 8.0+) and on a CPU with bf16 instructions; ``"fp16"`` on other GPUs
    (T4, V100, or one whose support cannot be told); ``"no"`` on other CPUs, where bf16 is
    emulated and slower than float32."""
    native = device_launch(device).native_precisions(hw)
    return native[0] if native else "no"


def precision_why(device: str, hw: Hardware) -> str:
    """Why :func:`best_precision` chose what it did, in a few words (for the launch's note)."""
    return device_launch(device).precision_why(hw)
