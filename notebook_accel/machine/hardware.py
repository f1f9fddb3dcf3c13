"""What this machine has, found without initialising CUDA or XLA in this process.

Touching ``torch.cuda`` in the kernel would make every later ``fork`` unsafe, so
GPUs are counted from the driver's ``/proc`` entries or ``nvidia-smi`` instead,
honouring ``CUDA_VISIBLE_DEVICES``, and their compute capabilities read from
``nvidia-smi`` (from torch only when CUDA is already initialised here).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

_NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")
_SHM = "/dev/shm"

Capability = tuple[int, int]  # a GPU's compute capability: (7, 5) for a T4


@dataclass(frozen=True)
class Hardware:
    """A summary of the accelerators and CPU cores this process may use."""

    cpu_count: int
    gpu_names: tuple[str, ...] = field(default_factory=tuple)
    tpu: bool = False
    # per GPU, in gpu_names' order: its compute capability, None where unknown (or all unknown: ())
    gpu_capabilities: tuple[Capability | None, ...] = field(default_factory=tuple)
    tpu_cores: int | None = None  # XLA devices on this host (machine/tpu.py), None: unknown
    cpu_bf16: bool = False  # the CPU computes bf16 natively (AVX512-BF16, AMX, Arm's BF16)
    xpu_count: int = 0  # Intel GPUs torch.xpu sees (machine/launch_kinds.py refuses them)
    mps: bool = False  # Apple's MPS is available (machine/launch_kinds.py refuses it)

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)

    def gpus(self) -> list[tuple[str, Capability | None]]:
        """Each visible GPU's name and compute capability (None where unknown)."""
        caps = self.gpu_capabilities if len(self.gpu_capabilities) == self.gpu_count else ()
        return [(name, caps[i] if caps else None) for i, name in enumerate(self.gpu_names)]

    def summary(self) -> str:
        """One human line, e.g. ``2 × NVIDIA H100, 32 CPU cores``."""
        parts = []
        if self.tpu:
            parts.append(f"TPU ({self.tpu_cores} cores)" if self.tpu_cores else "TPU")
        if self.gpu_names:
            names = sorted(set(self.gpu_names))
            parts.append(", ".join(f"{self.gpu_names.count(n)} × {n}" for n in names))
        parts.append(counted(self.cpu_count, "CPU core"))
        return ", ".join(parts)


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """``counted(2, "CPU core")`` -> ``"2 CPU cores"``; ``counted(1, "GPU")`` -> ``"1 GPU"``;
    ``plural``: the noun's plural where it is not ``noun + "s"``."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _gpu_names_from_proc() -> list[str]:
    names = []
    if _NVIDIA_PROC.is_dir():
        for entry in sorted(_NVIDIA_PROC.iterdir()):
            model = "NVIDIA GPU"
            info = entry / "information"
            try:
                for line in info.read_text().splitlines():
                    if line.startswith("Model:"):
                        model = line.split(":", 1)[1].strip()
            except OSError:
                pass
            names.append(model)
    return names


def _smi_query(fields: str) -> list[str]:
    """``nvidia-smi --query-gpu=FIELDS``: one line per GPU (in PCI bus order, as ``/proc``); none
    when there is no nvidia-smi or it refuses a field (``compute_cap`` needs driver 510+)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _gpu_names_from_smi() -> list[str]:
    return _smi_query("name")


def _parse_capability(text: str) -> Capability | None:
    major, _, minor = text.strip().partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def _capabilities_from_smi() -> dict[str, Capability]:
    found = {}
    for line in _smi_query("name,compute_cap"):
        name, _, cap = line.rpartition(",")
        capability = _parse_capability(cap)
        if name.strip() and capability is not None:
            found[name.strip()] = capability
    return found


