"""Where this process stands: rank, world size, device and the process group.

``PartialState`` reads only the environment: the torchrun-standard names
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) and our own ``NOTEBOOK_ACCEL_DEVICE``. So the same code runs in a
worker started by ``notebook_launcher``, under ``torchrun``, or as one plain process.

Unlike the peer, there is no shared-dict singleton: every ``PartialState()`` is a
cheap, independent view of the same environment, so several ``Accelerator``
objects in one process never fight. The only process-wide thing is the
``torch.distributed`` process group, created once, on first need, and only when
the world size is above 1 (a kernel that made an ``Accelerator`` can still fork).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from enum import Enum
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from notebook_accel import contract
from notebook_accel.runtime.device import TorchDevice, backend_kind, device_kind, env_int
from notebook_accel.runtime.latest import SharedStateView

T = TypeVar("T")


class DistributedType(str, Enum):
    """How the processes work together (same members and values as the peer's enum).

    ``PartialState`` chooses ``NO``, ``MULTI_CPU``, ``MULTI_GPU`` or ``XLA``; the
    others exist so code written for the peer imports and compares, and
    ``check_supported`` says so when one of them is chosen.
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    XLA = "XLA"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"  # the Accelerator's, when it shards models with FSDP2 (a PartialState never says it)
    MEGATRON_LM = "MEGATRON_LM"

    def check_supported(self) -> None:
        """Raise ``NotImplementedError`` naming this member when notebook_accel cannot run it."""
        supported = ("NO", "MULTI_CPU", "MULTI_GPU", "XLA", "FSDP", "DEEPSPEED")
        if self.value not in supported:
            raise NotImplementedError(
                f"distributed_type {self.value} is not supported by notebook_accel (yet); "
                f"supported: {', '.join(supported)}"
            )


def _device_type(cpu: bool) -> str:
    if cpu:
        return "cpu"
    wanted = os.environ.get(contract.DEVICE_ENV, "").strip().lower()
    if wanted and wanted not in contract.DEVICE_TYPES:
        raise ValueError(
            f"{contract.DEVICE_ENV}={wanted!r} is not valid; choose one of {contract.DEVICE_TYPES}"
        )
    if wanted:
        return wanted
    return "cuda" if torch.cuda.is_available() else "cpu"


def collective_backend(device_type: str) -> str:
    """The ``torch.distributed`` backend for processes on ``device_type`` devices (their kind's).

    Example:
        >>> collective_backend("cuda"), collective_backend("cpu")
        ('nccl', 'gloo')
    """
    return device_kind(device_type).backend(device_type)


def ensure_process_group(
    backend: str, rank: int, world_size: int, timeout: timedelta | None, device: torch.device | None = None,
    *, alone: bool = False, init_method: str | None = None,
) -> None:
    """Create the default process group once per process; later calls reuse it (the one place that creates it).

    Also arranges for the group to be torn down cleanly when the interpreter exits
    (see ``notebook_accel.runtime.exit_teardown``).

    Args:
        backend: ``"gloo"``, ``"nccl"``, or a device kind's own (``collective_backend``).
        rank: this process's global rank.
        world_size: number of processes; nothing is created when it is 1, unless ``alone``.
        timeout: collective timeout, or ``None`` for torch's default.
        device: for nccl, this process's GPU, bound to the group where torch supports it.
        alone: with ``world_size`` 1, create a one-process group anyway (a strategy that needs
            one, DeepSpeed); it meets nobody, so it uses an in-process store: no port, no race.
        init_method: where the processes meet (default ``env://``: the torchrun environment).
    """
    if world_size <= 1 and not alone:
        return
    kind = _backend_kind(backend, device)
    kind.register_teardown()
    if dist.is_initialized():
        return
    kwargs: dict[str, Any] = {"backend": backend, "rank": rank, "world_size": world_size}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if world_size <= 1:
        kwargs["store"] = dist.HashStore()
    else:
        kwargs["init_method"] = kind.meeting(init_method)
    if backend == "nccl" and device is not None and "device_id" in inspect.signature(dist.init_process_group).parameters:
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    _MEETING.update(backend=backend, timeout=timeout, device=device, init_method=init_method)
    if backend == "gloo" and world_size > 1:
        # gloo connects its full mesh lazily; a rank that finished right after init could
        # otherwise close its sockets while a peer is still connecting to it.
        dist.barrier()


_MEETING: dict[str, Any] = {}  # how ensure_process_group last created the default group


def rejoin_process_group(rank: int, world_size: int) -> None:
    """Leave the default process group (one a dead peer broke) and meet the same world again,
    over the store the torchrun environment names now (``MASTER_PORT``), with the backend and
    timeout the group had (a process that had none: its device's, torch's default timeout).

    The old group is abandoned, not waited on: its device kind aborts it (nccl) or tears it
    down locally (gloo). A warm pool's heal calls this on every rank at once.
    """
    meeting = dict(_MEETING) or {"backend": collective_backend(_device_type(False)),
                                 "timeout": None, "device": None, "init_method": None}
    if dist.is_initialized():
        kind = _backend_kind(dist.get_backend(), meeting["device"])
        kind.abandon_group()
    ensure_process_group(meeting["backend"], rank, world_size, meeting["timeout"], meeting["device"],
                         init_method=meeting["init_method"])


def _backend_kind(backend: str, device: torch.device | None) -> TorchDevice:
    """The device kind running ``backend``: ``device``'s, or the kind whose backend it is."""
    return device_kind(device) if device is not None else backend_kind(backend)


class PartialState:
    """The distributed environment of this process, usable without an ``Accelerator``.

    Args:
        cpu: force the CPU even when a GPU is present.
        timeout: collective timeout for the process group, if one is created here.
        backend: the collective backend, if one is created here (default: the device's own,
            ``collective_backend``).
        init_method: where the processes meet, if a group is created here (default ``env://``).

    Example:
        >>> state = PartialState()
        >>> state.num_processes, state.device
        (1, device(type='cpu'))
    """

    _shared_state = SharedStateView()  # the latest Accelerator's state, read-only (``runtime.latest``)

    def __init__(self, cpu: bool = False, timeout: timedelta | None = None, backend: str | None = None,
                 init_method: str | None = None) -> None:
        self.device_type = _device_type(cpu)
        self.device_kind = device_kind(self.device_type)  # the device seam: chosen once, asked from here on
        place = self.device_kind.locate(self.device_type, cpu)
        self.process_index, self.num_processes = place.process_index, place.num_processes
        self.local_process_index, self.device = place.local_process_index, place.device
        self.distributed_type = DistributedType(self.device_kind.distributed_type(self.device_type,
                                                                                  self.num_processes))
        self.backend: str | None = None
        if self.num_processes > 1:
            fixed = self.device_kind.backend_fixed
            self.backend = (None if fixed else backend) or self.device_kind.backend(self.device_type)
        if not 0 <= self.process_index < self.num_processes:
            raise ValueError(
                f"rank {self.process_index} is outside the world of {self.num_processes} processes"
            )
        self.num_local_processes = env_int(contract.LOCAL_WORLD_SIZE, self.num_processes)
        if self.backend is not None:
            meeting = {"init_method": init_method} if init_method else {}
            ensure_process_group(self.backend, self.process_index, self.num_processes, timeout, self.device,
                                 **meeting)

    def __repr__(self) -> str:
        return (
            f"PartialState(distributed_type={self.distributed_type.value}, "
            f"process_index={self.process_index}, num_processes={self.num_processes}, "
            f"local_process_index={self.local_process_index}, device={self.device})"
        )

    @property
    def use_distributed(self) -> bool:
        """Whether there is more than one process."""
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on local rank 0 (the first process of each machine)."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """True on the highest global rank."""
        return self.process_index == self.num_processes - 1

    @property
    def debug(self) -> bool:
        """Debug mode: collectives first check that every process passes matching shapes (``op_checks``)."""
        from notebook_accel.runtime import op_checks

        return op_checks.debug_enabled()

    @debug.setter
    def debug(self, enabled: bool) -> None:
        from notebook_accel.runtime import op_checks

        op_checks.set_debug(enabled)

    @classmethod
    def _reset_state(cls) -> None:
        """The peer's reset of its shared singleton: ``_shared_state`` is empty again (each state here
        reads the environment itself, so no state is changed)."""
        cls._latest = None

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Tear down the process group (``group``, default: the default group) if one exists.

        ``Accelerator.end_training`` calls it; a later ``PartialState()`` creates a new one.
        Waits first (GIL released) until torch's communication threads are idle: once the
        group is gone, freeing a DDP model frees the group and joins those threads with the
        GIL held, which deadlocks if one is still releasing a collective (torch's race, see
        docs/torch_gloo_exit_abort.md).
        """
        if self.backend is not None and dist.is_available() and dist.is_initialized():
            self.device_kind.settle()
            dist.destroy_process_group(group)

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (no-op for one process)."""
        if self.use_distributed:
            self.device_kind.barrier()

    @contextlib.contextmanager
    def _first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on the main process first, then on all the others.

        Example:
            >>> with state.main_process_first():
            ...     dataset = load_or_download()
        """
        return self._first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on each machine's local main process first, then on the others."""
        return self._first(self.is_local_main_process)

    def on_main_process(self, function: Callable[..., T]) -> Callable[..., T | None]:
        """Decorator: run ``function`` only on the main process (others get ``None``)."""
        return self._only_if(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable[..., T]) -> Callable[..., T | None]:
        """Decorator: run ``function`` only on each machine's local main process."""
        return self._only_if(function, lambda: self.is_local_main_process)

    def on_process(self, function: Callable[..., T] | None = None, *, process_index: int) -> Any:
        """Decorator: run ``function`` only on global rank ``process_index``."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only_if(function, lambda: self.process_index == process_index)

    @staticmethod
    def _only_if(function: Callable[..., T], condition: Callable[[], bool]) -> Callable[..., T | None]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> T | None:
            return function(*args, **kwargs) if condition() else None

        return wrapper

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give each process its contiguous share of ``inputs``.

        Args:
            inputs: a list, tuple, tensor, or a dict of those (each value is split).
            apply_padding: repeat the last element so every process gets the same count
                (useful before ``gather``).

        Yields:
            This process's share, of the same type as ``inputs``.

        Example:
            >>> with state.split_between_processes(["a", "b", "c"]) as mine:
            ...     ...  # rank 0 of 2 gets ["a", "b"], rank 1 gets ["c"]
        """
        yield split_for_process(inputs, self.process_index, self.num_processes, apply_padding)


