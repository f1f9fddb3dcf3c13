"""The local-processes backend: one child process per rank (fork, forkserver or spawn).

Each worker gets private pipes for its four channels, leads its own session (so
stopping it stops its children) and watches a kernel-alive pipe (so it ends when
the kernel does; the OS also kills it when the process that started it dies). On
rank 0's node the kernel hosts the rendezvous store.

:func:`start_workers` also starts a warm pool's workers (``serve=True``): each then
reads runs from a fifth pipe, its commands channel (see ``launch/pools/pool.py``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import signal
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import psutil

from notebook_accel.launch.backends.base import Backend, WorkerGroup, WorkerHandle, kill_all
from notebook_accel.launch.cluster.node_join import announce, await_nodes
from notebook_accel.launch.handoff.environment import network_environment, worker_environment
from notebook_accel.launch.handoff.payload import Payload
from notebook_accel.launch.planning.fd_limit import ensure_fd_room
from notebook_accel.launch.planning.plan import LaunchPlan
from notebook_accel.launch.planning.rendezvous import Rendezvous
from notebook_accel.launch.planning.start_method import get_context, starter_pid
from notebook_accel.launch.views import in_kernel
from notebook_accel.launch.worker.main import WorkerPipes, WorkerSpec, enlarge_pipe, worker_main
from notebook_accel.launch.worker.main_module import main_module_hidden
from notebook_accel.launch.worker.serve import serve_main

_long_lived_fds: set[int] = set()  # kernel fds of warm pools, closed in every forked worker


def keep_out_of_forks(fds: list[int] | tuple[int, ...], keep_out: bool = True) -> None:
    """Have every worker forked from now on close ``fds`` (``keep_out=False``: no longer):
    a pool's pipe ends must not live on in another launch's workers."""
    if keep_out:
        _long_lived_fds.update(fds)
    else:
        _long_lived_fds.difference_update(fds)


class ProcessHandle(WorkerHandle):
    """A worker that is a child process of this kernel."""

    def __init__(self, rank: int, process: BaseProcess, stdout_fd: int, stderr_fd: int,
                 control_fd: int, events_fd: int, commands_fd: int | None = None) -> None:
        self.rank = rank
        self.process = process
        self.stdout_fd, self.stderr_fd = stdout_fd, stderr_fd
        self.control_fd, self.events_fd = control_fd, events_fd
        self.commands_fd = commands_fd  # a pool worker's runs (the kernel's write end)
        self.persistent = commands_fd is not None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def sentinel(self) -> int:
        return self.process.sentinel

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group (itself and its children)."""
        pid = self.process.pid
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

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def interrupt(self) -> None:
        if self.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGINT)  # the worker only: not its children

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def dump_stacks(self) -> None:
        try:
            os.kill(self.process.pid, signal.SIGUSR1)  # faulthandler dumps every thread's stack
        except ProcessLookupError:
            pass

    def reap(self, timeout: float) -> None:
        self.process.join(timeout=timeout)

    def rss(self) -> int | None:
        with contextlib.suppress(psutil.Error, TypeError):
            return self._measured.memory_info().rss
        return None

    @functools.cached_property
    def _measured(self) -> psutil.Process:
        """The process as psutil sees it, made once (a watch loop samples a few ranks a wakeup)."""
        return psutil.Process(self.process.pid)

    def kernel_fds(self) -> list[int]:
        """The kernel's ends of the worker's pipes."""
        fds = [self.stdout_fd, self.stderr_fd, self.control_fd, self.events_fd]
        return fds if self.commands_fd is None else [*fds, self.commands_fd]

    def close(self) -> None:
        """Close the kernel's ends of the worker's pipes."""
        for fd in self.kernel_fds():
            _close(fd)


class ProcessGroup(WorkerGroup):
    """Child processes of one call; closing it kills stragglers and releases every kernel fd."""

    def __init__(self, plan: LaunchPlan, handles: list[ProcessHandle], alive_fd: int,
                 rendezvous: Rendezvous | None) -> None:
        super().__init__(plan, handles)
        self.alive_fd = alive_fd
        self.rendezvous = rendezvous

    def close(self) -> None:
        kill_all(self.handles)
        for handle in self.handles:
            handle.close()
        os.close(self.alive_fd)
        if self.rendezvous is not None:
            self.rendezvous.close()


class ProcessBackend(Backend):
    """Workers as child processes of this kernel, started as ``plan.start.method`` says."""

    name = "processes"

    def start(self, plan: LaunchPlan, payload: Payload) -> ProcessGroup:
        rendezvous = Rendezvous(plan.master_addr, plan.port or 0) if plan.hosts_rendezvous else None
        try:
            if rendezvous is not None and plan.num_nodes > 1:
                await_nodes(rendezvous.store, plan)
            elif rendezvous is None:
                announce(plan)
            port = rendezvous.port if rendezvous is not None else plan.port
            kernel_only = (rendezvous.fd,) if rendezvous is not None else ()
            handles, alive_fd = start_workers(plan, payload, port, kernel_only)
        except BaseException:
            if rendezvous is not None:
                rendezvous.close()
            raise
        return ProcessGroup(plan, handles, alive_fd, rendezvous)


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    return read_fd, write_fd


