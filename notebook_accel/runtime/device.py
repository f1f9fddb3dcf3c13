"""The device seam: one object per device kind, chosen once per process (``PartialState.device_kind``).

``TorchDevice`` is the torch-native kind (CPU, CUDA: torch's own calls);
``runtime.xla.XlaDevice`` is XLA's (torch_xla, imported lazily). Everything that differs
between kinds is asked of the kind, never decided by a device-type test elsewhere: where this
process stands and on which device, the process group's backend, meeting, barrier and teardown,
collectives on tensors and on objects, RNG states, copies to the CPU, memory figures, how
batches reach the device, what mixed precision and strategies it runs.

Adding a device kind (docs/architecture.md, "Adding a device"): its class in
``machine.launch_kinds`` (the one description of it), and, where its processes need more than
torch's own calls, a ``TorchDevice`` subclass overriding what differs, which that class names as
its ``worker`` (``"module:Class"``, imported when first asked for); ``tests/unit/test_device_seam.py``
registers a fake one and sees placement, RNG and copies to the CPU go through it.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from notebook_accel import contract
from notebook_accel.machine.launch_kinds import KINDS, device_launch
from notebook_accel.runtime import exit_teardown

_TORCH_NATIVE = "torch-native"
_made: dict[str, TorchDevice] = {}  # a kind's ``worker`` target (or _TORCH_NATIVE) -> its one object


def device_kind(device: torch.device | str) -> TorchDevice:
    """The kind serving ``device`` (a ``torch.device`` or its type), made once (one for every torch-native type):
    the ``worker`` its ``machine.launch_kinds`` kind names, else the torch-native kind."""
    device_type = device if isinstance(device, str) and ":" not in device else torch.device(device).type
    return _kind(_worker_target(device_type))


def _worker_target(device_type: str) -> str:
    kind = KINDS.get(device_type)
    return kind.worker if kind is not None and kind.worker else _TORCH_NATIVE


def _kind(target: str) -> TorchDevice:
    """The one object of the kind ``target`` names (``"module:Class"``, or the torch-native kind)."""
    if target not in _made:
        module, _, name = target.partition(":")
        _made[target] = getattr(importlib.import_module(module), name)() if name else TorchDevice()
    return _made[target]


def backend_kind(backend: str) -> TorchDevice:
    """The kind whose process groups run ``backend`` (the torch-native kind for gloo, nccl...)."""
    return next((device_kind(t) for t in KINDS if _worker_target(t) != _TORCH_NATIVE
                 and device_kind(t).backend(t) == backend), device_kind("cpu"))


def group_kind() -> TorchDevice:
    """The kind whose backend runs the default process group (the torch-native kind when there is none)."""
    if dist.is_available() and dist.is_initialized():
        return backend_kind(dist.get_backend())
    return device_kind("cpu")


def env_int(name: str, default: int) -> int:
    """The integer in environment variable ``name`` (``default`` when unset or empty)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _torch_device_from_env(device_type: str) -> torch.device | None:
    """``ACCELERATE_TORCH_DEVICE`` (the peer's override of the rank's device), when set.

    Raises ``ValueError`` when it is no torch device, or one of another type than ``device_type``.
    """
    value = os.environ.get(contract.TORCH_DEVICE_ENV, "").strip()
    if not value:
        return None
    try:
        device = torch.device(value)
    except RuntimeError as error:
        raise ValueError(f"{contract.TORCH_DEVICE_ENV}={value!r} is not a torch device ({error})") from None
    if device.type != device_type:
        raise ValueError(f"{contract.TORCH_DEVICE_ENV}={value!r} is a {device.type} device, but this process "
                         f"uses {device_type!r}; give a {device_type} device (e.g. {device_type}:0) or unset it")
    return device


@dataclass(frozen=True)
class Placement:
    """Where this process stands: its ranks and its device."""

    process_index: int
    num_processes: int
    local_process_index: int
    device: torch.device


