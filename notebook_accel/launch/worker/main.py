"""The worker side: set up the process, run the user's function, report back.

Runs first thing in every worker, whatever the start method. Output goes to the
pipes the kernel reads (file descriptors 1 and 2, so C-level output is caught);
the outcome and rank 0's displays go over a private control pipe, as messages of
the wire protocol (:mod:`notebook_accel.wire`); a watchdog thread ends the worker
(and everything it started) when the kernel goes away, and the OS kills it when
the process that started it dies (``PR_SET_PDEATHSIG``: also a worker whose threads
cannot run any more, e.g. one stuck holding the GIL in torch's gloo teardown).

A warm pool's worker starts at :func:`.serve.serve_main` instead: the same set-up, then
it serves runs until the kernel closes its commands channel.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import fcntl
import functools
import io
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from notebook_accel import events, wire
from notebook_accel.checkpoint import snapshot_writer
from notebook_accel.contract import CHECK_COLLECTIVES_ENV
from notebook_accel.flags import env_flag
from notebook_accel.launch.handoff.environment import DEVICE_TYPE, LOCAL_RANK
from notebook_accel.launch.handoff.payload import Payload, dumps_result, load_payload
from notebook_accel.launch.worker import display as worker_display
from notebook_accel.launch.worker import flight_recorder
from notebook_accel.wire import FailureRecord, Kind, Message, Result

_SECONDARY = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"communicator was aborted|Socket Timeout|pair closure|failed to recv|"
    r"Connection refused|ProcessGroup.*(?:aborted|shut ?down)",
    re.IGNORECASE,
)


@dataclass
class WorkerSpec:
    """What one worker needs to know about itself (plain data, pickled by multiprocessing)."""

    rank: int
    env: dict[str, str]
    num_threads: int | None
    send_result: bool
    close_fds: tuple[int, ...] = field(default_factory=tuple)
    rich_output: bool = False  # the launching kernel shows rank 0's displays in the cell
    parent_pid: int | None = None  # the process that starts this worker (the kernel, a forkserver)


@dataclass
class WorkerPipes:
    """The worker's ends of its pipes to the kernel."""

    stdout: Connection
    stderr: Connection
    control: Connection
    events: Connection
    alive: Connection
    commands: Connection | None = None  # a pool worker's runs, from the kernel


_PIPE_BYTES = 1 << 20


def enlarge_pipe(fd: int) -> None:
    """Give a channel's pipe 1 MiB of buffer where the OS allows: events meet fewer full-pipe
    moments, and a run's payload goes into every rank's commands pipe at once, not one rank's
    read after another."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)


def _set_process_name(rank: int, world_size: str) -> None:
    """``ps`` shows ``notebook_accel rank 0 of 2`` (a forked worker would look like the
    kernel); the short name (``nbaccel-r0``: top, psutil) stays distinct too."""
    try:
        import setproctitle

        setproctitle.setproctitle(f"notebook_accel rank {rank} of {world_size}")
    except ImportError:  # an optional nicety: the short name below still tells workers apart
        pass
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, f"nbaccel-r{rank}".encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _watch_kernel(alive_fd: int) -> None:
    """End this worker's whole process group once the kernel's end of the pipe closes."""

    def watch() -> None:
        while True:
            try:
                if not os.read(alive_fd, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="notebook-accel-watchdog", daemon=True).start()


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int | None) -> None:
    """Have the OS kill this worker when its parent dies (Linux), even if no thread of ours
    can run then; if the parent is already gone (the race before the call), exit now."""
    if parent_pid is None or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def report_memory(device_type: str, index: int, every: float = 1.0) -> None:
    """Send the memory figure of this worker's device (``device_type``, local ``index``) to the
    kernel's status display, once a second, as the device kind (``runtime.device``) gives it:
    nothing until torch is imported and the kind has a figure (CUDA's once it is initialised);
    on a kind that keeps none (CPU) the reporter ends at once."""

    def report() -> None:
        time.sleep(every)  # off the start's path
        while "torch" not in sys.modules:
            time.sleep(every)
        import torch  # waits for the main thread's import of torch to finish

        from notebook_accel.runtime.device import device_kind

        kind, device = device_kind(device_type), torch.device(device_type, index)
        while kind.keeps_memory_figure(device):
            reserved = kind.memory_reserved(device)
            if reserved is not None:
                events.emit(Kind.MEMORY, {"gpu": reserved}, key="gpu")
            time.sleep(every)

    threading.Thread(target=report, name="notebook-accel-device-memory", daemon=True).start()


def _redirect_output(stdout_fd: int, stderr_fd: int) -> None:
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    def text_stream(fd: int) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace",
                                line_buffering=True)

    sys.stdout = sys.__stdout__ = text_stream(1)
    sys.stderr = sys.__stderr__ = text_stream(2)
    sys.stdin = sys.__stdin__ = open(os.devnull)  # noqa: SIM115 - lives as long as the worker


def _reset_signals() -> None:
    """Default handlers: the kernel's (or a leaked library's) must not leak into workers."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    flight_recorder.answer_on_signal()  # SIGUSR1: the last collectives, then (chained) the stacks
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=True)


