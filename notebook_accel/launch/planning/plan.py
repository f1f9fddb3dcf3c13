"""Turn the launch options, each checked where it entered, into one plan.

What the options cannot do together is refused here, before any worker starts, with a
message naming the values; so is what this machine's GPUs cannot run (bf16 without
native support, a GPU the installed torch has no kernels for), and a ``/dev/shm`` too small
for several workers is said once (:func:`shm_note`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from notebook_accel.contract import OPTIONS
from notebook_accel.launch.planning.request import launch_options
from notebook_accel.launch.planning.start_method import StartChoice, choose_start_method
from notebook_accel.machine import devices, gpu_support, hardware
from notebook_accel.machine.launch_kinds import device_launch, runnable_kinds
from notebook_accel.machine.tpu import XlaJob, xla_job

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
SHM_NEEDED = 512 << 20  # /dev/shm below this: a multi-process launch is warned (Docker gives 64 MB)
_shm_said: set[tuple[int, bool]] = set()  # (size, NCCL part): each said once per kernel


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the supervisor needs to start and watch one job."""

    num_processes: int  # on this node
    num_nodes: int
    node_rank: int
    device_type: str
    mixed_precision: str
    start: StartChoice
    master_addr: str
    port: int | None  # None: any free port, bound by the kernel at launch
    timeout: float | None
    output: str
    return_all: bool
    max_restarts: int
    xla: XlaJob | None = None  # device "xla": how torch_xla runs the cores (one host worker)
    # strategy settings (FSDP_*) from the config file, and torch.compile's (ACCELERATE_DYNAMO_*)
    worker_env: dict[str, str] = field(default_factory=dict)
    cluster: str | None = None  # a Ray cluster's address: the kernel drives every node through Ray
    stop_wait: float = OPTIONS["stop_wait"].default  # a pool run's ranks have this long to reach the stop button's cut
    hang_after: float | None = OPTIONS["hang_after"].default  # seconds without progress before a rank is marked
    heal: bool = True  # a pool replaces a dead rank alone (launch/pools/heal.py), else every rank

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.num_processes + local_rank

    @property
    def hosts_rendezvous(self) -> bool:
        """The main node's kernel hosts the store; other nodes' workers join it (on a cluster,
        rank 0 hosts it on its node)."""
        return self.node_rank == 0 and self.cluster is None

    def threads_per_worker(self) -> int | None:
        """Intra-op threads per worker (``threads_per_worker``)."""
        return threads_per_worker(self.num_processes)


