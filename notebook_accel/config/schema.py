"""``LaunchConfig``: the keys and values of Accelerate's ``default_config.yaml``, validated."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from notebook_accel.config import dynamo
from notebook_accel.contract import DEVICE_TYPES, OPTIONS, must_be, not_one_of
from notebook_accel.contract import FILE_MIXED_PRECISIONS as MIXED_PRECISIONS
from notebook_accel.machine.launch_kinds import device_launch, runnable_kinds
from notebook_accel.strategies.registry import config_sections

COMPUTE_ENVIRONMENTS = ("LOCAL_MACHINE",)
# MIXED_PRECISIONS: what the file may hold (Accelerate's vocabulary, with fp8, so the peer's
# files load, and our "auto"); a launch accepts only contract.LAUNCH_MIXED_PRECISIONS and says so.
_DEVICE_OF = {  # the peer's distributed_type -> our device type (None: auto-detect); use_cpu: cpu
    "NO": None, **{launch.distributed_type: device for device, launch in runnable_kinds().items()}, "TPU": "xla",
    "FSDP": None,  # sharded (fsdp_config: the workers' FSDP_* variables); the device is auto-detected
    "DEEPSPEED": None,  # ZeRO (deepspeed_config: the workers' ACCELERATE_DEEPSPEED_* variables)
}
# The training strategies (the device is separate), each with its section of the file: the registry's.
STRATEGY_SECTIONS = config_sections()
# The peer's other values load (the file stays usable by the peer) but are reported.
UNSUPPORTED_DISTRIBUTED_TYPES = ("MEGATRON_LM", "MULTI_NPU", "MULTI_MLU",
                                 "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU",
                                 "MULTI_NEURON")
DISTRIBUTED_TYPES = (*_DEVICE_OF, *UNSUPPORTED_DISTRIBUTED_TYPES)


def _mpirun_hostfile(extra: Mapping[str, Any]) -> bool:
    """Whether the file's ``mpirun_config`` names a hostfile (the peer's multi-CPU launch)."""
    section = extra.get("mpirun_config")
    return isinstance(section, Mapping) and bool(section.get("mpirun_hostfile"))


class KeyValueError(ValueError):
    """A bad value for one key (``.key``); :func:`~notebook_accel.config.load_config` adds
    the file and line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def choice(key: str, value: Any, valid: tuple[str, ...], fold: Callable[[str], str]) -> str:
    if isinstance(value, str) and fold(value) in valid:
        return fold(value)
    raise KeyValueError(key, not_one_of(key, value, valid))


def _row(option: str, key: str, value: Any, optional: bool = True) -> Any:
    """The file's ``key``, checked by its launch option's row (None: unset, when ``optional``)."""
    if value is None and optional:
        return None
    try:
        return OPTIONS[option].check_key(value, key)
    except ValueError as err:
        raise KeyValueError(key, str(err)) from None


def _gpu_ids(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).replace(" ", "") if isinstance(value, (str, int)) else ""
    if not isinstance(value, bool) and (text == "all" or (
            text and all(part.isdigit() for part in text.split(",")))):
        return text
    raise KeyValueError("gpu_ids", must_be("gpu_ids", value, "'all', a comma-separated list of "
                                           "GPU indices such as '0,1', or null"))


