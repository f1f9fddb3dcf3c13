"""The environment contract between the launcher and every worker.

The launcher sets these variables in each worker; the runtime (``PartialState``,
``Accelerator``) reads only the environment, so the same code also runs under
``torchrun`` or SLURM, where the torchrun-standard names are set by them.
"""

from __future__ import annotations

from notebook_accel.contract import DEVICE_ENV as DEVICE_TYPE
from notebook_accel.contract import DEVICE_TYPES as DEVICE_TYPE_CHOICES
from notebook_accel.contract import (
    GROUP_RANK,
    LOCAL_RANK,
    LOCAL_WORLD_SIZE,
    MASTER_ADDR,
    MASTER_PORT,
    RANK,
    TORCH_DEVICE_ENV,
    WORLD_SIZE,
)
from notebook_accel.contract import LAUNCHED_ENV as LAUNCHED
from notebook_accel.contract import MIXED_PRECISION_ENV as MIXED_PRECISION
from notebook_accel.contract import MIXED_PRECISIONS as MIXED_PRECISION_CHOICES

# The names (torchrun's and ours) and vocabularies live in notebook_accel.contract, imported above.
__all__ = ["DEVICE_TYPE", "DEVICE_TYPE_CHOICES", "GROUP_RANK", "LAUNCHED", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
           "MASTER_ADDR", "MASTER_PORT", "MIXED_PRECISION", "MIXED_PRECISION_CHOICES", "RANK", "WORLD_SIZE",
           "network_environment", "worker_environment"]


def worker_environment(
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    group_rank: int,
    master_addr: str,
    master_port: int,
    mixed_precision: str,
    device_type: str,
) -> dict[str, str]:
    """Return the variables one worker gets, as strings."""
    return {
        RANK: str(rank),
        LOCAL_RANK: str(local_rank),
        WORLD_SIZE: str(world_size),
        LOCAL_WORLD_SIZE: str(local_world_size),
        GROUP_RANK: str(group_rank),
        MASTER_ADDR: master_addr,
        MASTER_PORT: str(master_port),
        MIXED_PRECISION: mixed_precision,
        DEVICE_TYPE: device_type,
        TORCH_DEVICE_ENV: f"cuda:{local_rank}" if device_type == "cuda" else device_type,
        LAUNCHED: "1",
    }


def network_environment(plan) -> dict[str, str]:
    """Keep a one-machine job on loopback: collectives and the store bind nowhere else.

    Workers join the kernel-hosted rendezvous store as clients. For one machine,
    gloo and NCCL are pinned to the loopback interface unless the user chose one.
    """
    import os

    env = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
    if plan.num_nodes == 1 and os.path.exists("/sys/class/net/lo"):
        for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if not os.environ.get(name):
                env[name] = "lo"
    return env