class TorchDevice:
    """The torch-native kind: CPU and CUDA, through torch's own calls (XPU and MPS are refused
    before a launch: ``machine.launch_kinds``)."""

    torch_native: ClassVar[bool] = True  # torch's DDP, FSDP and DeepSpeed run on it
    backend_fixed: ClassVar[bool] = False  # a user's InitProcessGroupKwargs(backend=...) may replace it
    moves_batches: ClassVar[bool] = False  # its loader moves batches itself (``batches``)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Unpickled as the receiving process's one object of this kind (a pickled state stays equal)."""
        kind = type(self)
        return _kind, (_TORCH_NATIVE if kind is TorchDevice else f"{kind.__module__}:{kind.__qualname__}",)

    # ---- the process ----------------------------------------------------------------------
    def locate(self, device_type: str, cpu: bool) -> Placement:
        """This process's ranks (the torchrun environment) and device (``ACCELERATE_TORCH_DEVICE``,
        else the local rank's GPU, else the CPU).

        Raises:
            RuntimeError: ``cuda`` asked for where torch sees none.
        """
        local = env_int(contract.LOCAL_RANK, 0)
        chosen = None if cpu else _torch_device_from_env(device_type)
        if device_type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"{contract.DEVICE_ENV}=cuda, but this torch ({torch.__version__}) sees no CUDA "
                    f"device; set {contract.DEVICE_ENV}=cpu or pass cpu=True"
                )
            device = chosen or torch.device("cuda", local)
            torch.cuda.set_device(device)
        else:
            device = chosen or torch.device("cpu")
        return Placement(env_int(contract.RANK, 0), env_int(contract.WORLD_SIZE, 1), local, device)

    def distributed_type(self, device_type: str, num_processes: int) -> str:
        """The peer's ``DistributedType`` value for this job (its device type's launch row says it)."""
        return device_launch(device_type).recorded_type(num_processes)

    def backend(self, device_type: str) -> str:
        """The ``torch.distributed`` backend of processes on ``device_type`` (its kind's; gloo for
        a type with no kind)."""
        kind = KINDS.get(device_type)
        return kind.collective_backend if kind is not None else "gloo"

    def meeting(self, init_method: str | None) -> str:
        """The process group's ``init_method`` (default: ``env://``, the torchrun environment)."""
        return init_method or "env://"

    def register_teardown(self) -> None:
        """Arrange for the process group to be torn down cleanly at exit (``exit_teardown``)."""
        exit_teardown.register()

    def settle(self) -> None:
        """Before the group is destroyed: wait until torch's communication threads are idle."""
        exit_teardown.settle_comm_threads()

    def abandon_group(self) -> None:
        """Leave the default group without its peers (one of them died): nccl's communicators
        are aborted, not waited on; gloo's group is torn down locally."""
        self.settle()
        if dist.get_backend() == "nccl" and hasattr(dist.distributed_c10d, "_abort_process_group"):
            dist.distributed_c10d._abort_process_group()
        else:
            dist.destroy_process_group()

    def barrier(self) -> None:
        """Every process of the default group meets here."""
        dist.barrier()

    # ---- collectives ----------------------------------------------------------------------
    def collective_device(self, device: torch.device | None = None) -> torch.device:
        """Where a tensor must be for the group's collectives (nccl: the GPU; gloo: the CPU).

        Args:
            device: the process's device; default: the device the default group's backend
                runs on here (the current GPU when it is the GPUs' backend, else the CPU).
        """
        if device is None:
            on_gpus = torch.cuda.is_available() and dist.get_backend() == self.backend("cuda")
            device = torch.device("cuda", torch.cuda.current_device()) if on_gpus else torch.device("cpu")
        return device if device.type == "cuda" else torch.device("cpu")

    def all_gather(self, tensor: torch.Tensor, world_size: int) -> torch.Tensor:
        """``tensor`` (same shape everywhere) from every process, concatenated along dim 0."""
        tensor = tensor.contiguous()
        out = [torch.empty_like(tensor) for _ in range(world_size)]
        dist.all_gather(out, tensor)
        return torch.cat(out, dim=0)

    def gathers_uneven(self) -> bool:
        """Whether ``gather(uneven=True)`` may pad first dimensions that differ (XLA's may not)."""
        return True

    def all_reduce(self, tensor: torch.Tensor, reduction: str, world_size: int) -> torch.Tensor:
        """A new tensor: ``tensor`` summed (``"mean"``, ``"max"``, ``"min"``) over the processes."""
        out = tensor.clone()
        op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(reduction, dist.ReduceOp.SUM)
        dist.all_reduce(out, op=op)
        if reduction == "mean":
            out /= world_size
        return out

    def broadcast(self, tensor: torch.Tensor, from_process: int) -> torch.Tensor:
        """``tensor``, overwritten in place with ``from_process``'s."""
        dist.broadcast(tensor, src=from_process)
        return tensor

    def gather_object(self, obj: Any, world_size: int) -> list[Any]:
        """Every process's picklable ``obj``, by rank."""
        out: list[Any] = [None] * world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object_list(self, objects: list[Any], from_process: int) -> list[Any]:
        """``objects``' items overwritten in place with ``from_process``'s."""
        dist.broadcast_object_list(objects, src=from_process)
        return objects

    def checks_shapes(self) -> bool:
        """Whether debug mode's shape check (an object collective) can run on the group."""
        return True

    def broadcast_rng_state(self, state: torch.Tensor) -> torch.Tensor:
        """Rank 0's copy of a generator state (``uint8``), on the CPU."""
        moved = state.to(self.collective_device())
        dist.broadcast(moved, src=0)
        return moved.cpu()

    # ---- RNG, copies, batches, precision ------------------------------------------------
    def rng_state(self) -> dict[str, Any]:
        """This kind's generator states, under the peer's checkpoint keys (CUDA's once it is initialised)."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return {"torch_cuda_manual_seed": torch.cuda.get_rng_state_all()}
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what ``rng_state`` returned (the keys it finds in ``state``)."""
        if state.get("torch_cuda_manual_seed") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["torch_cuda_manual_seed"])

    def synchronize_rng(self, broadcast_object_list: Any) -> None:
        """Give this process rank 0's state of the kind's own generator (``RNGType.XLA``'s), if it has one."""

    def to_cpu(self, obj: Any) -> Any:
        """``obj`` with its tensors where ``torch.save`` writes them without this kind's runtime (as it is)."""
        return obj

    def keeps_memory_figure(self, device: torch.device) -> bool:
        """Whether ``memory_reserved`` can ever give a figure for ``device`` (not on CPU or MPS)."""
        module = getattr(torch, device.type, None)  # torch.cuda, torch.xpu
        return hasattr(module, "memory_reserved") and hasattr(module, "is_initialized")

    def memory_reserved(self, device: torch.device) -> int | None:
        """Bytes this kind's allocator holds on ``device`` now (the kernel's status display shows it);
        None where the kind keeps no figure (CPU, MPS) or its runtime is not up in this process yet."""
        if not self.keeps_memory_figure(device):
            return None
        module = getattr(torch, device.type)
        return int(module.memory_reserved(device)) if module.is_initialized() else None

    def has_storage(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` has a storage pointer (safetensors finds tied weights by it)."""
        return True

    def batches(self, batches: Any, device: torch.device) -> Any:
        """The loader's batches on their way to ``device`` (when ``moves_batches``; as they are here)."""
        return batches

    def check_mixed_precision(self, mixed_precision: str) -> None:
        """Raise ``ValueError`` for a mixed precision this kind cannot run (none here)."""

    def refuse(self, strategy: str, alternatives: str = "") -> None:
        """Raise ``ValueError`` when ``strategy`` (torch's own distributed machinery) cannot run on this
        kind, naming what to use instead (the default and ``alternatives``); nothing here."""
