"""How the kernel launches on each device type: one row per device kind (``device_launch``).

The kernel side (the plan, the launcher, the pool, ``backend_for``, the config file) asks the row
of the plan's device type instead of testing the type; the worker side's counterpart is
``runtime.device`` (``KINDS``). Adding a device kind: its row in ``LAUNCHES``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceLaunch:
    """How the kernel launches a job on one device kind.

    Attributes:
        distributed_type: the peer's ``DistributedType`` of a job of several processes on it.
        own_type: that type names the device itself (``XLA``): a job of one process records it
            too, and a strategy (``FSDP``, ``DEEPSPEED``) does not replace it in a config file.
        host_worker: the kernel starts one host worker and the device's own launcher starts the
            processes (torch_xla's): forked workers inherit nothing of the kernel's, and no
            local workers of the kernel's share ``/dev/shm``.
        pool_refusal: why a warm pool cannot run on it (None: it can).
        cluster: a Ray cluster job can run on it.
        backend: ``"module:Class"`` of the backend that starts it (a cluster job: the cluster's).
    """

    distributed_type: str
    own_type: bool = False
    host_worker: bool = False
    pool_refusal: str | None = None
    cluster: bool = True
    backend: str = "notebook_accel.launch.backends.processes:ProcessBackend"

    def recorded_type(self, num_processes: int) -> str:
        """The peer's ``DistributedType`` of a job of ``num_processes`` on it (``NO``: one process)."""
        return self.distributed_type if num_processes > 1 or self.own_type else "NO"


LAUNCHES: dict[str, DeviceLaunch] = {  # contract.DEVICE_TYPES -> its row
    "cpu": DeviceLaunch("MULTI_CPU"),
    "cuda": DeviceLaunch("MULTI_GPU"),
    "xla": DeviceLaunch(
        "XLA", own_type=True, host_worker=True, cluster=False,
        pool_refusal=("device='xla': a pool cannot keep TPU cores warm yet; use "
                      "notebook_launcher (or %%accelerate --fresh) on a TPU"),
        backend="notebook_accel.launch.backends.xla:XlaBackend"),
}


def device_launch(device_type: str) -> DeviceLaunch:
    """The row of ``device_type`` (one of ``contract.DEVICE_TYPES``)."""
    return LAUNCHES[device_type]