@dataclass
class LaunchConfig:
    """How to launch the workers, with the keys of Accelerate's ``default_config.yaml``.

    ``None`` means "not set": the launcher detects it. ``distributed_type`` and
    ``use_cpu`` are the peer's way to name the device; :attr:`device_type` is ours.
    ``start_method`` is our own key (``auto``, ``fork``, ``forkserver``, ``spawn``).
    ``dynamo_backend`` is kept in the file's ``dynamo_config`` section, as the peer does
    (its other keys stay in ``extra``, checked: ``notebook_accel.config.dynamo``).
    ``extra`` holds keys of the file we do not use; they are written back on save.
    Bad values raise :class:`ValueError` naming the key and the valid values.

    Example::

        cfg = LaunchConfig(num_processes=2, mixed_precision="bf16").with_device("cuda")
    """

    compute_environment: str = "LOCAL_MACHINE"
    distributed_type: str = "NO"
    num_processes: int | None = None
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    gpu_ids: str | None = None
    mixed_precision: str = "no"
    use_cpu: bool = False
    start_method: str = "auto"
    cluster: str | None = None  # our own key: a Ray cluster's address
    dynamo_backend: str | None = None  # in the file: dynamo_config's dynamo_backend (the peer's format)
    heal: bool | None = None  # our own key: a warm pool replaces a dead rank alone (default true)
    snapshot_every: int | None = None  # our own key: Accelerator() snapshots every N steps
    snapshot_dir: str | None = None  # our own key: where snapshots go (and resume() looks)
    snapshot_in_peers: bool | None = None  # our own key: snapshots also kept in the peers' memory
    check_collectives: bool | None = None  # our own key: ranks compare each collective first
    idle_timeout: float | None = None  # our own key: seconds a detached pool waits idle, then ends
    extra: dict[str, Any] = field(default_factory=dict)
    source: Path | None = field(default=None, compare=False)  # the file it was read from

    def __post_init__(self) -> None:
        self.compute_environment = choice(
            "compute_environment", self.compute_environment, COMPUTE_ENVIRONMENTS, str.upper)
        self.distributed_type = choice(
            "distributed_type", self.distributed_type, DISTRIBUTED_TYPES, str.upper)
        if self.num_processes == -1:  # the peer's "not set"
            self.num_processes = None
        self.num_processes = _row("num_processes", "num_processes", self.num_processes)
        self.num_machines = _row("num_nodes", "num_machines", self.num_machines, optional=False)
        self.machine_rank = _row("node_rank", "machine_rank", self.machine_rank, optional=False)
        if self.machine_rank >= self.num_machines:
            raise KeyValueError("machine_rank", must_be(
                "machine_rank", self.machine_rank, f"an integer from 0 to {self.num_machines - 1} "
                f"(num_machines: {self.num_machines})"))
        self.main_process_ip = _row("master_addr", "main_process_ip", self.main_process_ip)
        self.main_process_port = _row("use_port", "main_process_port", self.main_process_port)
        self.gpu_ids = _gpu_ids(self.gpu_ids)
        if self.mixed_precision in (None, False):  # YAML 1.1 reads a bare `no` as false
            self.mixed_precision = "no"
        self.mixed_precision = choice(
            "mixed_precision", self.mixed_precision, MIXED_PRECISIONS, str.lower)
        if not isinstance(self.use_cpu, bool):
            raise KeyValueError("use_cpu", must_be("use_cpu", self.use_cpu, "true or false"))
        self.start_method = _row("start_method", "start_method", self.start_method)
        self.cluster = _row("cluster", "cluster", self.cluster)
        self.dynamo_backend = _row("dynamo_backend", "dynamo_backend", self.dynamo_backend)
        self.heal = _row("heal", "heal", self.heal)
        self.snapshot_every = _row("snapshot_every", "snapshot_every", self.snapshot_every)
        self.snapshot_dir = _row("snapshot_dir", "snapshot_dir", self.snapshot_dir)
        self.snapshot_in_peers = _row("snapshot_in_peers", "snapshot_in_peers", self.snapshot_in_peers)
        self.check_collectives = _row("check_collectives", "check_collectives",
                                      self.check_collectives)
        self.idle_timeout = _row("idle_timeout", "idle_timeout", self.idle_timeout)
        try:
            dynamo.check_section(self.extra.get(dynamo.SECTION))
        except ValueError as err:
            raise KeyValueError(dynamo.SECTION, str(err)) from None

    @property
    def device_type(self) -> str | None:
        """``"cpu"``, ``"cuda"``, ``"xla"``, or ``None`` (auto-detect), from the peer's keys."""
        return "cpu" if self.use_cpu else _DEVICE_OF.get(self.distributed_type)

    def with_device(self, device: str | None) -> LaunchConfig:
        """A copy whose ``distributed_type``/``use_cpu`` say ``device`` (None: auto).

        Written so that the peer's ``accelerate launch --config_file`` starts as many
        processes as we do. The peer starts several (through torchrun) only for
        ``MULTI_GPU`` and the strategies (``FSDP``, ``DEEPSPEED``, kept as they are); its
        ``MULTI_CPU`` runs one process unless ``mpirun_config`` names a hostfile (then
        ``MULTI_CPU`` is kept). So several processes are ``MULTI_GPU``, with ``use_cpu: true``
        on ``cpu`` (read back as ``cpu``: ``use_cpu`` wins); ``xla`` is ``XLA``; one process
        is ``NO``. Call it after setting ``num_processes``.

        ``None`` (auto) is ``NO``, which reads back as auto-detect but which the peer runs
        as one process: its format has no "auto" for several processes, so a caller that
        knows the machine passes the device auto means there (the config panel does).
        """
        if device is not None:
            device = choice("device", device, DEVICE_TYPES, str.lower)
        many = (self.num_processes or 1) > 1 or self.num_machines > 1
        launch = None if device is None else device_launch(device)
        kind = "MULTI_GPU" if many and launch is not None and not launch.own_type else "NO"
        if device == "cpu" and self.distributed_type == "MULTI_CPU" and _mpirun_hostfile(self.extra):
            kind = "MULTI_CPU"  # the peer runs it through mpirun
        if launch is not None and launch.own_type:
            kind = launch.distributed_type
        elif self.distributed_type in STRATEGY_SECTIONS:  # the strategy stays
            kind = self.distributed_type  # use_cpu says the device
        return dataclasses.replace(self, distributed_type=kind, use_cpu=device == "cpu", extra=dict(self.extra))

    def to_dict(self) -> dict[str, Any]:
        """The file's content: our keys (unset ones and ``start_method: auto`` left out,
        so the peer can read the file too) merged with :attr:`extra`, sorted by key."""
        data = dict(self.extra)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in ("extra", "source", "dynamo_backend") and value is not None:
                data[f.name] = value
        if self.dynamo_backend is not None:
            data[dynamo.SECTION] = {**(data.get(dynamo.SECTION) or {}),
                                    dynamo.BACKEND_KEY: self.dynamo_backend.upper()}
        if data.get("start_method") == "auto":
            del data["start_method"]
        return dict(sorted(data.items()))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: Path | None = None) -> LaunchConfig:
        """Build from a file's mapping; keys that are not fields go to :attr:`extra`."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "source", "dynamo_backend"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names}
        section = extra.get(dynamo.SECTION)
        if isinstance(section, Mapping) and dynamo.BACKEND_KEY in section:
            extra[dynamo.SECTION] = {k: v for k, v in section.items() if k != dynamo.BACKEND_KEY}
            known["dynamo_backend"] = section[dynamo.BACKEND_KEY]
        return cls(**known, extra=extra, source=source)
