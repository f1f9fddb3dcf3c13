"""What the config panel may offer on this hardware: devices, process counts, mixed precisions.

Pure functions of :class:`~notebook_accel.machine.hardware.Hardware` (no widgets, no CUDA):
whether a GPU has bf16 is judged by :mod:`notebook_accel.machine.gpu_support`, the launcher's
own check (its compute capability from ``nvidia-smi``, else its name), since asking CUDA would
initialise it in the kernel and make every later ``fork`` unsafe.
"""

from __future__ import annotations

from dataclasses import dataclass

from notebook_accel.machine.gpu_support import BF16_WHY, bf16_verdicts
from notebook_accel.machine.gpu_support import gpu_supports_bf16 as gpu_supports_bf16  # the tests'
from notebook_accel.machine.hardware import Hardware


@dataclass(frozen=True)
class Choice:
    """One option of a choice field: its value, whether it is enabled, and why (a tooltip)."""

    value: str
    enabled: bool
    tooltip: str


def effective_device(device: str, hw: Hardware) -> str:
    """The device ``device`` means here: ``"auto"`` is CUDA with a GPU, else CPU (as the launcher)."""
    if device != "auto":
        return device
    return "cuda" if hw.gpu_count else "cpu"


def device_choices(hw: Hardware) -> list[Choice]:
    """``auto``, ``cpu``, ``cuda`` and ``xla``; ``cuda``/``xla`` enabled only when detected."""
    auto = effective_device("auto", hw)
    gpus = f"{hw.gpu_count} GPU(s) detected" if hw.gpu_count else "no NVIDIA GPU detected"
    return [
        Choice("auto", True, f"decide at launch time: {auto} on this machine"),
        Choice("cpu", True, "CPU workers with the gloo backend"),
        Choice("cuda", hw.gpu_count > 0, f"one worker per NVIDIA GPU ({gpus})"),
        Choice("xla", hw.tpu, "TPU through torch_xla" + ("" if hw.tpu else " (no TPU detected)")),
    ]


def default_processes(device: str, hw: Hardware) -> int:
    """What the launcher picks when the file sets no count: one per GPU, else per core (max 8)."""
    if effective_device(device, hw) == "cuda" and hw.gpu_count:
        return hw.gpu_count
    return max(1, min(hw.cpu_count, 8))


def max_processes(device: str, hw: Hardware) -> int:
    """The widget's upper bound: the GPU count on CUDA; on CPU, oversubscribing up to 4 per core
    is allowed (with a note, see :func:`~magics.panel.state.validate`); 8 TPU cores on XLA."""
    dev = effective_device(device, hw)
    if dev == "cuda":
        return max(1, hw.gpu_count)
    if dev == "xla":
        return 8
    return max(8, 4 * hw.cpu_count)


def _bf16_choice(dev: str, hw: Hardware) -> Choice:
    if dev == "cpu":
        return Choice("bf16", True, "bfloat16 autocast on CPU: supported by PyTorch on any x86/ARM "
                                    "CPU, fastest on CPUs with AVX-512 BF16 or AMX")
    if dev == "xla":
        return Choice("bf16", True, "bfloat16 is the TPU's native mixed precision")
    verdicts = bf16_verdicts(hw)
    lacking = [gpu for gpu, ok in verdicts.items() if ok is False]
    unknown = [gpu for gpu, ok in verdicts.items() if ok is None]
    if lacking:
        return Choice("bf16", False, f"{BF16_WHY}; {', '.join(lacking)} is older: use fp16 "
                                     "(a launch refuses bf16 here)")
    if unknown:
        return Choice("bf16", True, f"{BF16_WHY}; could not tell for {', '.join(unknown)} "
                                    "(no compute capability from nvidia-smi, an unknown name)")
    return Choice("bf16", True, f"supported: {', '.join(verdicts)} (judged without "
                                "initialising CUDA in the kernel)")


def precision_choices(device: str, hw: Hardware) -> list[Choice]:
    """The mixed precisions, each enabled only where this hardware supports it, with why."""
    dev = effective_device(device, hw)
    fp16 = (Choice("fp16", True, "float16 autocast with a gradient scaler")
            if dev == "cuda" else
            Choice("fp16", False, "fp16 needs a GPU" + ("; on TPU use bf16" if dev == "xla"
                                                       else "; on CPU use bf16")))
    return [
        Choice("no", True, "full fp32 precision"),
        fp16,
        _bf16_choice(dev, hw),
        Choice("fp8", False, "fp8 is not supported by notebook_accel yet (the peer needs "
                             "Transformer Engine or torchao on Hopper/Ada GPUs)"),
    ]


START_METHOD_TIPS = {
    "auto": "fork when it is safe, otherwise a warm forkserver; the launcher says which",
    "fork": "cheapest start (inherits the kernel's memory); unsafe once CUDA is initialised "
            "in the kernel",
    "forkserver": "a clean server started once per kernel forks the workers: safe after CUDA "
                  "is initialised, fast after the first launch",
    "spawn": "fresh interpreters: slowest, always safe",
}