def setup(spec: WorkerSpec, pipes: WorkerPipes) -> None:
    """Make this process a worker: its session, output, watchdogs, signals, environment."""
    _die_with_parent(spec.parent_pid)
    try:
        os.setsid()  # our own session: the kernel's process-group SIGINT does not reach us
    except OSError:
        pass
    for fd in spec.close_fds:  # fork only: the kernel's ends of other pipes
        with contextlib.suppress(OSError):
            os.close(fd)
    _redirect_output(pipes.stdout.fileno(), pipes.stderr.fileno())
    _watch_kernel(pipes.alive.fileno())
    events.install(pipes.events.fileno())
    worker_display.install(lambda display: send(pipes, display),
                           main=spec.rank == 0, rich=spec.rich_output)
    if DEVICE_TYPE in spec.env:
        report_memory(spec.env[DEVICE_TYPE], int(spec.env[LOCAL_RANK]))
    _set_process_name(spec.rank, spec.env.get("WORLD_SIZE", "?"))
    _reset_signals()
    os.environ.update(spec.env)
    os.environ.update(flight_recorder.switch_on())  # before any process group is made
    if env_flag(CHECK_COLLECTIVES_ENV):
        from notebook_accel.runtime import collective_check

        collective_check.install()
    if not os.environ.get("PYTHONBREAKPOINT"):
        sys.breakpointhook = _no_prompt  # a pool worker's serve() installs its prompt instead
    if spec.num_threads:
        import torch

        torch.set_num_threads(spec.num_threads)


def _no_prompt(*args: Any, **kwargs: Any) -> None:
    from notebook_accel.launch.worker.debugger import no_prompt

    no_prompt()


def _format_exception(exc: BaseException) -> str:
    """The traceback without this module's frames, nor frames that set ``__tracebackhide__``."""
    summary = traceback.TracebackException.from_exception(exc)
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    summary.stack = traceback.StackSummary.from_list([
        entry for entry, frame in zip(summary.stack, frames, strict=True)
        if frame.f_code.co_filename != __file__ and not frame.f_locals.get("__tracebackhide__")
    ])
    return "".join(summary.format())


def failure_record(spec: WorkerSpec, exc: BaseException, exitcode: int,
             headline: str | None = None) -> FailureRecord:
    """This rank's failure record (stamped now); the kernel sets the exit code it sees."""
    message = str(exc)
    return FailureRecord(
        rank=spec.rank, pid=os.getpid(), exitcode=exitcode, exc_type=type(exc).__name__,
        headline=headline or f"{type(exc).__name__}: {message}".rstrip(": "),
        traceback=_format_exception(exc), secondary=bool(_SECONDARY.search(message)),
        timestamp=time.time(),
    )


_send_lock = threading.Lock()  # displays may come from any thread


def send(pipes: WorkerPipes, *messages: Message) -> None:
    """Send messages on the control channel (blocks until the kernel has room)."""
    with _send_lock:
        wire.send(pipes.control.fileno(), *messages)


Bind = Callable[[Any], Any]


def execute(spec: WorkerSpec, payload: Payload,
            bind: Bind | None = None) -> tuple[int, Result | FailureRecord]:
    """Run the payload's function; returns the exit code it earns and the outcome to send.

    Args:
        bind: applied to the loaded function before the call (a pool binds it to its
            namespace).
    """
    try:
        function, args, kwargs = load_payload(payload)
        if bind is not None:
            function = bind(function)
        value = function(*args, **kwargs)
    except SystemExit as exc:
        events.close()
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code != 0:
            return code, failure_record(spec, exc, code, f"called sys.exit({exc.code!r})")
        value = None
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the kernel
        events.close()
        # kept as Python keeps an uncaught error, for a post-mortem (pdb.pm(), %accelerate debug)
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        sys.last_exc = exc
        return 1, failure_record(spec, exc, 1)
    events.close()
    sys.last_type = sys.last_value = sys.last_traceback = sys.last_exc = None  # frees its frames
    try:
        data = dumps_result(value) if spec.send_result else None
    except Exception as exc:
        headline = f"its return value could not be pickled: {type(exc).__name__}: {exc}"
        return 1, failure_record(spec, exc, 1, headline)
    return 0, Result(data)


def _run(spec: WorkerSpec, payload: Payload, pipes: WorkerPipes) -> int:
    code, outcome = execute(spec, payload)
    snapshot_writer.drain()  # the last snapshot is written before os._exit, not cut off
    if type(outcome) is Result:
        flush_output()
    send(pipes, outcome)
    return code


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)  # loaded once: a pool worker flushes after every run


def flush_output() -> None:
    """Flush Python's and C's buffered output, so none is lost at ``os._exit``."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    with contextlib.suppress(OSError, AttributeError):
        _libc().fflush(None)


def worker_main(spec: WorkerSpec, payload: Payload, pipes: WorkerPipes) -> None:
    """Entry point of every worker process; never returns."""
    code = 1
    try:
        setup(spec, pipes)
        code = _run(spec, payload, pipes)
    except BaseException:  # noqa: BLE001 - a broken setup is still reported as output
        traceback.print_exc()
    finally:
        flush_output()
        os._exit(code)
