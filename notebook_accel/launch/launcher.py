"""``notebook_launcher``: run a notebook function on N workers and get its result back."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

from notebook_accel.config import load_config
from notebook_accel.config.files import where_in_file
from notebook_accel.contract import OPTIONS
from notebook_accel.launch.backends import Backend, backend_class, backend_for
from notebook_accel.launch.control.interrupts import check_interrupt, deferred_interrupts
from notebook_accel.launch.handoff.payload import Payload, serialise_payload
from notebook_accel.launch.handoff.shared_tensors import SharedTensors
from notebook_accel.launch.planning.global_check import warn_missing_globals
from notebook_accel.launch.planning.options import fill_options
from notebook_accel.launch.planning.plan import LaunchPlan, make_plan, shm_note
from notebook_accel.launch.planning.rdzv import meeting_point
from notebook_accel.launch.planning.request import LaunchRequest, launcher_signature
from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.launch.supervision.supervisor import Supervisor, WatchSettings
from notebook_accel.launch.supervision.tracebacks import hide_our_frames
from notebook_accel.launch.views import NullView, make_view
from notebook_accel.launch.views.output import OutputRelay
from notebook_accel.launch.views.record import LaunchRecord, remember
from notebook_accel.launch.views.run_output import RunOutput
from notebook_accel.launch.views.text import say, starting_text
from notebook_accel.machine import devices, hardware
from notebook_accel.machine.launch_kinds import device_launch


def notebook_launcher(function: Callable[..., Any], args: tuple | list = (), *positional: Any,
                      kwargs: dict | None = None, **options: Any) -> Any:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` workers started from this kernel.

    Each worker gets the torchrun-standard environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``...) and our settings, so ``Accelerator()`` inside ``function``
    joins the job. Worker output appears live in the cell, prefixed ``[rank N] ``.

    Args:
        function: any callable; functions and classes defined in the notebook
            travel by value (cloudpickle).
        args, kwargs: its arguments; each must be picklable.
        num_processes: workers on this machine; default (None): every device, that is one
            per visible GPU, one per TPU core, or one per CPU core (at most 8) without either.
        mixed_precision: "no" (default), "fp16", "bf16", or "auto": the best this hardware
            supports (bf16 on a TPU, on Ampere-or-newer GPUs and on CPUs with bf16
            instructions; fp16 on older GPUs; else "no"), decided in the kernel and said in
            the launch's first lines; read by ``Accelerator()``.
        use_port: rendezvous port; default: a free one, picked per launch.
        master_addr, node_rank, num_nodes: multi-machine jobs (same call on each node). The
            nodes must meet within 300 s (or ``timeout``, if shorter), else a ``TimeoutError``
            names the node that did not come.
        rdzv_backend, rdzv_endpoint: ``"static"`` (default) or ``"c10d"``, and where the nodes meet
            (``"host:port"``, instead of ``master_addr`` / ``use_port``); both meet at a store
            this kernel hosts (``launch/planning/rdzv.py`` says how c10d differs across machines).
        rdzv_conf, rdzv_id, log_line_prefix_template: the peer's, taken in its positions and
            otherwise unused (one store with no settings; one job; every line is prefixed
            ``[rank N] ``: ``output`` chooses whose lines show).
        max_restarts: relaunch the whole job up to this many times after a failure.
        start_method: "auto" (fork when safe, else a warm forkserver), "fork",
            "forkserver" or "spawn".
        timeout: seconds after which a still-running job is stopped (WorkerError).
        return_all: return every local rank's value (a list in rank order)
            instead of rank 0's.
        output: "all" ranks' output, only the "main" process's, or "none".
        device: "cpu", "cuda" or "xla" (TPU cores through torch_xla's launcher);
            default: CUDA when a GPU is visible, else XLA on a TPU, else the CPU.
        config_file: a YAML launch config (ours or Accelerate's format); default:
            ``$NOTEBOOK_ACCEL_CONFIG_FILE``, else the default config file if any.
        monitor_interval: the peer's polling period (seconds) for failed workers. Ours
            waits on process sentinels and reacts at once, so any positive value
            behaves the same; it is checked, and otherwise unused.
        fsdp: shard models with FSDP2 in ``Accelerator()``: ``True`` (the config file's
            ``fsdp_config``, else the defaults), a ``FullyShardedDataParallelPlugin``, or
            ``False`` (not even when the config file says ``distributed_type: FSDP``);
            default: the config file decides.
        deepspeed: train with DeepSpeed ZeRO in ``Accelerator()``: ``True`` (the config file's
            ``deepspeed_config``, else the defaults) or ``False`` (not even when the config file
            says ``distributed_type: DEEPSPEED``); default: the config file decides. A
            ``DeepSpeedPlugin`` goes to ``Accelerator(deepspeed_plugin=...)`` in the function.
        cluster: run on a Ray cluster (``pip install notebook_accel[ray]``): any address
            ``ray.init`` takes (``"head:6379"``, ``"auto"``, or a Ray Client address
            ``"ray://head:10001"`` from outside the cluster's network). This kernel drives every node:
            ``num_processes`` ranks on each of ``num_nodes`` nodes, numbered node by node.
        dynamo_backend: ``torch.compile`` the models ``prepare`` returns, with this backend
            (``"inductor"``, ``"aot_eager"``, ``"eager"``..., ``"no"``: default); the workers get
            it as ``ACCELERATE_DYNAMO_BACKEND``. The config file's ``dynamo_config`` sets the
            mode, ``fullgraph``, ``dynamic`` and regional compilation.
        hang_after: seconds a rank may show no progress (no output, event or collective)
            before the live view marks it ``no progress`` and every running rank's stack is
            printed once, grouped (default 60; None: never). The job runs on: ``timeout``
            stops it.
        snapshot_every: every ``Accelerator()`` of the job snapshots its training state every N
            optimizer steps (``accelerator.snapshot_every(steps=N)``).
        snapshot_dir: where snapshots go and ``resume()`` looks when no ``dir=`` is given (ahead of
            ``project_dir``): a folder every rank sees, such as ``/content/drive/MyDrive/run7``.

    The options after ``args`` are the rows of the options table (``contract.OPTIONS`` and the
    strategies' in ``strategies/registry.py``): the signature is made from them, the peer's
    thirteen positional in the peer's order, ours keyword-only. Options left as None come from
    ``NOTEBOOK_ACCEL_*`` environment variables, then the config file, then the defaults
    (``mixed_precision="no"``, ``start_method="auto"``, ``master_addr="127.0.0.1"``, one node).

    Returns:
        Rank 0's return value (tensors moved to the CPU), or the list of all
        ranks' values with ``return_all=True``.

    Raises:
        TypeError, ValueError: bad input, before any worker starts.
        WorkerError: a worker failed; names the root-cause rank with its traceback.
        TimeoutError: a multi-node job whose other nodes did not come in time (named).
        KeyboardInterrupt: interrupted; every worker was stopped.

    Example:
        >>> def train(lr):
        ...     from notebook_accel import Accelerator
        ...     accelerator = Accelerator()
        ...     return accelerator.process_index
        >>> notebook_launcher(train, (0.1,), num_processes=2)  # doctest: +SKIP
        0
    """
    with deferred_interrupts():  # nothing imported on the way may be cut half-way
        try:
            return _launch(*LaunchRequest.from_call(function, args, *positional, kwargs=kwargs,
                                                    **options))
        except (TypeError, ValueError) as error:  # bad input: IPython shows no frame of ours
            hide_our_frames(error)
            raise