def split_for_process(inputs: Any, index: int, count: int, apply_padding: bool = False) -> Any:
    """Return share ``index`` of ``count`` contiguous shares of ``inputs`` (see ``split_between_processes``)."""
    if count == 1:
        return inputs
    if isinstance(inputs, dict):
        return {k: split_for_process(v, index, count, apply_padding) for k, v in inputs.items()}
    if not isinstance(inputs, (list, tuple, torch.Tensor)):
        if not (hasattr(inputs, "__len__") and hasattr(inputs, "__getitem__")):
            raise TypeError(
                "split_between_processes takes a list, tuple, tensor, dict or any sized indexable "
                f"(a datasets.Dataset, a torch Dataset with __len__), not {type(inputs).__name__}"
            )
        return _split_indexable(inputs, index, count, apply_padding)
    base, extra = divmod(len(inputs), count)
    start = index * base + min(index, extra)
    end = start + base + (1 if index < extra else 0)
    part = inputs[start:end]
    if apply_padding and extra and len(inputs) > 0:
        wanted = base + 1
        missing = wanted - len(part)
        if missing:
            last = inputs[-1:] if len(part) == 0 else part[-1:]
            if isinstance(part, torch.Tensor):
                part = torch.cat([part, *([last] * missing)])
            else:
                part = part + type(part)(last) * missing
    return part


def _split_indexable(inputs: Any, index: int, count: int, apply_padding: bool) -> Any:
    """Share ``index`` of a sized indexable: ``inputs.select(rows)`` when it has one
    (``datasets.Dataset``), else a ``torch.utils.data.Subset``."""
    rows = split_for_process(list(range(len(inputs))), index, count, apply_padding)
    if callable(getattr(inputs, "select", None)):
        return inputs.select(rows)
    return torch.utils.data.Subset(inputs, rows)