def threads_per_worker(num_processes: int) -> int | None:
    """Intra-op threads per worker, so N workers do not oversubscribe the cores; the
    user's ``OMP_NUM_THREADS`` when set (None when it is not a positive integer)."""
    chosen = os.environ.get("OMP_NUM_THREADS", "").strip()
    if chosen:
        return int(chosen) if chosen.isdigit() and int(chosen) > 0 else None
    return max(1, hardware.detect().cpu_count // num_processes)


def _device_type(device: str | None, hw: hardware.Hardware) -> str:
    if device == "cuda" and hw.gpu_count == 0:
        raise ValueError("device='cuda' but no NVIDIA GPU is visible to this kernel")
    return device if device is not None else devices.auto_device(hw)


def _num_processes(count: int | None, device_type: str, hw: hardware.Hardware) -> int:
    if count is None:
        return devices.every_device(device_type, hw) or 1
    if device_type == "cuda" and count > hw.gpu_count:
        raise ValueError(
            f"num_processes={count} but only {hw.gpu_count} GPU(s) are visible "
            f"({hw.summary()}); use num_processes <= {hw.gpu_count}, or device='cpu'"
        )
    return count


def _check_gpus(hw: hardware.Hardware, mixed_precision: str, precision_source: str | None) -> None:
    """Refuse what the visible GPUs cannot run, naming them (found without touching CUDA here)."""
    arch_list = gpu_support.torch_arch_list()
    cannot = gpu_support.gpus_torch_cannot_run(hw, arch_list)
    if cannot:
        named = ", ".join(f"{name} (compute capability {cap[0]}.{cap[1]}, sm_{cap[0]}{cap[1]})"
                          for name, cap in cannot)
        wanted = " or ".join(sorted({f"sm_{cap[0]}{cap[1]}" for _, cap in cannot}))
        others = len(cannot) < len(set(hw.gpus()))
        raise ValueError(
            f"{named}: the installed {gpu_support.torch_build()} has no kernels for it (built "
            f"for {' '.join(arch_list)}), so every CUDA operation would fail in the workers; use "
            "device='cpu'" + (", or CUDA_VISIBLE_DEVICES to leave it out" if others else "")
            + f", or install a torch built for {wanted} (https://pytorch.org/get-started/locally/: "
            "older GPUs are in the wheels for older CUDA versions)")
    if mixed_precision != "bf16":
        return
    lacking = [gpu for gpu, native in gpu_support.bf16_verdicts(hw).items() if native is False]
    if lacking:
        where = f"{precision_source}: " if precision_source else ""
        raise ValueError(
            f"{where}mixed_precision='bf16' on {', '.join(lacking)}: "
            f"{gpu_support.BF16_WHY}; below that, torch only emulates it, slowly. Valid here: "
            "'no', 'fp16' (use mixed_precision='fp16': float16 with a gradient scaler)")


def shm_note(plan: LaunchPlan, size: int | None = None) -> str | None:
    """A warning, said once per kernel, when ``/dev/shm`` (``size`` bytes; read when None) is
    smaller than :data:`SHM_NEEDED` and several local workers will share it (asked for a
    ``local`` backend's plan only): what breaks (NCCL's shared-memory transport on CUDA;
    DataLoader workers everywhere) and the fixes."""
    if plan.num_processes < 2 or device_launch(plan.device_type).host_worker:
        return None
    size = hardware.shm_bytes() if size is None else size
    if size is None or size >= SHM_NEEDED:
        return None
    nccl = plan.device_type == "cuda" and os.environ.get("NCCL_SHM_DISABLE", "") != "1"
    if (size, nccl) in _shm_said:
        return None
    _shm_said.add((size, nccl))
    what, errors, fixes = "", "", "or keep DataLoader(num_workers=0)"  # CPU (gloo): DataLoaders
    if nccl:
        what = "NCCL's shared-memory transport between the GPUs and "
        errors = "NCCL 'unhandled system error', "
        fixes = ("or set NCCL_SHM_DISABLE=1 (NCCL then goes through sockets, slower) and keep "
                 "DataLoader(num_workers=0)")
    return (f"/dev/shm is only {size >> 20} MB, less than {plan.num_processes} workers need "
            f"({SHM_NEEDED >> 20} MB or more): {what}DataLoader workers (num_workers > 0) pass "
            f"data through it and fail with obscure errors when it fills ({errors}'Bus error', "
            f"a DataLoader worker killed). Fix: `docker run --shm-size=1g` (or more); {fixes}")


def _filled(options: Mapping[str, Any]) -> dict[str, Any]:
    """Every launch option's value: ``options``' (None: unset, except where None is a value),
    else the row's default. The values are not checked again: each was where it entered (the
    front door's :class:`~notebook_accel.launch.planning.request.LaunchRequest`, the environment, the
    config file), naming that place.

    Raises:
        TypeError: an option the table does not have.
    """
    table = {name: option for name, option in launch_options().items() if option.argument}
    unknown = sorted(set(options) - set(table))
    if unknown:
        raise TypeError(f"make_plan got unknown option(s) {unknown}; valid: {', '.join(table)}")
    values = {}
    for name, option in table.items():
        value = options.get(name)
        if value is None and not (option.nullable and name in options):
            value = option.default
        values[name] = value
    return values


def make_plan(
    *,
    worker_env: Mapping[str, str] | None = None,
    starting: Callable[[int, StartChoice], None] | None = None,
    sources: Mapping[str, str] | None = None,
    **options: Any,
) -> LaunchPlan:
    """Judge the launch options together (by name, as ``notebook_launcher`` takes them, each
    already checked by its row where it entered: ``launcher.plan_launch``; one left out takes
    its row's default), and build the plan.

    Args:
        worker_env: the workers' variables so far (the training strategy's, the config file's
            ``dynamo_config``); the options with ``to_workers`` in their row add theirs.
        starting: told the local worker count and the start method once both are known
            (not for XLA or a cluster), so the launch can say what it starts: before the
            hardware is detected (which imports torch, seconds on a cold kernel) when
            ``num_processes`` was given, after it otherwise.
        sources: where options that were not arguments came from (``"mixed_precision":
            "environment variable NOTEBOOK_ACCEL_MIXED_PRECISION"`` or ``"c.yaml, line 3"``),
            to start an error about their value.

    Raises:
        TypeError: an option the table does not have.
        ValueError: options that do not go together (``node_rank >= num_nodes``...); on CUDA,
            a GPU the installed torch cannot run, or ``mixed_precision="bf16"`` on a GPU without native
            bf16 (compute capability below 8.0: T4, V100, P100), naming the GPU.
    """
    o = _filled(options)
    worker_env = {**(worker_env or {}), **{
        option.env: option.to_workers(o[name]) for name, option in launch_options().items()
        if option.to_workers and options.get(name) is not None}}
    mixed_precision, num_nodes, node_rank = o["mixed_precision"], o["num_nodes"], o["node_rank"]
    if node_rank >= num_nodes:
        raise ValueError(f"node_rank={node_rank} must be < num_nodes={num_nodes} (0..{num_nodes - 1})")
    common = {"timeout": o["timeout"], "output": o["output"], "return_all": o["return_all"],
              "max_restarts": o["max_restarts"], "worker_env": worker_env,
              "stop_wait": o["stop_wait"], "hang_after": o["hang_after"], "heal": o["heal"]}
    if o["cluster"] is not None:
        return _cluster_plan(o["cluster"], o["num_processes"], num_nodes, node_rank, o["device"],
                             mixed_precision, o["start_method"], common)
    if num_nodes > 1:
        if o["master_addr"] in _LOOPBACK:
            raise ValueError(
                f"num_nodes={num_nodes} needs master_addr set to the main node's address that "
                f"every node can reach, not {o['master_addr']!r}"
            )
        if o["use_port"] is None:
            raise ValueError(f"num_nodes={num_nodes} needs use_port: every node must use the same port")
    device, wanted = o["device"], o["num_processes"]
    hosted = device is not None and device_launch(device).host_worker  # its own launcher counts
    start = choose_start_method(o["start_method"],
                                None if wanted is None or hosted else lambda: threads_per_worker(wanted))
    if starting is not None and wanted is not None and not hosted:
        starting(wanted, start)  # the checks that need no hardware passed; it may take seconds

    hw = hardware.detect()
    device_type = _device_type(device, hw)
    if mixed_precision == "auto":
        mixed_precision = devices.best_precision(device_type, hw)
    xla = None
    if device_launch(device_type).host_worker:  # one host worker; torch_xla starts the cores
        xla, count = xla_job(wanted, tpu=hw.tpu, tpu_cores=hw.tpu_cores, num_nodes=num_nodes), 1
    else:
        count = _num_processes(wanted, device_type, hw)
        if device_type == "cuda":
            _check_gpus(hw, mixed_precision, (sources or {}).get("mixed_precision"))
        if wanted is None:
            if start.method == "fork":  # each worker's threads are known now
                start = choose_start_method(o["start_method"], lambda: threads_per_worker(count))
            if starting is not None:
                starting(count, start)
    return LaunchPlan(
        num_processes=count, num_nodes=num_nodes, node_rank=node_rank, device_type=device_type,
        mixed_precision=mixed_precision, start=start, master_addr=o["master_addr"],
        port=o["use_port"], xla=xla, **common)


def _cluster_plan(cluster: str, num_processes: int | None, num_nodes: int, node_rank: int,
                  device: str | None, mixed_precision: str, start_method: str,
                  common: dict[str, Any]) -> LaunchPlan:
    """A job on a Ray cluster: this kernel drives every node; Ray places the ranks, so this
    machine's devices and addresses do not bound it (the cluster backend checks the nodes)."""
    if node_rank != 0:
        raise ValueError(f"node_rank={node_rank} with cluster={cluster!r}: one kernel drives every "
                         "node of a cluster job, so leave node_rank unset (0)")
    device_type = "cpu" if device is None else device
    if mixed_precision == "auto":
        raise ValueError(f"mixed_precision='auto' with cluster={cluster!r}: the nodes' hardware is "
                         "not known before they start; use 'no', 'fp16' or 'bf16'")
    if not device_launch(device_type).cluster:
        runs_on = " or ".join(repr(d) for d, launch in runnable_kinds().items() if launch.cluster)
        raise ValueError(f"device={device_type!r} with cluster={cluster!r}: a cluster job runs on {runs_on}")
    return LaunchPlan(
        num_processes=num_processes or 1, num_nodes=num_nodes, node_rank=0,
        device_type=device_type, mixed_precision=mixed_precision,
        start=choose_start_method(start_method), master_addr="", port=None, cluster=cluster,
        **common)