def start_workers(
    plan: LaunchPlan, payload: Payload | None, port: int, kernel_only: tuple[int, ...] = (),
    serve: bool = False, local_ranks: tuple[int, ...] | None = None,
) -> tuple[list[ProcessHandle], int]:
    """Start one process per local rank; returns the workers and the kernel-alive fd.

    ``kernel_only``: other kernel fds that forked workers must close (the store's socket).
    ``serve``: warm pool workers, which take runs from a commands pipe (``payload`` unused).
    ``local_ranks``: these local ranks only (a pool's heal replaces its dead ones); default all.

    Worker-side pipe ends are closed in the kernel only after every worker has
    started, so a forked worker never closes an fd number that got reused.
    """
    if plan.start.method == "fork":
        # Forked workers inherit what the kernel imported: pay torch's lazy imports
        # (torch._dynamo, which the first optimizer or DDP model imports: ~2 s) once here, not
        # in every launch, nor in a pool's first cell or the rank a heal starts.
        importlib.import_module("notebook_accel.launch.worker.warm")
    context = get_context(plan.start.method)
    ensure_fd_room(plan.num_processes)
    chosen = tuple(range(plan.num_processes)) if local_ranks is None else local_ranks
    alive_r, alive_w = _pipe()
    ends = [(_pipe(), _pipe(), _pipe(), _pipe()) for _ in chosen]
    for triple in ends:
        enlarge_pipe(triple[3][1])
    commands = [_pipe() for _ in ends] if serve else []  # (worker's read end, kernel's write end)
    for _, write_end in commands:
        enlarge_pipe(write_end)
    kernel_fds = [alive_w, *kernel_only, *_long_lived_fds] + [
        pair[0] for triple in ends for pair in triple] + [w for _, w in commands]
    alive = Connection(alive_r, writable=False)
    worker_side = [alive] + [
        Connection(pair[1], readable=False) for triple in ends for pair in triple
    ] + [Connection(r, writable=False) for r, _ in commands]
    threads = plan.threads_per_worker()
    rich = plan.output != "none" and in_kernel()
    parent = starter_pid(plan.start.method)
    workers: list[ProcessHandle] = []
    try:
        for index, (local_rank, (out, err, ctl, ev)) in enumerate(zip(chosen, ends, strict=True)):
            own = {out[1], err[1], ctl[1], ev[1], alive_r}
            if serve:
                own.add(commands[index][0])
            every = ({fd for triple in ends for pair in triple for fd in pair} | set(kernel_fds)
                     | {fd for pair in commands for fd in pair})
            close_fds = tuple(sorted(every - own)) if plan.start.method == "fork" else ()
            rank = plan.global_rank(local_rank)
            env = worker_environment(
                rank=rank, local_rank=local_rank, world_size=plan.world_size,
                local_world_size=plan.num_processes, group_rank=plan.node_rank,
                master_addr=plan.master_addr, master_port=port,
                mixed_precision=plan.mixed_precision, device_type=plan.device_type,
            )
            env.update(network_environment(plan))
            if threads and plan.num_processes > 1:  # as torchrun: unless the user set it
                env["OMP_NUM_THREADS"] = str(threads)
            env.update(plan.worker_env)
            spec = WorkerSpec(rank=rank, env=env, num_threads=threads,
                              send_result=plan.return_all or local_rank == 0, close_fds=close_fds,
                              rich_output=rich, parent_pid=parent)
            base = 1 + 4 * index
            pipes = WorkerPipes(stdout=worker_side[base], stderr=worker_side[base + 1],
                                control=worker_side[base + 2], events=worker_side[base + 3],
                                alive=alive,
                                commands=worker_side[1 + 4 * len(ends) + index] if serve else None)
            process = context.Process(target=serve_main if serve else worker_main,
                                      args=(spec, payload, pipes),
                                      name=f"notebook-accel-rank{rank}", daemon=False)
            with main_module_hidden(plan.start.method != "fork"):
                process.start()
            for fd in (out[0], err[0], ctl[0], ev[0]):
                os.set_blocking(fd, False)
            workers.append(ProcessHandle(rank, process, stdout_fd=out[0], stderr_fd=err[0],
                                         control_fd=ctl[0], events_fd=ev[0],
                                         commands_fd=commands[index][1] if serve else None))
    except BaseException:
        _close(alive_w)
        kill_all(workers)
        for handle in workers:
            handle.close()
        for index in range(len(workers), len(ends)):
            for pair in ends[index]:
                _close(pair[0])
            if serve:
                _close(commands[index][1])
        raise
    finally:
        for connection in worker_side:
            connection.close()
    return workers, alive_w


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
