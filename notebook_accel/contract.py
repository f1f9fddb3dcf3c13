"""The launch options, once: name, type, choices, environment variable, config-file key, flags, help.

Every front end reads this table (with the strategies' own rows, ``strategies/registry.py``),
through one request object (``launch/planning/request.py``): ``notebook_launcher``'s signature,
``WorkerPool``'s keywords, the ``%%accelerate`` magic's flags (``magics/cell/arguments.py``), the
``notebook-accel`` command's flags (``cli/``), the config file's precedence
(``config/resolve.py``); the config panel's fields are checked against it
(``tests/runtime/test_contract.py``). Adding a launch option is one :class:`LaunchOption` row here
plus whatever the option does (``docs/architecture.md``, "Adding a launch option").

A value is checked where it enters (argument, flag, environment variable, file key) by
:meth:`LaunchOption.check`, the one validator; the error names that place and the valid values.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The vocabularies.
MIXED_PRECISIONS = ("no", "fp16", "bf16")  # what Accelerator() (and so every worker) accepts
# A launch also takes "auto": the best the hardware supports (machine/devices.best_precision),
# decided in the kernel, so the workers get one of MIXED_PRECISIONS.
LAUNCH_MIXED_PRECISIONS = (*MIXED_PRECISIONS, "auto")
FILE_MIXED_PRECISIONS = (*MIXED_PRECISIONS, "fp8", "auto")  # what the config file may hold
DEVICE_TYPES = ("cpu", "cuda", "xla")
START_METHODS = ("auto", "fork", "forkserver", "spawn")
OUTPUT_CHOICES = ("all", "main", "none")
RDZV_BACKENDS = ("static", "c10d")  # both meet at a store the kernel hosts (launch/planning/rdzv.py)
# torch.compile through the Accelerator: the peer's DynamoBackend values (lower case) and modes.
DYNAMO_BACKENDS = ("no", "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser",
                   "cudagraphs", "ofi", "fx2trt", "onnxrt", "tensorrt", "aot_torchxla_trace_once",
                   "torchxla_trace_once", "tvm", "hpu_backend", "neuron")
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Environment variables: the kernel's inputs, and what every worker gets.
# The torchrun-standard names every worker gets (the runtime reads only these and ours below).
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"

CONFIG_FILE_ENV = "NOTEBOOK_ACCEL_CONFIG_FILE"
NUM_PROCESSES_ENV = "NOTEBOOK_ACCEL_NUM_PROCESSES"
MIXED_PRECISION_ENV = "NOTEBOOK_ACCEL_MIXED_PRECISION"  # also the workers' setting
START_METHOD_ENV = "NOTEBOOK_ACCEL_START_METHOD"
DEVICE_ENV = "NOTEBOOK_ACCEL_DEVICE"  # the workers' device type (set by the launcher)
LAUNCHED_ENV = "NOTEBOOK_ACCEL_LAUNCHED"  # "1" inside a worker started by notebook_launcher
CLUSTER_ENV = "NOTEBOOK_ACCEL_CLUSTER"
SNAPSHOT_EVERY_ENV = "NOTEBOOK_ACCEL_SNAPSHOT_EVERY"  # also the workers' setting
SNAPSHOT_DIR_ENV = "NOTEBOOK_ACCEL_SNAPSHOT_DIR"  # also the workers' setting
SNAPSHOT_IN_PEERS_ENV = "NOTEBOOK_ACCEL_SNAPSHOT_IN_PEERS"  # also the workers' setting
CHECK_COLLECTIVES_ENV = "NOTEBOOK_ACCEL_CHECK_COLLECTIVES"  # also the workers' setting
NODE_RANK = "NODE_RANK"  # torchrun's other name for GROUP_RANK
TORCH_DEVICE_ENV = "ACCELERATE_TORCH_DEVICE"  # the peer's name for the rank's torch device
# torch.compile settings (the peer's names): read by TorchDynamoPlugin() in the workers; the
# backend is also the launch option's variable, the others come from the file's dynamo_config.
DYNAMO_BACKEND_ENV = "ACCELERATE_DYNAMO_BACKEND"
DYNAMO_MODE_ENV = "ACCELERATE_DYNAMO_MODE"
DYNAMO_FULLGRAPH_ENV = "ACCELERATE_DYNAMO_USE_FULLGRAPH"
DYNAMO_DYNAMIC_ENV = "ACCELERATE_DYNAMO_USE_DYNAMIC"
DYNAMO_REGIONAL_ENV = "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"


def not_one_of(name: str, value: Any, choices: tuple[Any, ...]) -> str:
    """The one message style for a value outside its choices: ``device='gpu' is not one of 'cpu', ...``."""
    return f"{name}={value!r} is not one of {', '.join(repr(c) for c in choices)}"


def must_be(name: str, value: Any, valid: str) -> str:
    """The one message style for any other bad value: ``num_processes=0 must be an integer >= 1``."""
    return f"{name}={value!r} must be {valid}"


class _BadValue(Exception):
    """Inside :meth:`LaunchOption.check`: a bad value (``wrong_type``: not even of the type)."""

    def __init__(self, message: str, wrong_type: bool = False) -> None:
        super().__init__(message)
        self.wrong_type = wrong_type


@dataclass(frozen=True)
class LaunchOption:
    """One launch option and every name it goes by.

    ``argument``: ``notebook_launcher``'s keyword (False: a config-file key only), taken by
    position too when ``positional`` (in the table's order: the peer's); ``pool_only``: a
    ``WorkerPool`` keyword only; ``not_for_pool``: why a warm pool refuses it (None: a pool
    takes it too); ``env``: the variable read between arguments and the file; ``to_workers``:
    the workers get the value in ``env``, written by this function; ``file_key``: its key in
    the config file (a :class:`~notebook_accel.config.LaunchConfig` field); ``magic_flag`` /
    ``cli_flag``: the ``%%accelerate`` flag and the ``notebook-accel launch``/``test`` flag
    (``cli_launch_only``: ``launch`` only), ``short_flag`` the same in both; ``switch``: the magic flag is a pair, ``--x`` /
    ``--no-x`` (True / False); ``config_flag``: ``notebook-accel config`` writes it (as
    ``--file-key``); ``panel_field``: the config panel's attribute showing it; ``default``: the
    value a launch uses when nothing sets it (None: auto-detected, or unset); ``nullable``: None
    is a value (``hang_after=None``: never), not "unset"; ``digits``: a string of digits is taken
    too (``use_port="29500"``, the peer's default); ``default_valid``: the default is a value
    too, though outside the valid ones (``rdzv_endpoint=""``, the peer's default: no endpoint).
    """

    name: str
    kind: type
    help: str
    choices: tuple[str, ...] = ()
    low: int | None = None
    high: int | None = None
    positive: bool = False  # a number > 0 (timeouts)
    argument: bool = True
    positional: bool = False
    pool_only: bool = False
    not_for_pool: str | None = None
    env: str | None = None
    to_workers: Callable[[Any], str] | None = None
    file_key: str | None = None
    magic_flag: str | None = None
    cli_flag: str | None = None
    cli_launch_only: bool = False
    short_flag: str | None = None
    switch: bool = False
    config_flag: bool = False
    panel_field: str | None = None
    metavar: str | None = None  # in --help; default N for an int, else VALUE
    default: Any = None
    nullable: bool = False
    digits: bool = False
    default_valid: bool = False
    valid_text: str = ""  # the valid values in words, where the kind does not say them

    def valid(self, short: bool = False) -> str:
        """The valid values in words: ``'no', 'fp16', 'bf16'`` or ``an integer >= 1``."""
        if self.choices:
            return ", ".join(repr(c) for c in self.choices)
        if self.kind is int:
            word = "an int" if short else "an integer"
            if self.high is not None:
                return f"{word} from {self.low} to {self.high}"
            return f"{word} >= {self.low}"
        if self.positive:
            return "a positive number of seconds"
        if self.kind is bool:
            return "true or false"
        if self.valid_text:
            return self.valid_text
        return "a non-empty string" if self.kind is str else f"a {self.kind.__name__}"

    def check(self, value: Any, source: str | None = None, key: str | None = None) -> Any:
        """``value`` normalised (choices lower-cased), or an error naming ``source`` and the
        valid values.

        Args:
            source: where the value came from: None for ``notebook_launcher``'s argument
                (``num_processes=0 must be an int >= 1``), else e.g. ``"flag --device"``,
                ``"environment variable NOTEBOOK_ACCEL_NUM_PROCESSES"`` or
                ``"/path/c.yaml, line 2"``, which starts the message.
            key: the name the source knows the option by (a file key); default its name.
        Raises:
            TypeError: a mistyped argument (``source`` None), such as ``num_processes='2'``.
            ValueError: any other bad value.
        """
        try:
            return self._normalise(value, key or self.name, short=source is None)
        except _BadValue as err:
            if source is None:
                raise (TypeError if err.wrong_type else ValueError)(str(err)) from None
            raise ValueError(f"{source}: {err}") from None

    def check_key(self, value: Any, key: str) -> Any:
        """``value`` of the config file's ``key`` (this option's), normalised, or a ValueError
        that the file's reader starts with the file and line (``c.yaml, line 2: ...``)."""
        try:
            return self._normalise(value, key, short=False)
        except _BadValue as err:
            raise ValueError(str(err)) from None

    def _normalise(self, value: Any, name: str, short: bool) -> Any:
        if self.default_valid and type(value) is type(self.default) and value == self.default:
            return value
        valid = self.valid(short)
        if self.digits and isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if self.kind is bool:
            return _truth(value, name)
        if self.choices:
            if isinstance(value, str) and value.lower() in self.choices:
                return value.lower()
            raise _BadValue(not_one_of(name, value, self.choices))
        if self.kind is int:
            wrong_type = isinstance(value, bool) or not isinstance(value, numbers.Integral)
            if wrong_type or value < (self.low or 0) or (self.high is not None and value > self.high):
                raise _BadValue(must_be(name, value, valid), wrong_type)
            return int(value)
        if self.positive:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
                raise _BadValue(must_be(name, value, f"{valid} or None"))
            return float(value)
        if self.kind is str and not (isinstance(value, str) and value):
            raise _BadValue(must_be(name, value, valid))
        return value


_Opt = LaunchOption
_OPTIONS = (
    # name, type, help
    #     values (choices / bounds), default; who takes it (positional, pool)
    #     environment variable, config-file key, notebook-accel config writes it
    #     %%accelerate flag, notebook-accel launch/test flag, config panel attribute
    # notebook_launcher's positional parameters first, in the peer's order
    _Opt("num_processes", int, "workers on this machine (default: one per GPU, else per CPU core)",
         low=1, positional=True,
         env=NUM_PROCESSES_ENV, file_key="num_processes", config_flag=True,
         magic_flag="--num-processes", cli_flag="--num-processes", short_flag="-n",
         panel_field="num_processes"),
    _Opt("mixed_precision", str, "read by Accelerator() in the workers; auto: the best this "
         "hardware supports (bf16 on TPUs, Ampere+ GPUs and CPUs with bf16 instructions, fp16 on "
         "older GPUs, else no)",
         choices=LAUNCH_MIXED_PRECISIONS, default="no", positional=True,
         env=MIXED_PRECISION_ENV, file_key="mixed_precision", config_flag=True,
         magic_flag="--mixed-precision", cli_flag="--mixed-precision",
         panel_field="precision_buttons"),
    _Opt("use_port", int, "rendezvous port (default: a free one)", metavar="PORT",
         low=1, high=65535, digits=True, positional=True,
         file_key="main_process_port", config_flag=True,
         magic_flag="--port", cli_flag="--main-process-port", panel_field="main_process_port"),
    _Opt("master_addr", str, "the main machine's address (multi-machine jobs)", metavar="ADDR",
         default="127.0.0.1", positional=True, valid_text="a host name or IP address",
         file_key="main_process_ip", config_flag=True,
         cli_flag="--main-process-ip", panel_field="main_process_ip"),
    _Opt("node_rank", int, "this machine's rank, 0 on the main one", metavar="R",
         low=0, default=0, positional=True,
         not_for_pool="one kernel drives every node of a pool; a pool on several nodes takes "
                      "num_nodes and cluster",
         file_key="machine_rank", config_flag=True,
         cli_flag="--machine-rank", panel_field="machine_rank"),
    _Opt("num_nodes", int, "machines in the job (with cluster: nodes of it; else run the same "
         "command on each)",
         low=1, default=1, positional=True,
         file_key="num_machines", config_flag=True,
         magic_flag="--nodes", cli_flag="--num-machines", panel_field="num_machines"),
    _Opt("rdzv_backend", str, "how the nodes meet: both at a store this kernel hosts (etcd, "
         "which needs a server of its own, is not supported)",
         choices=RDZV_BACKENDS, default="static", positional=True,
         not_for_pool="a pool uses its own static rendezvous"),
    _Opt("rdzv_endpoint", str, "where the nodes meet, 'host:port' (instead of master_addr and "
         "use_port)", default="", default_valid=True, positional=True, valid_text="'host:port'",
         not_for_pool="a pool uses its own static rendezvous"),
    _Opt("rdzv_conf", object, "the peer's torch elastic rendezvous settings: taken, unused (the "
         "nodes meet at a store this kernel hosts, with no settings of its own)",
         positional=True, not_for_pool="a pool uses its own static rendezvous"),
    _Opt("rdzv_id", str, "the peer's rendezvous run id: taken, unused (a launch is one job)",
         default="none", positional=True, not_for_pool="a pool uses its own static rendezvous"),
    _Opt("max_restarts", int, "relaunch the whole job up to N times after a failure",
         low=0, default=0, positional=True,
         not_for_pool="a pool does not relaunch; after a failure it keeps (or replaces) its workers",
         cli_flag="--max-restarts", cli_launch_only=True),
    _Opt("monitor_interval", float, "the peer's polling period for failed workers; ours reacts "
         "at once, so any positive value behaves the same (checked, otherwise unused)",
         positive=True, default=0.1, positional=True),
    _Opt("log_line_prefix_template", str, "the peer's torchrun line prefix: taken, unused (every "
         "line is prefixed [rank N]; output= chooses whose lines show)",
         positional=True),
    # keyword-only
    _Opt("start_method", str, "how workers start (auto: fork when safe, else a warm forkserver)",
         choices=START_METHODS, default="auto",
         env=START_METHOD_ENV, file_key="start_method", config_flag=True,
         magic_flag="--start-method", cli_flag="--start-method", panel_field="start_method"),
    _Opt("device", str, "default: CUDA when a GPU is visible, else XLA on a TPU, else CPU",
         choices=DEVICE_TYPES,  # in the file: distributed_type / use_cpu (LaunchConfig.device_type)
         magic_flag="--device", cli_flag="--device", panel_field="device"),
    _Opt("timeout", float, "stop the job after this many seconds", metavar="SECONDS",
         positive=True,
         magic_flag="--timeout", cli_flag="--timeout"),
    _Opt("hang_after", float, "mark a rank that shows no progress (no output, event or "
         "collective) for this many seconds, and show every rank's stack once (default 60; "
         "None: never)", metavar="SECONDS",
         positive=True, default=60.0, nullable=True,
         magic_flag="--hang-after", cli_flag="--hang-after"),
    _Opt("config_file", object, "config file to read instead of the default one", metavar="FILE",
         magic_flag="--config", cli_flag="--config-file"),
    _Opt("cluster", str, "a Ray cluster to run on: any address "
         "ray.init takes ('head:6379', 'auto', or 'ray://head:10001' from outside its network); "
         "one kernel drives every node",
         metavar="ADDRESS",
         valid_text="a Ray cluster address such as 'head:6379', 'auto' or 'ray://head:10001'",
         env=CLUSTER_ENV, file_key="cluster",
         magic_flag="--cluster"),
    _Opt("dynamo_backend", str, "torch.compile the prepared models with this backend (the "
         "file's dynamo_config sets mode, fullgraph, dynamic, regional compilation)",
         choices=DYNAMO_BACKENDS, default="no",
         env=DYNAMO_BACKEND_ENV, to_workers=str.upper,  # the peer's variable and spelling
         file_key="dynamo_backend",  # in the file: dynamo_config's key
         magic_flag="--dynamo-backend", cli_flag="--dynamo-backend",
         panel_field="dynamo_backend"),
    _Opt("gpu_ids", str, "GPUs to use: 'all' or a list such as 0,1", argument=False,
         file_key="gpu_ids", config_flag=True),
    _Opt("output", str, "whose output to show: all ranks (default), the main process, none",
         choices=OUTPUT_CHOICES, default="all",
         magic_flag="--output", cli_flag="--output", cli_launch_only=True),
    _Opt("return_all", bool, "return every local rank's value (a list in rank order) instead "
         "of rank 0's", default=False),
    _Opt("stop_wait", float, "%%accelerate start only: how long every rank has, after the stop "
         "button, to reach the point where they all stop together (default 5)",
         metavar="SECONDS", positive=True, default=5.0, pool_only=True,
         magic_flag="--stop-wait"),
    _Opt("snapshot_every", int, "read by Accelerator() in the workers: a snapshot of the "
         "training state every N optimizer steps, written in the background "
         "(accelerator.snapshot_every; accelerator.resume() goes on from the newest)",
         metavar="STEPS", low=1, env=SNAPSHOT_EVERY_ENV, to_workers=str,
         file_key="snapshot_every", config_flag=True, magic_flag="--snapshot-every"),
    _Opt("snapshot_dir", str, "read by Accelerator() in the workers: where snapshots go and "
         "resume() looks (default: <project_dir>/snapshots, else ./snapshots/<run>); a folder "
         "every rank sees, such as a mounted Drive's /content/drive/MyDrive/run7",
         metavar="DIR", valid_text="a folder path", env=SNAPSHOT_DIR_ENV, to_workers=str,
         file_key="snapshot_dir", config_flag=True, magic_flag="--snapshot-dir"),
    _Opt("snapshot_in_peers", bool, "read by Accelerator() in the workers: each snapshot is also "
         "kept in the peers' memory (every rank holds its part and its neighbour's, about twice "
         "its host copy), so a warm pool's heal brings back lost FSDP shards without disk "
         "(accelerator.snapshot_every(in_peers=True))",
         default=False, env=SNAPSHOT_IN_PEERS_ENV, to_workers=lambda on: "1" if on else "0",
         file_key="snapshot_in_peers", config_flag=True, magic_flag="--snapshot-in-peers"),
    _Opt("check_collectives", bool, "before each collective, the ranks compare its operation, "
         "dtypes and shapes (one small all_gather): a mismatch raises "
         "DistributedOperationException on each rank's own line, with what every rank passed, "
         "instead of hanging (default false: it costs a collective per collective)",
         default=False, env=CHECK_COLLECTIVES_ENV, to_workers=lambda on: "1" if on else "0",
         file_key="check_collectives", config_flag=True, magic_flag="--check-collectives",
         switch=True, cli_flag="--check-collectives", cli_launch_only=True),
    _Opt("heal", bool, "%%accelerate start only: when a pool rank dies, replace that rank alone "
         "and copy it what the other ranks hold alike (default); --no-heal replaces every rank",
         default=True, pool_only=True, env="NOTEBOOK_ACCEL_HEAL", file_key="heal",
         config_flag=True, magic_flag="--heal", switch=True),
    _Opt("detach", bool, "%%accelerate start only: the pool's workers belong to a keeper process "
         "of ours, not to the kernel: they outlive it, and any kernel of this user attaches "
         "(%accelerate attach NAME, WorkerPool.attach(NAME))", default=False, pool_only=True,
         magic_flag="--detach", switch=True),
    _Opt("name", str, "%accelerate start --detach only: the detached pool's name, what a kernel "
         "attaches by (letters, digits, '_.-'; default 'pool')", metavar="NAME", pool_only=True,
         valid_text="a name of letters, digits, '_', '.' or '-'", magic_flag="--name"),
    _Opt("idle_timeout", float, "%accelerate start --detach only: a detached pool with no run and "
         "no kernel attached ends itself after this long (default 12 h), saying why in its log",
         metavar="SECONDS", positive=True, default=12 * 3600.0, pool_only=True,
         env="NOTEBOOK_ACCEL_IDLE_TIMEOUT", file_key="idle_timeout", config_flag=True,
         magic_flag="--idle-timeout"),
)
OPTIONS: dict[str, LaunchOption] = {option.name: option for option in _OPTIONS}
_TRUTH = {"true": True, "1": True, "yes": True, "on": True,
          "false": False, "0": False, "no": False, "off": False}


def _truth(value: Any, name: str) -> bool:
    """A switch's value: a bool, 0 or 1, or its words in an environment variable (``"false"``)."""
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUTH:
        return _TRUTH[value.strip().lower()]
    raise _BadValue(must_be(name, value, "true or false"))
# Views of the table as it was imported (the kernel's code reads OPTIONS itself, so that a row
# added at run time, as tests do, is seen everywhere).
ENV_OPTIONS = {o.name: o.env for o in _OPTIONS if o.env}  # option -> NOTEBOOK_ACCEL_* variable


def layered() -> tuple[LaunchOption, ...]:
    """The options an environment variable or the config file can set, below an argument."""
    return tuple(o for o in OPTIONS.values() if o.argument and (o.env or o.file_key))


def config_flag(option: LaunchOption) -> str | None:
    """``notebook-accel config``'s flag for ``option`` (``--file-key``), or None."""
    return "--" + option.file_key.replace("_", "-") if option.config_flag and option.file_key else None
