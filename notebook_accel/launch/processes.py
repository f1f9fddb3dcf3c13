"""Start worker processes with their private pipes, and stop them (with their children)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import types
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from notebook_accel.launch.environment import network_environment, worker_environment
from notebook_accel.launch.events import enlarge_pipe
from notebook_accel.launch.interrupts import interrupt_requested
from notebook_accel.launch.payload import Payload
from notebook_accel.launch.plan import LaunchPlan
from notebook_accel.launch.start_method import get_context
from notebook_accel.launch.views import in_kernel
from notebook_accel.launch.worker import WorkerPipes, WorkerSpec, worker_main
from notebook_accel.wire import FailureRecord, FrameReader


@dataclass
class Worker:
    """The kernel's view of one worker process and its channels (:mod:`notebook_accel.wire`)."""

    rank: int
    process: BaseProcess
    stdout_fd: int
    stderr_fd: int
    control_fd: int  # reliable messages: result, failure, displays
    events_fd: int  # lossy messages: progress, metrics, memory, dropped
    result: bytes | None = None
    returned: bool = False  # it sent its Result
    error: FailureRecord | None = None  # the failure it reported
    exited: bool = False
    exit_time: float | None = None  # time.time() when the kernel saw it exit
    stopped: bool = False  # we stopped it (after another rank failed, a timeout, an interrupt)
    control: FrameReader = field(init=False)
    events: FrameReader = field(init=False)

    def __post_init__(self) -> None:
        self.control = FrameReader(self.control_fd)
        self.events = FrameReader(self.events_fd)

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode


@contextlib.contextmanager
def main_module_hidden(hide: bool):
    """Keep multiprocessing from re-running the caller's ``__main__`` in spawned processes.

    The payload carries everything the function needs (by value), so a script
    without an ``if __name__ == "__main__":`` guard must not be executed again
    in every worker, as plain multiprocessing would.
    """
    if not hide:
        yield
        return
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    return read_fd, write_fd


def start_workers(
    plan: LaunchPlan, payload: Payload, port: int, kernel_only: tuple[int, ...] = ()
) -> tuple[list[Worker], int]:
    """Start one process per local rank; returns the workers and the kernel-alive fd.

    ``kernel_only``: other kernel fds that forked workers must close (the store's socket).

    Worker-side pipe ends are closed in the kernel only after every worker has
    started, so a forked worker never closes an fd number that got reused.
    """
    context = get_context(plan.start.method)
    alive_r, alive_w = _pipe()
    ends = [(_pipe(), _pipe(), _pipe(), _pipe()) for _ in range(plan.num_processes)]
    for triple in ends:
        enlarge_pipe(triple[3][1])
    kernel_fds = [alive_w, *kernel_only] + [pair[0] for triple in ends for pair in triple]
    alive = Connection(alive_r, writable=False)
    worker_side = [alive] + [
        Connection(pair[1], readable=False) for triple in ends for pair in triple
    ]
    threads = plan.threads_per_worker()
    rich = plan.output != "none" and in_kernel()
    workers: list[Worker] = []
    try:
        for local_rank, (out, err, ctl, ev) in enumerate(ends):
            own = {out[1], err[1], ctl[1], ev[1], alive_r}
            every = {fd for triple in ends for pair in triple for fd in pair} | set(kernel_fds)
            close_fds = tuple(sorted(every - own)) if plan.start.method == "fork" else ()
            rank = plan.global_rank(local_rank)
            env = worker_environment(
                rank=rank, local_rank=local_rank, world_size=plan.world_size,
                local_world_size=plan.num_processes, group_rank=plan.node_rank,
                master_addr=plan.master_addr, master_port=port,
                mixed_precision=plan.mixed_precision, device_type=plan.device_type,
            )
            env.update(network_environment(plan))
            env.update(plan.worker_env)
            spec = WorkerSpec(rank=rank, env=env, num_threads=threads,
                              send_result=plan.return_all or local_rank == 0, close_fds=close_fds,
                              rich_output=rich)
            base = 1 + 4 * local_rank
            pipes = WorkerPipes(stdout=worker_side[base], stderr=worker_side[base + 1],
                                control=worker_side[base + 2], events=worker_side[base + 3],
                                alive=alive)
            process = context.Process(target=worker_main, args=(spec, payload, pipes),
                                      name=f"notebook-accel-rank{rank}", daemon=False)
            with main_module_hidden(plan.start.method != "fork"):
                process.start()
            for fd in (out[0], err[0], ctl[0], ev[0]):
                os.set_blocking(fd, False)
            workers.append(Worker(rank=rank, process=process, stdout_fd=out[0], stderr_fd=err[0],
                                  control_fd=ctl[0], events_fd=ev[0]))
    except BaseException:
        _close(alive_w)
        kill_workers(workers)
        close_worker_fds(workers)
        for local_rank in range(len(workers), plan.num_processes):
            for pair in ends[local_rank]:
                _close(pair[0])
        raise
    finally:
        for connection in worker_side:
            connection.close()
    return workers, alive_w


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def signal_worker(worker: Worker, sig: int) -> None:
    """Send ``sig`` to the worker's process group (itself and its children)."""
    pid = worker.process.pid
    if pid is None:
        return
    try:
        os.killpg(pid, sig)  # the worker leads its own session
    except ProcessLookupError:
        try:
            os.kill(pid, sig)  # not yet in its own session
        except ProcessLookupError:
            pass
    except PermissionError:
        pass


STOP_GRACE = 2.0  # seconds between SIGTERM and SIGKILL


def stop_workers(workers: list[Worker], grace: float | None = None, on_wait=None) -> None:
    """SIGTERM the live workers' groups, SIGKILL whatever is left after ``grace`` seconds.

    A (further) press of the stop button while waiting escalates to SIGKILL at once.
    ``on_wait`` is called while waiting (to keep relaying output).
    """
    alive = [w for w in workers if w.process.exitcode is None]
    for worker in alive:
        worker.stopped = True
        signal_worker(worker, signal.SIGTERM)
    deadline = time.monotonic() + (STOP_GRACE if grace is None else grace)
    try:
        while alive and time.monotonic() < deadline and not interrupt_requested():
            wait([w.process.sentinel for w in alive], timeout=0.05)
            if on_wait is not None:
                on_wait()
            alive = [w for w in alive if w.process.exitcode is None]
    finally:
        kill_workers(workers)


def kill_workers(workers: list[Worker]) -> None:
    """SIGKILL every worker's group (stragglers included) and reap the workers."""
    for worker in workers:
        signal_worker(worker, signal.SIGKILL)
    for worker in workers:
        worker.process.join(timeout=5)


def close_worker_fds(workers: list[Worker]) -> None:
    """Close the kernel's ends of the workers' pipes."""
    for worker in workers:
        _close(worker.stdout_fd)
        _close(worker.stderr_fd)
        _close(worker.control_fd)
        _close(worker.events_fd)
