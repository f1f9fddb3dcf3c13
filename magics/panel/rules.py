"""What the config panel may offer on this hardware: devices, process counts, mixed precisions.

Pure functions of :class:`~notebook_accel.machine.hardware.Hardware` (no widgets, no CUDA):
whether a GPU has bf16 is judged by :mod:`notebook_accel.machine.gpu_support`, the launcher's
own check (its compute capability from ``nvidia-smi``, else its name), since asking CUDA would
initialise it in the kernel and make every later ``fork`` unsafe.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

from notebook_accel.contract import DYNAMO_BACKENDS
from notebook_accel.machine import devices
from notebook_accel.machine.gpu_support import BF16_WHY, bf16_verdicts
from notebook_accel.machine.gpu_support import gpu_supports_bf16 as gpu_supports_bf16  # the tests'
from notebook_accel.machine.hardware import Hardware, counted


@dataclass(frozen=True)
class Choice:
    """One option of a choice field: its value, whether it is enabled, and why (a tooltip)."""

    value: str
    enabled: bool
    tooltip: str


def effective_device(device: str, hw: Hardware) -> str:
    """The device ``device`` means here: ``"auto"`` is what the launcher picks
    (:func:`notebook_accel.machine.devices.auto_device`: CUDA with a GPU, else XLA on a TPU, else
    the CPU)."""
    return devices.auto_device(hw) if device == "auto" else device


def device_choices(hw: Hardware) -> list[Choice]:
    """``auto``, ``cpu``, ``cuda`` and ``xla``; ``cuda``/``xla`` enabled only when detected."""
    auto = effective_device("auto", hw)
    gpus = f"{counted(hw.gpu_count, 'GPU')} detected" if hw.gpu_count else "no NVIDIA GPU detected"
    return [
        Choice("auto", True, f"decide at launch time: {auto} on this machine"),
        Choice("cpu", True, "CPU workers with the gloo backend"),
        Choice("cuda", hw.gpu_count > 0, f"one worker per NVIDIA GPU ({gpus})"),
        Choice("xla", hw.tpu, "TPU through torch_xla" + ("" if hw.tpu else " (no TPU detected)")),
    ]


def default_processes(device: str, hw: Hardware) -> int:
    """What the launcher picks when the file sets no count: every device
    (:func:`notebook_accel.machine.devices.every_device`)."""
    return devices.every_device(effective_device(device, hw), hw) or 1


def max_processes(device: str, hw: Hardware) -> int:
    """The widget's upper bound: the GPU count on CUDA; the TPU's cores on XLA (8 when unknown);
    on CPU, oversubscribing up to 4 per core is allowed (with a note, see
    :func:`~magics.panel.state.validate`)."""
    dev = effective_device(device, hw)
    if dev == "cuda":
        return max(1, hw.gpu_count)
    if dev == "xla":
        return hw.tpu_cores or 8
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
    """The mixed precisions, each enabled only where this hardware supports it, with why (words
    that follow the precision's name: ``fp16: needs a GPU; on CPU use bf16``)."""
    dev = effective_device(device, hw)
    fp16 = (Choice("fp16", True, "float16 autocast with a gradient scaler")
            if dev == "cuda" else
            Choice("fp16", False, "needs a GPU" + ("; on TPU use bf16" if dev == "xla"
                                                  else "; on CPU use bf16")))
    return [
        Choice("no", True, "full fp32 precision"),
        fp16,
        _bf16_choice(dev, hw),
        Choice("fp8", False, "not supported by notebook_accel yet (the peer needs "
                             "Transformer Engine or torchao on Hopper/Ada GPUs)"),
        Choice("auto", True, f"the best this hardware supports, decided at launch: "
                             f"{devices.best_precision(dev, hw)} here "
                             f"({devices.precision_why(dev, hw)})"),
    ]


START_METHOD_TIPS = {
    "auto": "fork when it is safe, otherwise a warm forkserver; the launcher says which",
    "fork": "cheapest start (inherits the kernel's memory); unsafe once CUDA is initialised "
            "in the kernel",
    "forkserver": "a clean server started once per kernel forks the workers: safe after CUDA "
                  "is initialised, fast after the first launch",
    "spawn": "fresh interpreters: slowest, always safe",
}


# torch.compile backends (the file's names, contract.DYNAMO_BACKENDS) and what each needs to run.
# In every torch this project supports, and the device each needs (None: any):
_BUILT_IN_BACKENDS = {"eager": None, "aot_eager": None, "inductor": None, "cudagraphs": "cuda"}
# Registered by a package, or by some torch versions only: (the package, the device). The
# workers refuse a backend missing from torch._dynamo.list_backends(), so that list decides too.
_PACKAGE_BACKENDS = {
    "tensorrt": ("torch_tensorrt", "cuda"), "fx2trt": ("torch_tensorrt", "cuda"),
    "aot_ts_nvfuser": (None, "cuda"), "nvprims_nvfuser": (None, "cuda"),
    "onnxrt": ("onnxruntime", None), "tvm": ("tvm", None),
    "aot_torchxla_trace_once": ("torch_xla", "xla"), "torchxla_trace_once": ("torch_xla", "xla"),
    "hpu_backend": ("habana_frameworks", None), "neuron": ("torch_neuronx", None),
}
_GONE_BACKENDS = {"ofi": "a TorchDynamo backend before PyTorch 2.0, not in any torch since"}
_NEEDS_DEVICE = {"cuda": "needs a CUDA GPU", "xla": "needs a TPU (device xla)"}


def _package_present(name: str) -> bool:
    """Whether ``name`` can be imported here (found without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def _registered_backends() -> frozenset[str]:
    """torch's registered compile backends (imports torch._dynamo: asked only for a backend
    whose package is installed); empty when torch cannot say."""
    try:
        from torch._dynamo import list_backends

        return frozenset(list_backends(exclude_tags=()))
    except Exception:  # noqa: BLE001 - a broken torch: no backend beyond the built-ins is offered
        return frozenset()


def _backend_problem(name: str, dev: str) -> str | None:
    """Why torch.compile's backend ``name`` cannot run on ``dev`` here, or None when it can."""
    if name in _GONE_BACKENDS:
        return _GONE_BACKENDS[name]
    if name in _BUILT_IN_BACKENDS:
        needs = _BUILT_IN_BACKENDS[name]
        return _NEEDS_DEVICE[needs] if needs and needs != dev else None
    if name not in _PACKAGE_BACKENDS:
        return "not a torch.compile backend notebook_accel knows"
    package, needs = _PACKAGE_BACKENDS[name]
    if needs and needs != dev:
        return _NEEDS_DEVICE[needs]
    if package and not _package_present(package):
        return f"needs the {package} package, which is not installed"
    if name not in _registered_backends():
        return "not registered in this torch (torch._dynamo.list_backends())"
    return None


def compile_backend_choices(device: str, hw: Hardware) -> list[Choice]:
    """torch.compile's backends (``no`` first), each enabled only where it can run here: its
    device, its package installed (looked for, not imported) and registered in torch; the
    tooltip says why not."""
    dev = effective_device(device, hw)
    out = [Choice("no", True, "do not compile")]
    for name in DYNAMO_BACKENDS:
        if name != "no":
            problem = _backend_problem(name, dev)
            out.append(Choice(name, problem is None, problem or f"torch.compile(backend={name!r})"))
    return out
