"""The XLA backend: one host worker, which starts one process per TPU chip through torch_xla.

The kernel starts a single *host* worker through the local-processes backend (so
output relay, ``WorkerError``, interrupt and kernel-death handling all apply); the
host worker runs :func:`notebook_accel.launch.worker.xla_cores.run_cores`, which
calls torch_xla's own launcher (``torch_xla.launch``, PJRT). Rank 0's return value
(all cores' with ``return_all``) is the host worker's own return value.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

from notebook_accel.launch.backends.base import Backend, WorkerGroup
from notebook_accel.launch.backends.processes import ProcessBackend
from notebook_accel.launch.handoff.payload import Payload, serialise_payload
from notebook_accel.launch.planning.plan import LaunchPlan
from notebook_accel.launch.worker.xla_cores import run_cores
from notebook_accel.machine import hardware
from notebook_accel.machine.tpu import (
    install_hint,
    runtime_initialised,
    runtime_initialised_message,
    xla_job,
)
from notebook_accel.machine.tpu_holders import tpu_held_message


def _torch_xla_installed() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


class XlaBackend(Backend):
    """TPU cores through torch_xla's launcher, from one host worker that ``hosts`` starts."""

    name = "xla"

    def __init__(self, hosts: Backend | None = None) -> None:
        self.hosts = hosts if hosts is not None else ProcessBackend()

    def check(self, plan: LaunchPlan) -> None:
        """Refuse up front when torch_xla is missing, or the TPU is held already: by this
        process's XLA runtime, by jax in this kernel, or by another process (named).

        Raises:
            ImportError: torch_xla is not installed; says how to install it.
            RuntimeError: the TPU is held; says by whom and how to recover.
        """
        if not _torch_xla_installed():
            raise ImportError(f"device='xla' needs torch_xla, which is not installed here: "
                              f"{install_hint()}")
        interactive = "ipykernel" in sys.modules
        if runtime_initialised():
            raise RuntimeError(runtime_initialised_message(interactive=interactive))
        if plan.xla is not None and plan.xla.pjrt_device == "TPU":
            held = tpu_held_message(interactive=interactive)
            if held is not None:
                raise RuntimeError(held)

    def start(self, plan: LaunchPlan, payload: Payload) -> WorkerGroup:
        """Start the host worker running ``payload`` on the cores of ``plan.xla``.

        Raises:
            ValueError: see :func:`notebook_accel.machine.tpu.xla_job`.
        """
        hw = hardware.detect()
        job = plan.xla or xla_job(plan.num_processes, tpu=hw.tpu, tpu_cores=hw.tpu_cores,
                                  num_nodes=plan.num_nodes)
        cores_start = "spawn" if plan.start.method == "spawn" else "fork"
        host_payload = serialise_payload(
            run_cores,
            (payload, job.nprocs, plan.return_all, cores_start, job.pjrt_device, plan.output), {},
        )
        host_plan = dataclasses.replace(plan, num_processes=1, return_all=False)
        return self.hosts.start(host_plan, host_payload)