notebook_launcher.__signature__ = launcher_signature()  # the options' table, as parameters


def launch_request(function: Callable[..., Any], request: LaunchRequest, args: tuple | list = (),
                   kwargs: dict | None = None) -> Any:
    """:func:`notebook_launcher` for a front door that built its own ``request`` (the
    ``%%accelerate`` magic's flags, the ``notebook-accel`` command's): its values are not
    checked again, and an error about one of them (``bf16`` on these GPUs) names where it came
    from (``flag --mixed-precision: ...``), before any worker starts.

    Raises:
        TypeError: an option ``notebook_launcher`` does not take; else as :func:`notebook_launcher`.
    """
    with deferred_interrupts():
        try:
            return _launch(function, args, kwargs, request.for_door("notebook_launcher"))
        except (TypeError, ValueError) as error:
            hide_our_frames(error)
            raise


def _launch(function: Callable[..., Any], args: Any, kwargs: Any, request: LaunchRequest) -> Any:
    if not callable(function):
        raise TypeError(f"function={function!r} is not callable; pass the function to run")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list, not {type(args).__name__}: {args!r}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict or None, not {type(kwargs).__name__}")
    master_addr, use_port = meeting_point(request.get("rdzv_endpoint", ""),
                                          request.get("master_addr"), request.get("use_port"))
    notes: list[str] = []
    plan = plan_launch(request.replaced(master_addr=master_addr, use_port=use_port), notes)
    local = backend_class(plan).local
    inherit = (local and plan.start.method == "fork"  # queues, locks
               and not device_launch(plan.device_type).host_worker)
    with SharedTensors() as shared:  # big tensors: one shared copy, not one per worker (locally)
        payload = serialise_payload(function, tuple(args), dict(kwargs or {}), inherit=inherit,
                                    shared=shared if local else None)
        warn_missing_globals(function)
        print_notes(plan, notes)
        backend = backend_for(plan)
        backend.check(plan)
        for attempt in range(plan.max_restarts + 1):
            try:
                return launch_once(backend, plan, payload)
            except WorkerError as error:
                if attempt == plan.max_restarts:
                    raise
                print(f"[notebook_accel] {error.args[0]}; restarting "
                      f"({attempt + 1}/{plan.max_restarts})", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")  # pragma: no cover


def plan_launch(request: LaunchRequest, notes: list[str],
                filled: dict[str, Any] | None = None) -> LaunchPlan:
    """The plan of a launch (or a pool): the ``request``'s options (checked where they
    entered) filled from the environment and the config file (checked there), then judged
    together and against this machine's hardware; ``notes`` gets a warning when ``/dev/shm`` is
    too small for the job.

    Args:
        filled: the request's options already filled (:func:`~notebook_accel.launch.planning.options.
            fill_options` with ``notes``), by a caller that needed them first (``WorkerPool``).
    Raises:
        TypeError, ValueError: a bad option, named with its valid values and where it came
            from; what the GPUs cannot run (see :func:`~notebook_accel.launch.planning.plan.make_plan`).
    """
    config_file = request.get("config_file")
    options = fill_options(request, config_file, notes) if filled is None else filled
    output = options["output"]
    sources = {}  # bf16 may be refused on these GPUs: the error says where it was asked
    if options["mixed_precision"] == "bf16":
        where = option_source("mixed_precision", request, config_file)
        sources = {"mixed_precision": where} if where else {}
    plan = make_plan(**options, sources=sources,
                     starting=lambda count, start: announce_start(count, start.method, output))
    if options["mixed_precision"] == "auto":
        notes.append(f"mixed precision auto: {plan.mixed_precision} "
                     f"({devices.precision_why(plan.device_type, hardware.detect())})")
    note = shm_note(plan) if backend_class(plan).local else None
    if note is not None:
        notes.append(note)
    return plan


def option_source(option: str, request: LaunchRequest,
                  config_file: str | os.PathLike | None) -> str | None:
    """Where a filled option's value came from, to start an error about it (as
    :meth:`~notebook_accel.contract.LaunchOption.check`): None for an argument,
    ``flag --x``, ``environment variable NOTEBOOK_ACCEL_...``, or ``FILE, line N``."""
    if option in request:
        return request.source(option)
    var = OPTIONS[option].env
    if var and os.environ.get(var, "").strip():
        return f"environment variable {var}"
    key = OPTIONS[option].file_key
    config = load_config(config_file)
    if key and config.source is not None and getattr(config, key, None) is not None:
        return where_in_file(config.source, key)
    return None


def announce_start(count: int, method: str, output: str) -> None:
    """Say ``starting 2 workers (fork)...`` (on stdout, as the text view) when the start will take
    seconds that would otherwise pass in silence; a quick start, or ``output="none"``, says nothing.

    Slow starts: spawn (every worker imports torch); a forkserver not started yet (it imports
    torch first); fork before this process has imported what forked workers inherit
    (``launch/worker/warm.py``: torch and its lazy imports). ``make_plan`` calls this before it detects
    the hardware (which imports torch) whenever the count is known without it.
    """
    if output == "none":
        return
    if method == "forkserver":
        from multiprocessing import forkserver

        slow = getattr(forkserver._forkserver, "_forkserver_pid", None) is None
    else:
        slow = method == "spawn" or "notebook_accel.launch.worker.warm" not in sys.modules
    if slow:
        say(starting_text(count, method))


def print_notes(plan: LaunchPlan, notes: list[str]) -> None:
    """The launch's first lines: what decided its settings."""
    if plan.start.reason and backend_class(plan).local:
        notes.append(f"start method: {plan.start.method} ({plan.start.reason})")
    for note in notes:
        print(f"[notebook_accel] {note}", flush=True)


def launch_once(backend: Backend, plan: LaunchPlan, payload: Payload, remembered: bool = True,
                into: RunOutput | None = None) -> Any:
    """Start the workers through ``backend``, supervise them, collect their values
    (``remembered=False``: a run of ours, not the user's, which ``last_launch()`` keeps showing;
    ``into``: a background run's, whose output is kept there, with no live view, not shown)."""
    check_interrupt("launch interrupted before any worker started")
    group = backend.start(plan, payload)
    subset = group.collectives_before is not None  # the user chose the ranks: show theirs
    kept = {} if into is None else {"stdout": into.stdout, "stderr": into.stderr,
                                    "publish": into.display}
    relay = OutputRelay(show="all" if subset and plan.output == "main" else plan.output, **kept)
    try:
        ran = group.plan  # what the workers run (XLA: its one host worker)
        record = LaunchRecord(
            world_size=ran.world_size, num_processes=ran.num_processes,
            device_type=ran.device_type, start_method=ran.start.method,
            mixed_precision=ran.mixed_precision,
            warm_pool=any(handle.persistent for handle in group.handles),  # a pool's workers
        )
        if remembered:
            remember(record)
        if into is not None:
            into.record = record
        view = make_view(record, plan.output) if into is None else NullView()
        settings = WatchSettings.of(plan, group.collectives_before)
        workers = Supervisor(group.handles, relay, record, view, settings, group.keeper).run()
        results = []
        for worker in workers:
            if worker.result is None:
                results.append(None)
                continue
            try:
                results.append(pickle.loads(worker.result))
            except Exception as exc:
                raise WorkerError(
                    f"rank {worker.rank} returned a value the kernel cannot load: "
                    f"{type(exc).__name__}: {exc}", rank=worker.rank, exitcode=0,
                ) from None
    finally:
        group.close()
    return group.result(results)
