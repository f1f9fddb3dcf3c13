"""``Accelerator.snapshot_every``: when a snapshot falls due, the copy to host memory, and the write
handed to the background (``snapshot_writer``) into a snapshot directory (``snapshot_dir``).

A step is one optimizer step: every prepared optimizer has taken its real step (micro-steps of
gradient accumulation are not steps; ``AcceleratedOptimizer.step_hooks`` count them). A snapshot
is due after every ``steps``-th step, or once ``seconds`` have passed since the last one (rank 0's
clock decides, for every rank: one small broadcast per step). It is taken at the end of that step:
once every prepared scheduler that steps with the optimizer has stepped too (the usual
``optimizer.step(); scheduler.step()``), or at once when there is none. A scheduler that did not step
before the next step (one stepped per epoch) is not waited for again; the snapshot it held back is
left out rather than taken mid-step, and that is said once.

A ``dir`` given as an fsspec URL is written into its local mirror, then uploaded by rank 0's writer
(``snapshot_remote``). Taking it: the save hooks run, then everything ``save_state`` writes (models, optimizers, schedulers,
loaders' positions, registered objects, scaler, counters, RNG) is copied to host memory
(``host_copy``); that copy is all the training waits for. Every rank does it at the same step (no
collective: the ranks count the same steps); each writes its files in the background.
"""

from __future__ import annotations

import os
import secrets
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from notebook_accel.checkpoint import (
    orchestration,
    snapshot_dir,
    snapshot_peers,
    snapshot_remote,
    state_parts,
    training_state,
)
from notebook_accel.checkpoint.copy_memory import MadeAhead, fits, host_copied, spare_of
from notebook_accel.checkpoint.host_copy import nbytes
from notebook_accel.checkpoint.snapshot_identity import identity
from notebook_accel.checkpoint.snapshot_writer import SnapshotWriter
from notebook_accel.checkpoint.training_state import StateFile
from notebook_accel.runtime import ops

RUN_NAME_ENV = "NOTEBOOK_ACCEL_RUN_NAME"
# a schedule's parts that belong to its process: never copied with it (__getstate__)
_OWN_TO_PROCESS = ("writer", "host_copy_s", "_counts", "_waiting", "_not_per_step", "_last", "group", "_spare",
                   "_first_copy")
_schedules: weakref.WeakSet[Snapshots] = weakref.WeakSet()  # this process's (``newest_held``)
# the files written a piece at a time, so that training keeps the cores (``paced_writes``; the
# benchmark turns it off to compare)
PACED_WRITES = True
RANK_WAIT_S = 600.0  # how long rank 0 waits for the other ranks' files before leaving a snapshot out


def default_directory(project_dir: str | os.PathLike[str] | None) -> Path:
    """Where snapshots go without ``dir=``: ``<project_dir>/snapshots``, else ``./snapshots/<run>``
    (``<run>``: ``$NOTEBOOK_ACCEL_RUN_NAME``, else ``default``): the same place for the same cell in a
    new kernel, so ``resume()`` finds them."""
    if project_dir is not None:
        return Path(project_dir).absolute() / "snapshots"
    return Path("snapshots", os.environ.get(RUN_NAME_ENV) or "default").absolute()