def _capabilities_from_torch() -> dict[str, Capability]:
    """Only when CUDA is already initialised in this process (asking would initialise it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    return {torch.cuda.get_device_name(i): tuple(torch.cuda.get_device_capability(i))
            for i in range(torch.cuda.device_count())}


def gpu_capabilities(names: list[str]) -> tuple[Capability | None, ...]:
    """The compute capability of each GPU named (as :func:`gpu_names` gives them), None where it
    cannot be told without initialising CUDA here. One model has one capability, so it is
    looked up by name."""
    if not names:
        return ()
    known = _capabilities_from_smi() or _capabilities_from_torch()
    return tuple(known.get(name) for name in names)


def _apply_visible_devices(names: list[str], visible: str | None) -> list[str]:
    """Keep the GPUs ``CUDA_VISIBLE_DEVICES`` lets this process see."""
    if visible is None:
        return names
    visible = visible.strip()
    if visible in ("", "-1", "NoDevFiles"):
        return []
    kept = []
    for item in visible.split(","):
        item = item.strip()
        if item.isdigit() and int(item) < len(names):
            kept.append(names[int(item)])
        elif item.startswith(("GPU-", "MIG-")) and names:
            kept.append(names[0])  # UUIDs: we cannot map them without NVML; count them
        else:
            break  # CUDA stops at the first invalid entry
    return kept


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs visible to this process, without initialising CUDA (and
    without importing torch on a machine that has none: a cold launch speaks at once)."""
    names = _gpu_names_from_proc() or _gpu_names_from_smi()
    if not names:
        return []
    import torch

    if torch.version.cuda is None:  # a CPU (or ROCm) build cannot use NVIDIA GPUs
        return []
    return _apply_visible_devices(names, os.environ.get("CUDA_VISIBLE_DEVICES"))


def tpu_present() -> bool:
    """True on a TPU runtime (Colab, Kaggle, Cloud TPU VM or ``PJRT_DEVICE=TPU``)."""
    if os.environ.get("PJRT_DEVICE", "").upper() == "TPU":
        return True
    if os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_NAME"):
        return True
    if os.environ.get("KAGGLE_TPU") or os.environ.get("TPU_ACCELERATOR_TYPE"):
        return True
    # Cloud TPU VMs expose /dev/accel0.. (v4) or /dev/vfio/N (v5+); /dev/vfio alone is
    # also used for GPU passthrough, so it only counts together with the TPU library.
    if any(Path("/dev").glob("accel[0-9]*")):
        return True
    vfio = Path("/dev/vfio")
    return vfio.is_dir() and any(p.name.isdigit() for p in vfio.iterdir()) and _libtpu_installed()


def xpu_count() -> int:
    """How many Intel GPUs ``torch.xpu`` sees; asked only where an Intel display device exists
    and torch is built for XPUs (elsewhere torch is not imported: a cold launch speaks at once)."""
    vendors = Path("/sys/class/drm").glob("renderD*/device/vendor")
    if not any(_read(path) == "0x8086" for path in vendors):
        return 0
    import torch

    if not getattr(torch.version, "xpu", None) or not hasattr(torch, "xpu"):
        return 0
    return torch.xpu.device_count() if torch.xpu.is_available() else 0


def mps_present() -> bool:
    """Whether Apple's MPS is available to torch (asked on macOS only)."""
    if sys.platform != "darwin":
        return False
    import torch

    return torch.backends.mps.is_available()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _libtpu_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


_CPU_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}  # x86 flags; Arm's "Features: ... bf16"


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has native bf16 instructions, from ``/proc/cpuinfo`` (``cpuinfo``: its
    text; read when None). Without them torch's bf16 autocast on the CPU is emulated, slower
    than float32."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features") and _CPU_BF16_FLAGS & set(value.split()):
            return True
    return False


def shm_bytes(path: str = _SHM) -> int | None:
    """The size of ``/dev/shm`` (NCCL's shared-memory transport and DataLoader workers pass data
    through it; Docker gives 64 MB unless ``--shm-size``), or None where there is none."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize


def detect() -> Hardware:
    """Detect the hardware (cached; looked at again when ``CUDA_VISIBLE_DEVICES`` or
    ``PJRT_DEVICE`` changes)."""
    return _detect(os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("PJRT_DEVICE"))


@functools.lru_cache(maxsize=4)
def _detect(visible: str | None, pjrt: str | None) -> Hardware:
    from notebook_accel.machine.tpu import tpu_core_count

    names = gpu_names()
    tpu = tpu_present()
    return Hardware(cpu_count=_cpu_count(), gpu_names=tuple(names), tpu=tpu,
                    gpu_capabilities=gpu_capabilities(names),
                    tpu_cores=tpu_core_count() if tpu else None, cpu_bf16=cpu_has_bf16(),
                    xpu_count=xpu_count(), mps=mps_present())
