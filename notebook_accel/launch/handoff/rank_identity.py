"""Objects that belong to one rank: never sent from the kernel to the workers.

An ``Accelerator``, its state, a prepared model, optimizer, scheduler or data loader, a
process group: each carries one process's rank, world size and group membership. A copy
made in the kernel (or brought back from rank 0 by ``%%accelerate``) would give every
worker that one process's identity, and the job would run with a silently wrong result
(every rank believing it is rank 0, each training rank 0's shard). Such objects are
refused before any worker starts, wherever they sit in what is sent.

The types are named by module and attribute and looked up in ``sys.modules`` only: the
check never imports torch, DeepSpeed or the Accelerator itself (an object of a type whose
module is not imported cannot exist).
"""

from __future__ import annotations

import sys
from typing import Any

RANK_BOUND: tuple[tuple[str, str, str], ...] = (
    # (module, attribute, what a user calls it); a subclass is caught through its base
    ("notebook_accel.accelerator", "Accelerator", "an Accelerator"),
    ("notebook_accel.runtime.state", "PartialState", "an accelerator state (PartialState)"),
    ("notebook_accel.runtime.gradient_state", "GradientState", "a GradientState"),
    ("notebook_accel.runtime.optim", "AcceleratedOptimizer", "a prepared optimizer"),
    ("notebook_accel.runtime.optim", "AcceleratedScheduler", "a prepared scheduler"),
    ("notebook_accel.data.shard", "DataLoaderShard", "a prepared data loader"),
    ("notebook_accel.data.iterable", "IterableDatasetShard", "a dataset sharded per rank"),
    ("notebook_accel.data.sharding", "ShardBatchSampler", "a batch sampler sharded per rank"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "a DDP-wrapped model"),
    ("torch.distributed.fsdp", "FSDPModule", "an FSDP-sharded model"),
    ("torch.distributed.fsdp", "FullyShardedDataParallel", "an FSDP-sharded model"),
    ("deepspeed.runtime.engine", "DeepSpeedEngine", "a DeepSpeed engine"),
    ("torch.distributed", "ProcessGroup", "a process group"),
    ("torch.distributed.device_mesh", "DeviceMesh", "a device mesh"),
    # the peer's, for a notebook that mixes both
    ("accelerate.accelerator", "Accelerator", "an Accelerate Accelerator"),
    ("accelerate.state", "PartialState", "an Accelerate state (PartialState)"),
    ("accelerate.state", "GradientState", "an Accelerate GradientState"),
    ("accelerate.optimizer", "AcceleratedOptimizer", "a prepared optimizer"),
    ("accelerate.scheduler", "AcceleratedScheduler", "a prepared scheduler"),
    ("accelerate.data_loader", "DataLoaderShard", "a prepared data loader"),
)


# How a warm pool's heal carries such objects to a new rank (``launch/worker/healing/replicas.py``): the
# fields that say where their holder stands become the receiver's ("rank": its global rank,
# "local_rank", "device"); a DDP wrapper is built anew around its module; the default process
# group becomes the receiver's. What holds one rank's part of the state cannot be carried.
PLACE_FIELDS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("notebook_accel.runtime.state", "PartialState",
     {"process_index": "rank", "local_process_index": "local_rank", "device": "device"}),
    ("notebook_accel.data.sharding", "ShardBatchSampler", {"process_index": "rank"}),
    ("notebook_accel.data.iterable", "IterableDatasetShard", {"process_index": "rank"}),
    ("notebook_accel.data.dispatch", "DataLoaderDispatcher", {"process_index": "rank"}),
)
SHARDED: tuple[str, ...] = ("an FSDP-sharded model", "a DeepSpeed engine", "a device mesh")


def rank_bound_types() -> list[tuple[type, str]]:
    """The rank-bound types whose modules are imported in this process, with their names."""
    found = []
    for module_name, attribute, kind in RANK_BOUND:
        module = sys.modules.get(module_name)
        cls = getattr(module, attribute, None) if module is not None else None
        if isinstance(cls, type):
            found.append((cls, kind))
    return found


def rank_bound_kind(value: Any, types: list[tuple[type, str]] | None = None) -> str | None:
    """What rank-bound object ``value`` is (``"an Accelerator"``), or None when it is not one.

    Args:
        types: :func:`rank_bound_types`, when the caller checks many values at once.
    """
    for cls, kind in rank_bound_types() if types is None else types:
        if isinstance(value, cls):
            return kind
    return None


class RankBoundError(TypeError):
    """A rank-bound object was about to be sent to the workers.

    Attributes:
        kind: what it is (``"an Accelerator"``).
        value: the object.
    """

    def __init__(self, kind: str, value: Any) -> None:
        super().__init__(kind)
        self.kind, self.value = kind, value


def advice(kind: str) -> str:
    """Why a rank-bound object cannot be sent, in one sentence for an error message."""
    return (f"it is {kind}, which belongs to one process (its rank, world size and process "
            "group): every worker would get that one process's identity")