class Snapshots:
    """An Accelerator's snapshot schedule (``Accelerator.snapshot_every``; see the module docstring).

    Every rank must create it (it checks that every rank sees ``directory``).

    Raises:
        ValueError: neither ``steps`` nor ``seconds``, a bad value, a strategy whose state is sharded,
            or a directory some rank does not see.
    """

    def __init__(self, accelerator: Any, steps: int | None, seconds: float | None, directory: Path,
                 keep: int, in_peers: bool = False) -> None:
        _check(steps, seconds, keep)
        _check_in_peers(accelerator, in_peers)
        self.accelerator = accelerator
        self.in_peers = in_peers and accelerator.num_processes > 1  # (alone: no peer, no heal)
        self._said_held = False
        self.steps, self.seconds, self.keep = steps, seconds, keep
        self.directory = directory.absolute()
        self.remote = snapshot_remote.remote_of(self.directory)  # a URL this folder mirrors
        if self.remote is not None:
            _one_machine(accelerator.state, self.remote)
        self.token = _shared_directory(accelerator.state, self.directory)
        self.group = _writer_group(accelerator, self.in_peers)
        self.step = 0  # optimizer steps done
        self.writer = SnapshotWriter(accelerator.print)
        self.host_copy_s: list[float] = []  # what each snapshot cost the training path
        # the last written snapshot's host copy, by part name: the next copy overwrites it (``host_copy``'s
        # ``into``) instead of faulting fresh pages in on the training path; set by the writer's job when
        # it is done with it, taken (and cleared) by ``take``
        self._spare: dict[str, Any] | None = None
        # the first snapshot's: memory made ahead by a background thread after the first step (``_blank_ahead``)
        self._first_copy: MadeAhead | None = None
        self._counts: dict[int, int] = {}  # id(optimizer) -> its real steps
        self._pending: int | None = None  # a due step whose snapshot waits for the schedulers
        self._waiting: set[int] = set()
        self._not_per_step: set[int] = set()  # schedulers seen not to step with every optimizer step
        self._said_left_out = False
        self._said_in_place = False
        self._last = time.monotonic()
        self.watch_all()
        _schedules.add(self)

    # ---- copied to another process (a warm pool's heal) ------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The schedule, without what belongs to this process (its writer, the ids it counts
        by, its clock, its timings): equal on every rank at the same step."""
        kept = {k: v for k, v in self.__dict__.items() if k not in _OWN_TO_PROCESS}
        return {**kept, "_pending": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.writer = SnapshotWriter(self.accelerator.print)
        self.group = None  # made for the new group by ``rejoin`` (the heal calls it on every rank)
        self.host_copy_s, self._counts, self._waiting, self._not_per_step = [], {}, set(), set()
        self._last, self._spare, self._first_copy = time.monotonic(), None, None
        _schedules.add(self)

    def leave_old_group(self) -> None:
        """The process group this schedule's writes used is gone (a warm pool's heal): the write in
        flight is left (it may wait for a dead rank's part, or in a collective with it: that snapshot
        stays incomplete, its ``.tmp`` folder cleared when snapshots are next switched on), the next
        one does not wait for it, and there is no writer group until ``rejoin``."""
        self.writer.abandon()
        self.writer = SnapshotWriter(self.accelerator.print)
        self.group = None

    def rejoin(self) -> None:
        """Make the writer group anew in the new process group (a heal; every rank, in the same
        order: creating a group is a collective)."""
        self.group = _writer_group(self.accelerator, self.in_peers)

    def watch_all(self) -> None:
        """Count the steps of the Accelerator's prepared optimizers and schedulers (the hooks are
        each process's own: a copied schedule calls this in its new process)."""
        for optimizer in self.accelerator._optimizers:
            self.watch_optimizer(optimizer)
        for scheduler in self.accelerator._schedulers:
            self.watch_scheduler(scheduler)

    def describe(self) -> str:
        every = " or ".join(x for x in (self.steps and f"{self.steps:,} steps",
                                        self.seconds and f"{self.seconds:g} s") if x)
        peers = ("; each also kept in the peers' memory for a heal: every rank holds its own part and its "
                 "neighbour's, about twice its host copy (the first snapshot says the bytes)" if self.in_peers else "")
        return f"snapshots every {every} in {self.directory}, keeping {self.keep}{peers}"

    # ---- counting steps -----------------------------------------------------------------
    def watch_optimizer(self, optimizer: Any) -> None:
        """Count ``optimizer``'s real steps (a prepared one)."""
        if self._optimizer_stepped not in optimizer.step_hooks:
            optimizer.step_hooks.append(self._optimizer_stepped)

    def watch_scheduler(self, scheduler: Any) -> None:
        """Wait for ``scheduler``'s step before a due snapshot is taken (a prepared one)."""
        if self._scheduler_stepped not in scheduler.step_hooks:
            scheduler.step_hooks.append(self._scheduler_stepped)

    def restart_at(self, step: int) -> None:
        """Go on counting from ``step`` (``resume``)."""
        self.step = step
        self._counts = {id(opt): step for opt in self.accelerator._optimizers}
        self._pending, self._last = None, time.monotonic()

    def _optimizer_stepped(self, optimizer: Any) -> None:
        if self._pending is not None:  # a scheduler held the last snapshot back and did not step
            self._leave_out()
        self._counts[id(optimizer)] = self._counts.get(id(optimizer), self.step) + 1
        prepared = self.accelerator._optimizers or [optimizer]  # (after free_memory: the one stepping)
        done = min(self._counts.get(id(opt), self.step) for opt in prepared)
        if done > self.step:
            self.step = done
            if self._due(done):
                self._pending = done
                self._waiting = {id(s) for s in self.accelerator._schedulers
                                 if s.step_with_optimizer and id(s) not in self._not_per_step}
                self._take_when_ready()
            elif self._first_copy is None and not self.host_copy_s:
                self._blank_ahead()

    def _scheduler_stepped(self, scheduler: Any) -> None:
        self._waiting.discard(id(scheduler))
        self._take_when_ready()

    def _take_when_ready(self) -> None:
        if self._pending is not None and not self._waiting:
            step, self._pending = self._pending, None
            self.take(step)

    def _leave_out(self) -> None:
        self._not_per_step |= self._waiting
        if not self._said_left_out:
            self._said_left_out = True
            self.accelerator.print(
                f"snapshot step {self._pending:,} left out: a prepared scheduler did not step after that "
                "optimizer step, so the step never ended whole; that scheduler is no longer waited for "
                "(this is said once)")
        self._pending, self._waiting = None, set()

    def _due(self, step: int) -> bool:
        due = bool(self.steps and step % self.steps == 0)
        if self.seconds is not None and not due:
            due = time.monotonic() - self._last >= self.seconds
            if self.accelerator.num_processes > 1:  # rank 0's clock, for every rank
                flag = torch.tensor([int(due)], device=self.accelerator.device)
                due = bool(ops.broadcast(flag, 0).item())
        return due

    # ---- taking one ---------------------------------------------------------------------
    def take(self, step: int) -> None:
        """Copy the state to host memory now and write it in the background (every rank, same step)."""
        accelerator = self.accelerator
        start = time.perf_counter()
        final = self.directory / snapshot_dir.snapshot_name(step)
        tmp = final.with_name(final.name + ".tmp")
        items = orchestration.run_save_hooks(accelerator, tmp)
        owner = accelerator.is_main_process
        parts = (items.checkpointer.snapshot_parts(items.model_states, owner, self._staging(step, tmp))
                 + training_state.state_files(items, accelerator.state, owner, accelerator.step))
        spare, self._spare = (self._spare if not self.writer.busy else None), None
        if spare is None and self._first_copy is not None:
            spare, self._first_copy = self._first_copy.ready(), MadeAhead.NONE
        parts = [host_copied(part, spare) for part in parts]
        meta = {"step": step, "token": self.token, **identity(accelerator)} if owner else {}
        self._last = time.monotonic()
        copy_s = time.perf_counter() - start
        self.host_copy_s.append(copy_s)
        meta["host_copy_s"] = copy_s
        meta["bytes"] = sum(_nbytes(part) for part in parts)
        left, group = self.writer.abandoned, self.group  # (a heal may replace both meanwhile)
        self.writer.submit(step, lambda: self._background(step, parts, tmp, final, meta, group, left.is_set))

    def _blank_ahead(self) -> None:
        """After this process's first step (the optimizers' state exists now), the first snapshot's host
        copy of the models and optimizers (the large parts; the small files are copied fresh) made
        ahead without its values, by a background thread (``host_copy.blank``), so that the first
        copy too overwrites pages already in memory (1 GB here: 62 ms, not 231). Only where
        the checkpointer's parts are the live tensors (made without a copy or a collective: not
        DeepSpeed's, FSDP's or XLA's), and not where it would take more than its share of the
        host memory available (``copy_memory.SPARE_SHARE``)."""
        self._first_copy = MadeAhead.NONE
        items = orchestration.checkpoint_items(self.accelerator)
        if not getattr(items.checkpointer, "live_parts", False):
            return
        parts = items.checkpointer.snapshot_parts(None, self.accelerator.is_main_process, None)
        if not fits(sum(_nbytes(part) for part in parts)):
            return
        self._first_copy = MadeAhead(parts)

    def _staging(self, step: int, tmp: Path) -> Callable[[int], Path]:
        """Where a library's own writer writes on the training path (DeepSpeed's engine): host memory
        that every rank of this machine shares, else the snapshot's folder itself (then that write
        is not in the background: said once)."""
        def folder(need_bytes: int) -> Path:
            state = self.accelerator.state
            one_machine = state.num_local_processes == state.num_processes
            staged = None  # rank 0 decides, for every rank
            if state.is_main_process:
                staged = state_parts.staging_directory(self.token, step, need_bytes, one_machine) or tmp
                staged.mkdir(parents=True, exist_ok=True)
            if state.num_processes > 1:
                staged = ops.broadcast_object_list([staged])[0]
            assert staged is not None
            if staged == tmp and not self._said_in_place:
                self._said_in_place = True
                self.accelerator.print(
                    f"snapshots of {type(self.accelerator.strategy).__name__} are written on the training path: "
                    + (f"no room for {2 * need_bytes / 2**30:.1f} GiB in {state_parts.SHM} (host memory)"
                       if one_machine else "the ranks span machines, so they share no host memory")
                    + " (this is said once)")
            return staged
        return folder

    def _background(self, step: int, parts: list[state_parts.Part], tmp: Path, final: Path,
                    meta: dict[str, Any], group: Any, left: Callable[[], bool]) -> None:
        """The snapshot's background job: kept in the peers' memory first (``in_peers``), then written;
        its host copy is then the next snapshot's to overwrite (``_spare``)."""
        try:
            self._keep_and_write(step, parts, tmp, final, meta, group, left)
        finally:
            self._spare = spare_of(parts, meta["bytes"])

    def _keep_and_write(self, step: int, parts: list[state_parts.Part], tmp: Path, final: Path,
                        meta: dict[str, Any], group: Any, left: Callable[[], bool]) -> None:
        if self.in_peers and group is not None:
            snapshot_peers.keep(parts, meta, step, str(self.directory), group)
            if not self._said_held:
                self._said_held = True
                own, neighbour = snapshot_peers.held_bytes()
                world = self.accelerator.num_processes
                self.accelerator.print(
                    f"snapshot step {step:,} kept in the peers' memory: rank 0 holds {snapshot_dir.size_text(own + neighbour)} "
                    f"(its part {snapshot_dir.size_text(own)} + rank {world - 1}'s {snapshot_dir.size_text(neighbour)}); each rank holds its "
                    "own part and its neighbour's (this is said once)")
        self._write(parts, tmp, final, meta, group, left)

    def _write(self, parts: list[state_parts.Part], tmp: Path, final: Path, meta: dict[str, Any],
               group: Any, left: Callable[[], bool]) -> None:
        state = self.accelerator.state
        tmp.mkdir(parents=True, exist_ok=True)
        state_parts.write_parts(tmp, parts, group, paced=PACED_WRITES)
        snapshot_dir.mark_done(tmp, state.process_index, self.token)
        if not state.is_main_process:
            return
        missing = snapshot_dir.wait_for_ranks(tmp, state.num_processes, self.token, RANK_WAIT_S, stop=left)
        if left():  # a heal left it: a dead rank's part never comes
            return
        if missing:
            raise RuntimeError(f"ranks {missing} did not write their part within {RANK_WAIT_S:g} s")
        snapshot_dir.commit(tmp, final, {**meta, "saved_at": time.time()})
        snapshot_dir.prune(self.directory, self.keep)
        if self.remote is not None:
            snapshot_remote.push(final, self.remote, self.keep)

    def wait(self) -> None:
        """Wait for the write in flight (``end_training``, a worker's exit)."""
        self.writer.wait()


