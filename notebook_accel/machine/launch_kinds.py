"""The kinds of device a launch runs on, each described once: one class per kind (``KINDS``).

A kind answers, from :class:`~notebook_accel.machine.hardware.Hardware` (nothing here touches
CUDA or the XLA runtime): whether this machine has it (``available``), how many processes
"every device" is (``count``), its collective backend, the mixed precisions it runs natively
(``native_precisions``, the first is what ``"auto"`` becomes), how the kernel launches it (the
launch attributes) and which worker-side class serves its processes (``worker``, for
``runtime.device``). ``auto`` asks the kinds in ``KINDS``' order (``machine/devices.py``).
A kind notebook_accel cannot run yet says why (``refusal``): found by ``auto``, it is refused by
name, never replaced by the CPU in silence.

The kernel side (the plan, the launcher, the pool, ``backend_for``, the config file) asks the kind
of the plan's device type (``device_launch``) instead of testing the type.
"""

from __future__ import annotations

from typing import ClassVar

from notebook_accel.machine.gpu_support import bf16_verdicts
from notebook_accel.machine.hardware import Hardware

MAX_DEFAULT_CPU_PROCESSES = 8  # "every device" on CPU: one process per core, at most this many


class DeviceKind:
    """One kind of device (override what differs).

    Attributes:
        name: its device type (``contract.DEVICE_TYPES``, where it can run).
        distributed_type: the peer's ``DistributedType`` of a job of several processes on it.
        own_type: that type names the device itself (``XLA``): a job of one process records it
            too, and a strategy (``FSDP``, ``DEEPSPEED``) does not replace it in a config file.
        host_worker: the kernel starts one host worker and the device's own launcher starts the
            processes (torch_xla's): forked workers inherit nothing of the kernel's, and no
            local workers of the kernel's share ``/dev/shm``.
        pool_refusal: why a warm pool cannot run on it (None: it can).
        cluster: a Ray cluster job can run on it.
        backend: ``"module:Class"`` of the launcher backend that starts it (a cluster job: the
            cluster's).
        worker: ``"module:Class"`` of the worker-side kind (``runtime.device``) serving its
            processes; None: the torch-native ``TorchDevice``.
        collective_backend: the ``torch.distributed`` backend of its processes.
        refusal: why notebook_accel cannot run on it yet (None: it can).
    """

    name: ClassVar[str]
    distributed_type: ClassVar[str]
    own_type: ClassVar[bool] = False
    host_worker: ClassVar[bool] = False
    pool_refusal: ClassVar[str | None] = None
    cluster: ClassVar[bool] = True
    backend: ClassVar[str] = "notebook_accel.launch.backends.processes:ProcessBackend"
    worker: ClassVar[str | None] = None
    collective_backend: ClassVar[str] = "gloo"
    refusal: ClassVar[str | None] = None

    def available(self, hw: Hardware) -> bool:
        """Whether this machine has it (``auto`` takes the first kind that says so)."""
        return False

    def count(self, hw: Hardware) -> int | None:
        """How many processes ``num_processes=None`` starts on it (None: not known before its
        runtime starts)."""
        return 1

    def native_precisions(self, hw: Hardware) -> tuple[str, ...]:
        """The mixed precisions it computes natively, best first (``"auto"`` takes the first;
        none: ``"no"``)."""
        return ()

    def precision_why(self, hw: Hardware) -> str:
        """Why ``"auto"`` precision is what it is here, in a few words (for the launch's note)."""
        return "its native precision"

    def recorded_type(self, num_processes: int) -> str:
        """The peer's ``DistributedType`` of a job of ``num_processes`` on it (``NO``: one process)."""
        return self.distributed_type if num_processes > 1 or self.own_type else "NO"


class CudaKind(DeviceKind):
    """NVIDIA GPUs: one process per visible GPU, nccl."""

    name = "cuda"
    distributed_type = "MULTI_GPU"
    collective_backend = "nccl"

    def available(self, hw: Hardware) -> bool:
        return hw.gpu_count > 0

    def count(self, hw: Hardware) -> int:
        return max(1, hw.gpu_count)

    def native_precisions(self, hw: Hardware) -> tuple[str, ...]:
        verdicts = bf16_verdicts(hw).values()
        return ("bf16", "fp16") if verdicts and all(v is True for v in verdicts) else ("fp16",)

    def precision_why(self, hw: Hardware) -> str:
        return ("every GPU here has native bf16" if self.native_precisions(hw)[0] == "bf16" else
                "bf16 is not native on these GPUs (compute capability below 8.0 or unknown)")


class XlaKind(DeviceKind):
    """TPU cores through torch_xla: its own launcher on one host worker."""

    name = "xla"
    distributed_type = "XLA"
    own_type = True
    host_worker = True
    cluster = False
    pool_refusal = ("device='xla': a pool cannot keep TPU cores warm yet; use "
                    "notebook_launcher (or %%accelerate --fresh) on a TPU")
    backend = "notebook_accel.launch.backends.xla:XlaBackend"
    worker = "notebook_accel.runtime.xla:XlaDevice"
    collective_backend = "xla"

    def available(self, hw: Hardware) -> bool:
        return hw.tpu

    def count(self, hw: Hardware) -> int | None:
        return hw.tpu_cores

    def native_precisions(self, hw: Hardware) -> tuple[str, ...]:
        return ("bf16",)

    def precision_why(self, hw: Hardware) -> str:
        return "bf16 is the TPU's native precision"


class XpuKind(DeviceKind):
    """Intel GPUs (``torch.xpu``): not run yet, refused by name."""

    name = "xpu"
    distributed_type = "MULTI_XPU"
    refusal = "an Intel XPU (torch.xpu) is visible, and notebook_accel does not run on XPUs yet"

    def available(self, hw: Hardware) -> bool:
        return hw.xpu_count > 0


class MpsKind(DeviceKind):
    """Apple's GPU (``torch.backends.mps``): not run yet, refused by name."""

    name = "mps"
    distributed_type = "NO"
    refusal = ("Apple's MPS (torch.backends.mps) is available, and notebook_accel does not run on "
               "MPS yet")

    def available(self, hw: Hardware) -> bool:
        return hw.mps


class CpuKind(DeviceKind):
    """The CPU cores: one process per core (at most :data:`MAX_DEFAULT_CPU_PROCESSES`), gloo."""

    name = "cpu"
    distributed_type = "MULTI_CPU"

    def available(self, hw: Hardware) -> bool:
        return True

    def count(self, hw: Hardware) -> int:
        return max(1, min(hw.cpu_count, MAX_DEFAULT_CPU_PROCESSES))

    def native_precisions(self, hw: Hardware) -> tuple[str, ...]:
        return ("bf16",) if hw.cpu_bf16 else ()

    def precision_why(self, hw: Hardware) -> str:
        return ("this CPU has bf16 instructions" if hw.cpu_bf16 else
                "this CPU has no bf16 instructions, so bf16 would be emulated, slower than float32")


KINDS: dict[str, DeviceKind] = {  # device type -> its kind, in the order auto asks them
    kind.name: kind for kind in (CudaKind(), XlaKind(), XpuKind(), MpsKind(), CpuKind())}


def runnable_kinds() -> dict[str, DeviceKind]:
    """The kinds a launch can run on (``contract.DEVICE_TYPES``), in the order of their names."""
    return {name: KINDS[name] for name in sorted(KINDS) if KINDS[name].refusal is None}


def device_launch(device_type: str) -> DeviceKind:
    """The kind of ``device_type`` (one of ``contract.DEVICE_TYPES``)."""
    return KINDS[device_type]
