"""The warm-pool backend: workers started once, which run call after call.

:class:`PoolWorkers` are local processes (started as the process backend starts its
own, with a commands pipe each) around a rendezvous store of their own; on a cluster
(``plan.cluster``) the node hubs of ``backends/cluster.py`` fork them instead (a run's payload
then goes once per node). For each
run, :class:`PoolBackend` sends every rank a :class:`~notebook_accel.wire.Run` and
hands the supervisor the same handles (``persistent``: a run ends with the rank's
``RunDone``, not its exit); closing the run gives them back to the pool.
"""

from __future__ import annotations

import contextlib
import os
import time
from multiprocessing.connection import wait

from notebook_accel import wire
from notebook_accel.launch.backends import backend_class
from notebook_accel.launch.backends.base import (
    Backend,
    ChannelKeeper,
    PoolWorkerSet,
    WorkerGroup,
    kill_all,
)
from notebook_accel.launch.backends.processes import (
    ProcessHandle,
    keep_out_of_forks,
    start_workers,
)
from notebook_accel.launch.handoff.cells import SentCells
from notebook_accel.launch.handoff.payload import InheritedPayload, Payload
from notebook_accel.launch.planning.plan import LaunchPlan
from notebook_accel.launch.planning.rendezvous import Rendezvous
from notebook_accel.wire import Run

_CLOSE_GRACE = 2.0  # seconds workers have to leave once their commands pipe is closed


class PoolWorkers(PoolWorkerSet):
    """One set of warm workers: their handles, the kernel-alive pipe, the rendezvous store."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.rendezvous = Rendezvous(plan.master_addr, plan.port or 0)
        try:
            self.handles, self.alive_fd = start_workers(
                plan, None, self.rendezvous.port, (self.rendezvous.fd,), serve=True)
        except BaseException:
            self.rendezvous.close()
            raise
        self.cells_sent = SentCells()  # what the workers have of the notebook's cells
        self._alive_fds = [self.alive_fd]  # one per start: the first, then each heal's
        self._kept_out = [self.alive_fd, self.rendezvous.fd,
                          *(fd for handle in self.handles for fd in handle.kernel_fds())]
        keep_out_of_forks(self._kept_out)
        self.keeper = ChannelKeeper()  # a run on every rank: the channels stay registered
        self.closed = False

    def replace(self, ranks: tuple[int, ...]) -> int:
        """Start new workers in place of the dead ones of ``ranks`` (same rank numbers, device
        and environment), around a fresh rendezvous store that every rank meets at next (a
        heal: ``launch/pools/heal.py``); returns the store's port."""
        rendezvous = Rendezvous(self.plan.master_addr, 0)
        local = {self.plan.global_rank(i): i for i in range(self.plan.num_processes)}
        try:
            fresh, alive_fd = start_workers(self.plan, None, rendezvous.port, (rendezvous.fd,),
                                            serve=True, local_ranks=tuple(local[r] for r in ranks))
        except BaseException:
            rendezvous.close()
            raise
        old = [h for h in self.handles if h.rank in ranks]
        released = [fd for h in old for fd in h.kernel_fds()] + [self.rendezvous.fd]
        keep_out_of_forks(released, keep_out=False)
        for handle in old:
            handle.close()
        self.rendezvous.close()
        self.rendezvous = rendezvous
        by_rank = {h.rank: h for h in fresh}
        self.handles = [by_rank.get(h.rank, h) for h in self.handles]
        self._alive_fds.append(alive_fd)
        added = [alive_fd, rendezvous.fd, *(fd for h in fresh for fd in h.kernel_fds())]
        self._kept_out = [fd for fd in self._kept_out if fd not in released] + added
        keep_out_of_forks(added)
        return rendezvous.port

    def send_runs(self, payload: bytes, with_result: set[int], ranks: set[int]) -> None:
        """Start a run on the workers of ``ranks`` (``with_result``: the ranks that send their
        value); the others keep their last report (the group's counts still compare)."""
        runs = {}  # a Run encoded once per kind (with a result, without): not per rank
        for handle in self.handles:
            if handle.rank not in ranks:
                continue
            handle.last_report = None
            returns = handle.rank in with_result
            if returns not in runs:
                runs[returns] = wire.encode(Run(payload, returns))
            with contextlib.suppress(BrokenPipeError):  # died just now: the supervisor reports it
                wire.send_encoded(handle.commands_fd, runs[returns])

    def dead(self) -> list[ProcessHandle]:
        """The workers that have ended."""
        return [handle for handle in self.handles if handle.exitcode is not None]

    def close(self, grace: float = _CLOSE_GRACE) -> None:
        """End every worker (they leave when their commands pipe closes; killed after
        ``grace`` seconds) and release everything of the set. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.keeper.close()
        for handle in self.handles:
            with contextlib.suppress(OSError):
                os.close(handle.commands_fd)
        deadline = time.monotonic() + grace
        alive = [h for h in self.handles if h.exitcode is None]
        while alive and time.monotonic() < deadline:
            wait([h.sentinel for h in alive], timeout=deadline - time.monotonic())
            alive = [h for h in alive if h.exitcode is None]
        kill_all(self.handles)
        keep_out_of_forks(self._kept_out, keep_out=False)
        for handle in self.handles:
            handle.commands_fd = None  # closed above
            handle.close()
        for fd in self._alive_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.rendezvous.close()


def pool_workers(plan: LaunchPlan) -> PoolWorkerSet:
    """A pool's workers: local processes, or, where the plan's backend is not local (a
    cluster), forked by its nodes' hubs."""
    if not backend_class(plan).local:
        from notebook_accel.launch.backends.cluster import ClusterPoolWorkers

        return ClusterPoolWorkers(plan)
    return PoolWorkers(plan)


class PoolRun(WorkerGroup):
    """One run on the pool; closing it leaves the workers up, idle, for the next run."""

    def close(self) -> None:
        return None


class PoolBackend(Backend):
    """Runs each call on the same warm workers."""

    name = "pool"

    def __init__(self, workers: PoolWorkers, ranks: tuple[int, ...] | None = None) -> None:
        self.workers = workers
        self.ranks = ranks  # a run on these ranks only (None: every rank)

    def start(self, plan: LaunchPlan, payload: Payload) -> PoolRun:
        if isinstance(payload, InheritedPayload):  # pragma: no cover - the pool never asks for it
            raise TypeError("a warm pool's workers cannot inherit objects; send picklable values")
        handles = [h for h in self.workers.handles if self.ranks is None or h.rank in self.ranks]
        before = {h.rank: h.last_report.collectives if h.last_report else None for h in handles}
        with_result = {h.rank for i, h in enumerate(handles) if plan.return_all or i == 0}
        self.workers.send_runs(payload, with_result, {h.rank for h in handles})
        run = PoolRun(plan, handles)
        if self.ranks is not None:
            run.collectives_before = before
        else:  # (a run on some ranks registers theirs for that run only)
            run.keeper = self.workers.keeper
        return run