def leave_old_group() -> None:
    """Every schedule of this process leaves the process group a heal replaced (``Snapshots.leave_old_group``)."""
    for schedule in list(_schedules):
        schedule.leave_old_group()


def newest_held() -> snapshot_dir.SnapshotInfo | None:
    """The newest complete snapshot of this process's schedules (what a heal can point to for
    the sharded state it cannot copy), or ``None``."""
    found = [snapshot_dir.newest(schedule.directory) for schedule in list(_schedules)]
    held = [info for info in found if info is not None]
    return max(held, key=lambda info: info.saved_at) if held else None


def _nbytes(part: state_parts.Part) -> int:
    if isinstance(part, StateFile):
        return nbytes(part.obj)
    if isinstance(part, state_parts.ShardedState):
        return nbytes(part.state)
    return sum(f.stat().st_size for f in part.path.rglob("*") if f.is_file())


def _one_machine(state: Any, url: str) -> None:
    """Refuse a URL's mirror when the ranks span machines (each would have its own)."""
    if state.num_local_processes != state.num_processes:
        raise ValueError(f"snapshots to {url}: the ranks span machines, and a URL is written through a "
                         "mirror folder on one machine; give a folder every machine sees instead")


def _writer_group(accelerator: Any, in_peers: bool) -> Any:
    """A process group for the background jobs' collectives (a sharded state's writes, the parts sent
    to the peers), beside the one training uses (every rank creates it, now); ``None`` where the jobs
    take none (only FSDP's sharded state is written through ``torch.distributed.checkpoint``, whose
    writes plan together)."""
    sharded = getattr(accelerator.strategy.checkpointer([], []), "sharded", False)
    if accelerator.num_processes == 1 or not (sharded or in_peers):
        return None
    import torch.distributed as dist

    return dist.new_group(backend="gloo")


