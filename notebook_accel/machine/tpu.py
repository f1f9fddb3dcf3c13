"""TPU facts and launch decisions, found without importing torch_xla.

Everything here reads only environment variables, ``/sys`` and ``/dev`` and
``sys.modules``, so the kernel can decide how to launch before any XLA runtime
exists (a kernel that initialised it would hold the TPU chips itself).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# PCI ids torch_xla recognises (torch_xla/_internal/tpu.py): Google's vendor id,
# and the TPU device ids; v2 and v3 chips hold two cores (XLA devices) each.
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = {"0x0027": 2, "0x005e": 1, "0x0063": 1, "0x006f": 1, "0x0076": 1}

PJRT_DEVICES = ("TPU", "CPU", "CUDA")


@dataclass(frozen=True)
class XlaJob:
    """How torch_xla's launcher will run one notebook job.

    Attributes:
        pjrt_device: the ``PJRT_DEVICE`` the cores use (``"TPU"``, ``"CPU"``...).
        nprocs: what we pass to ``torch_xla.launch`` / ``xmp.spawn``: ``1`` (one
            process on one chip) or ``None`` (one process per chip, every core).
        cores: XLA devices the job will use, when known without the runtime.
    """

    pjrt_device: str
    nprocs: int | None
    cores: int | None

    @property
    def world_size(self) -> int | None:
        """Number of ranks (XLA devices) of the job, when known."""
        return 1 if self.nprocs == 1 else self.cores


def tpu_chips(pci_root: str | os.PathLike[str] = "/sys/bus/pci/devices") -> list[str]:
    """PCI device ids of the TPU chips attached to this machine (empty: none or not visible)."""
    chips = []
    for entry in sorted(Path(pci_root).glob("*")):
        try:
            vendor = (entry / "vendor").read_text().strip()
            if vendor != GOOGLE_PCI_VENDOR:
                continue
            device = (entry / "device").read_text().strip()
        except OSError:
            continue
        if device in TPU_PCI_DEVICES:
            chips.append(device)
    return chips


def _accelerator_type_cores(accelerator_type: str) -> int | None:
    """Cores on one host from a ``TPU_ACCELERATOR_TYPE`` such as ``v2-8`` or ``v5litepod-4``.

    Only single-host slices (at most 8 cores) are counted; larger ones span hosts.
    """
    name, _, count = accelerator_type.strip().lower().rpartition("-")
    if not name or not count.isdigit() or int(count) > 8:
        return None
    return int(count)


def tpu_core_count(
    environ: Mapping[str, str] | None = None,
    pci_root: str | os.PathLike[str] = "/sys/bus/pci/devices",
    dev_root: str | os.PathLike[str] = "/dev",
) -> int | None:
    """XLA devices (TPU cores) on this host, or ``None`` when unknown without the runtime.

    Counted as torch_xla does: TPU chips on the PCI bus, two cores per v2/v3 chip.
    Without PCI information, ``TPU_ACCELERATOR_TYPE`` (``v2-8``: 8 cores), then the
    ``/dev/accel*`` device files (one per chip, one core each) are used.
    """
    environ = os.environ if environ is None else environ
    chips = tpu_chips(pci_root)
    if chips:
        return sum(TPU_PCI_DEVICES[chip] for chip in chips)
    from_type = _accelerator_type_cores(environ.get("TPU_ACCELERATOR_TYPE", ""))
    if from_type is not None:
        return from_type
    accel = list(Path(dev_root).glob("accel[0-9]*"))
    return len(accel) or None


def pjrt_device(environ: Mapping[str, str] | None = None, tpu: bool = False) -> str | None:
    """The PJRT device the workers should use: ``PJRT_DEVICE`` if set, ``"TPU"`` on a TPU.

    Returns ``None`` when neither says which (no TPU here and no ``PJRT_DEVICE``).

    Raises:
        ValueError: ``PJRT_DEVICE`` holds something torch_xla does not know.
    """
    environ = os.environ if environ is None else environ
    value = environ.get("PJRT_DEVICE", "").strip().upper()
    if value:
        if value not in PJRT_DEVICES:
            raise ValueError(
                f"PJRT_DEVICE={environ['PJRT_DEVICE']!r} is not one of {', '.join(PJRT_DEVICES)}"
            )
        return value
    return "TPU" if tpu else None


def runtime_initialised() -> bool:
    """Whether this process initialised the XLA runtime (never imports torch_xla itself)."""
    torch_xla = sys.modules.get("torch_xla")
    if torch_xla is None:
        return False
    xlac = getattr(torch_xla, "_XLAC", None)
    check = getattr(xlac, "_xla_runtime_is_initialized", None)
    return bool(check()) if check is not None else False


def runtime_initialised_message(interactive: bool = True) -> str:
    """Why a launch is refused when this process already holds the XLA runtime."""
    fix = ("Restart the kernel and keep every XLA call (torch_xla.device(), xm.xla_device(), "
           "moving tensors to the TPU) inside the training function."
           if interactive else
           "Start the launch before anything uses an XLA device in this process.")
    return ("the XLA runtime is already initialised in this process (something used an XLA "
            "device here), so it holds the TPU and torch_xla cannot start its workers. " + fix)


def _installed(distribution: str) -> str | None:
    """The installed version of ``distribution`` (read from its metadata, never imported)."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def install_hint() -> str:
    """How to get torch_xla where it is missing, leaving what the platform installed alone.

    Colab's and Kaggle's TPU runtimes ship torch, torch_xla and libtpu, matched (Kaggle pins
    libtpu on purpose): there is nothing to install. Where torch is installed, the hint names the
    torch_xla of the same version (without the ``[tpu]`` extra when libtpu is there, so it stays);
    where torch is not, a CPU build of torch (PyPI's is a CUDA build of several GB) first.
    """
    torch_version = _installed("torch")
    if torch_version is not None:
        base = torch_version.split("+")[0]
        extra = "" if _installed("libtpu") else "[tpu]"
        return (f"pip install \"torch_xla{extra}=={base}\" (the torch_xla of the installed torch "
                f"{torch_version}; it leaves {'torch' if extra else 'torch and libtpu'} alone)")
    return ("pip install torch --index-url https://download.pytorch.org/whl/cpu, then "
            "pip install \"torch_xla[tpu]==<that torch's version>\" (a CPU build of torch: PyPI's "
            "is a CUDA build of several GB); Colab's and Kaggle's TPU runtimes have both already")


