"""Option objects an ``Accelerator`` takes (the peer's names and fields).

``KwargsHandler`` is the base users subclass: ``to_kwargs()`` gives only the fields
that differ from their defaults, so an ``Accelerator`` can pass them on as keyword
arguments (``DistributedDataParallelKwargs`` to DDP, ``GradScalerKwargs`` to the
scaler, ``AutocastKwargs`` to ``autocast``).
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any


class KwargsHandler:
    """Base of dataclasses whose non-default fields become keyword arguments.

    Example:
        >>> @dataclass
        ... class MyKwargs(KwargsHandler):
        ...     a: int = 1
        ...     b: bool = False
        >>> MyKwargs(b=True).to_kwargs()
        {'b': True}
    """

    def to_dict(self) -> dict[str, Any]:
        """Every field and its value (a deep copy)."""
        return copy.deepcopy(vars(self))

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose value differs from the class default."""
        defaults = type(self)().to_dict()
        return {k: v for k, v in self.to_dict().items() if defaults.get(k, object()) != v}


class DDPCommunicationHookType(str, enum.Enum):
    """A DDP communication hook: gradients compressed to fp16 / bf16 for the all-reduce, or
    PowerSGD's low-rank approximation (``batched_power_sgd``: one matrix for all of them)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


_COMM_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel``, and its communication hook.

    Attributes:
        comm_hook: the hook DDP all-reduces gradients with (a :class:`DDPCommunicationHookType`).
        comm_wrapper: ``fp16`` / ``bf16``: compress what ``comm_hook`` sends (PowerSGD's factors).
        comm_state_option: PowerSGD's settings (``PowerSGDState``'s arguments:
            ``matrix_approximation_rank``, ``start_powerSGD_iter``...).
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def to_dict(self, ignore_keys: tuple[str, ...] = _COMM_FIELDS) -> dict[str, Any]:
        """The DDP constructor's fields (the hook's are not its arguments)."""
        return {k: v for k, v in super().to_dict().items() if k not in ignore_keys}


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for the fp16 ``GradScaler``."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments for ``Accelerator.autocast``."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """How an ``Accelerator`` creates the process group (``torch.distributed.init_process_group``).

    Attributes:
        backend: the collective backend; the default ``"nccl"`` means "the device's own"
            (nccl on GPUs, gloo on the CPU), as with the peer; another value is used as given.
        init_method: where the processes meet; default the torchrun environment (``env://``).
        timeout: how long a collective may wait, or ``None`` for torch's default.
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How ``Accelerator.accumulate`` accumulates gradients.

    Attributes:
        num_steps: micro-batches per optimizer step.
        adjust_scheduler: the peer's switch for counting skipped scheduler steps; schedulers
            here step only when gradients sync either way (``optim.AcceleratedScheduler``).
        sync_with_dataloader: also sync on the last batch of a loader.
        sync_each_batch: all-reduce gradients on every micro-batch (less memory, more traffic).

    Raises:
        ValueError: ``num_steps`` below 1.
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"num_steps must be an integer >= 1, got {self.num_steps!r}")