def _check_in_peers(accelerator: Any, in_peers: Any) -> None:
    if not isinstance(in_peers, bool):
        raise ValueError(f"snapshot_every(in_peers={in_peers!r}): must be True or False")
    checkpointer = accelerator.strategy.checkpointer([], [])
    if in_peers and not getattr(checkpointer, "in_memory", True):
        raise ValueError(f"snapshot_every(in_peers=True): {type(accelerator.strategy).__name__}'s state is written "
                         "by its engine into files, which are not kept in memory; in_peers=True works with DDP and "
                         "FSDP2 (the snapshots on disk still serve resume())")


def _check(steps: int | None, seconds: float | None, keep: int) -> None:
    if steps is None and seconds is None:
        raise ValueError("snapshot_every needs steps=N (every N optimizer steps), seconds=S, or both")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ValueError(f"snapshot_every(steps={steps!r}): must be an integer >= 1")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0):
        raise ValueError(f"snapshot_every(seconds={seconds!r}): must be a number > 0")
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValueError(f"snapshot_every(keep={keep!r}): must be an integer >= 1")


def _shared_directory(state: Any, directory: Path) -> str:
    """Make ``directory`` ready (rank 0: created, half-written snapshots of killed runs removed) and
    check that every rank sees it; returns this run's token (rank 0's), for the write markers."""
    token = secrets.token_hex(8) if state.is_main_process else None
    if state.is_main_process:
        directory.mkdir(parents=True, exist_ok=True)
        snapshot_dir.clear_unfinished(directory)
        (directory / f".run-{token}").touch()
    if state.use_distributed:
        token = ops.broadcast_object_list([token])[0]
    state.wait_for_everyone()
    seen = (directory / f".run-{token}").exists()
    if state.use_distributed:
        seen = all(ops.gather_object([seen]))
    state.wait_for_everyone()
    if state.is_main_process:
        (directory / f".run-{token}").unlink(missing_ok=True)
    if not seen:
        raise ValueError(f"snapshot directory {directory} is not the same directory on every rank: snapshots "
                         "need one that every rank sees (one machine, or a shared file system)")
    return str(token)