def resolve_job(
    num_processes: int | None,
    *,
    pjrt: str | None,
    cores: int | None,
    num_nodes: int = 1,
) -> XlaJob:
    """Check the launch options for device ``"xla"`` and say how torch_xla will run them.

    torch_xla's launcher starts either one process per TPU chip, using every core
    of the host (``nprocs=None``), or one process on one chip (``nprocs=1``);
    any other count it refuses ("Unsupported nprocs"). So ``num_processes`` may be
    ``None`` or the host's core count (all cores), or ``1``.

    Raises:
        ValueError: no PJRT device, several nodes, or a ``num_processes`` torch_xla
            cannot run; the message says what it supports here.
    """
    if pjrt is None:
        raise ValueError(
            "device='xla' but no TPU is detected here and PJRT_DEVICE is not set; on a TPU "
            "runtime (Colab, Kaggle, Cloud TPU VM) it is found automatically. To try the XLA "
            "path on this machine's CPU, set PJRT_DEVICE=CPU; or use device='cpu' or 'cuda'"
        )
    if num_nodes != 1:
        raise ValueError(
            f"num_nodes={num_nodes} with device='xla': multi-host TPU slices are started by "
            "torch_xla on each host (e.g. `gcloud compute tpus tpu-vm ssh --worker=all`), "
            "not from one notebook; use num_nodes=1"
        )
    if num_processes is None:
        return XlaJob(pjrt, None, cores)
    if num_processes == 1:
        return XlaJob(pjrt, 1, 1)
    if cores is not None and num_processes == cores:
        return XlaJob(pjrt, None, cores)
    valid = ("None (every core), 1 or " + str(cores) if cores is not None and cores > 1
             else "None (every core) or 1")
    if cores is not None and num_processes > cores:
        chips = " (one process per chip at most: a v5e-1 has 1, a v5e-8 has 8)" if pjrt == "TPU" else ""
        raise ValueError(
            f"num_processes={num_processes} with device='xla', but this {pjrt} has {cores} "
            f"{'core' if cores == 1 else 'cores'}{chips}. Valid here: num_processes={valid}"
        )
    where = (f"all {cores} cores of this {pjrt}" if cores is not None
             else f"every core of this {pjrt} (their number is unknown before the runtime starts)")
    raise ValueError(
        f"num_processes={num_processes} with device='xla': torch_xla's launcher runs either "
        f"one process per chip on {where}, or a single process on one chip; it refuses other "
        f"counts. Valid here: num_processes={valid}"
    )


def xla_job(num_processes: int | None, *, tpu: bool, tpu_cores: int | None,
            num_nodes: int = 1) -> XlaJob:
    """Check the options of a device ``"xla"`` launch against this machine.

    Reads ``PJRT_DEVICE``; ``tpu`` and ``tpu_cores`` are what
    :func:`~notebook_accel.machine.hardware.detect` found (the launch plan and the panel see the
    same). Never imports torch_xla. Called by the launch plan, before any worker starts.

    Raises:
        ValueError: no TPU and no ``PJRT_DEVICE``, several nodes, or a
            ``num_processes`` torch_xla cannot run (the message says what it can).
    """
    pjrt = pjrt_device(tpu=tpu)
    cores = tpu_cores if pjrt == "TPU" else None
    if pjrt == "CPU":
        cores = int(os.environ.get("CPU_NUM_DEVICES") or 1)
    return resolve_job(num_processes, pjrt=pjrt, cores=cores, num_nodes=num_nodes)


def bf16_environment(mixed_precision: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The torch_xla variables for the peer's ``downcast_bf16`` (``ACCELERATE_DOWNCAST_BF16``).

    With ``mixed_precision="bf16"`` we autocast (torch_xla's recommendation); a user
    who asked the peer to downcast float32 tensors to bf16 on the TPU gets
    ``XLA_DOWNCAST_BF16=1`` as with the peer. Set before the runtime starts.
    """
    environ = os.environ if environ is None else environ
    wanted = environ.get("ACCELERATE_DOWNCAST_BF16", "").strip().lower()
    if mixed_precision == "bf16" and wanted not in ("", "0", "false", "no"):
        return {"XLA_DOWNCAST_BF16": "1", "XLA_USE_BF16": "0"}
    return {}
