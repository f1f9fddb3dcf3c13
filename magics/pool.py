"""The notebook's warm pool: ``%accelerate start|status|restart|stop``.

One pool per kernel. While it is up, ``%%accelerate`` cells run on it (``--fresh``: on
fresh workers, as without a pool).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from IPython import get_ipython
from IPython.core.error import UsageError

from magics.cell.arguments import flags_given, launch_options
from magics.cell.crossings import holds_state, listed
from magics.cell.ledger import LEDGER
from notebook_accel.launch import (
    LaunchRequest,
    PoolBusy,
    PoolUnavailable,
    WorkerError,
    WorkerPool,
    cluster_pools,
    detached_pools,
    format_bytes,
    format_duration,
    known_cluster,
    ranks_text,
    stop_detached,
    stop_on_cluster,
    where_workers_run,
)

_pool: WorkerPool | None = None
_request: LaunchRequest | None = None  # the options it was started with (restart changes some)
_failure: tuple[int, int | None, int] | None = None  # the latest failed cell's (rank, pid, cell)
_background_cell: int | None = None  # the number of the latest --background cell


def current() -> WorkerPool | None:
    """The notebook's pool, if one is up."""
    return _pool if _pool is not None and not _pool.closed else None


def start(args: argparse.Namespace) -> None:
    """``%accelerate start -n 2 ...``: start the notebook's pool with the launch flags."""
    if current() is not None:
        raise UsageError("a pool is already up; %accelerate restart gives it fresh workers "
                         "(%accelerate restart -n 4 ...: with those launch flags changed), "
                         "%accelerate stop ends it")
    _open(launch_options(args), "pool up")


def _open(request: LaunchRequest, what: str) -> None:
    """Start the notebook's pool for ``request`` and say so, beginning with ``what``.

    Raises:
        UsageError: a bad option or config value (no traceback needed), before any worker
            starts.
    """
    global _pool, _request
    started = time.perf_counter()
    try:
        _pool = WorkerPool.from_request(request)  # errors name the flags
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None
    _request = request
    plan = _pool.plan
    where = where_workers_run(plan)
    print(f"[notebook_accel] {what}: {plan.world_size} ranks on {plan.device_type} "
          f"({where}), process group ready, in {time.perf_counter() - started:.2f} s; "
          "%%accelerate cells now run on it (--fresh: on fresh workers)")
    if getattr(_pool, "detached", False):
        print(f"[notebook_accel] detached pool {_pool.name!r}: a keeper process owns its workers, "
              "so it outlives this kernel; any kernel of yours reaches it with %accelerate "
              f"attach {_pool.name} (%accelerate stop {_pool.name} ends it)")


def attach(args: argparse.Namespace) -> None:
    """``%accelerate attach [NAME]``: make the detached pool ``NAME`` (none given: the only
    one up) the notebook's pool; say what runs on it. Several up and no name: list them."""
    global _pool, _request
    pool = current()
    if pool is not None and not (getattr(pool, "detached", False) and pool.name == args.target):
        raise UsageError("a pool is already up in this notebook; %accelerate stop ends it (a "
                         "detached one: leave it with pool.leave(), it goes on) before attaching")
    if args.target is None and len(detached_pools()) + len(_cluster_pools(args)) > 1:
        print("several detached pools are up; %accelerate attach NAME attaches one:")
        pools(args)
        return
    try:
        _pool = WorkerPool.attach(args.target, args.cluster)
    except ValueError as error:
        raise UsageError(str(error)) from None
    _request = None
    plan, handle = _pool.plan, _pool.background
    running = ("; idle" if handle is None or handle.done() else
               f"; running {handle.what} ({handle.state().removeprefix('running ')}): "
               "%accelerate watch shows it from its first line")
    print(f"[notebook_accel] attached to detached pool {_pool.name!r}: {plan.world_size} ranks "
          f"on {plan.device_type}{running}; %%accelerate cells now run on it")


def _require() -> WorkerPool:
    pool = current()
    if pool is None:
        raise UsageError("no pool is up; start one with %accelerate start -n N")
    return pool


def status(args: argparse.Namespace) -> None:
    """``%accelerate status``: ranks, pids, memory, the names living on the workers and the
    notebook's snapshots of rank 0's names (with the cell each came from)."""
    pool = current()
    if pool is None:
        print("no pool is up; %accelerate start -n N starts one (%%accelerate cells then run "
              "on its warm workers)")
    else:
        plan = pool.plan
        print(f"pool: {plan.num_processes} ranks on {plan.device_type}, start method "
              f"{plan.start.method}, mixed precision {plan.mixed_precision}"
              + (f"; detached pool {pool.name!r} (its keeper owns the workers)"
                 if getattr(pool, "detached", False) else ""))
        infos = pool.status()
        for info in infos:
            state = "alive" if info.alive else f"gone (exit code {info.exitcode})"
            memory = format_bytes(info.rss) if info.rss else "-"
            print(f"  rank {info.rank}: pid {info.pid}, {state}, memory {memory}")
        print(_workers_names(pool, [info.rank for info in infos if not info.alive]))
        handle = pool.background
        if handle is not None and not handle.done():
            print(f"in the background: {handle.what}, {handle.state()}; %accelerate watch shows it")
    user_ns = get_ipython().user_ns
    snapshots = {name: entry for name, entry in LEDGER.snapshots(user_ns).items()
                 if holds_state(user_ns[name])}
    if snapshots:
        print("in the notebook, copies of rank 0's names (snapshots, not live): " + listed(
            [f"{name} (cell [{entry.cell}])" for name, entry in snapshots.items()]))
    if LEDGER.skipped:
        print("left on rank 0, not brought back: " + listed(
            [f"{name} ({what}, cell [{cell}])" for name, (cell, what) in LEDGER.skipped.items()])
            + "; %%accelerate --pull NAME asks for one")


def _workers_names(pool: WorkerPool, gone: list[int]) -> str:
    if gone and pool.heals:
        alive = [info.rank for info in pool.status() if info.alive]
        kept = pool.names_on(alive)
        verb = "is" if len(gone) == 1 else "are"
        return (f"names on the workers: {', '.join(kept) or '(none)'} on the living ranks; "
                f"{ranks_text(gone)} {verb} gone: the next cell starts {ranks_text(gone)} again "
                "alone and copies it what the others hold alike (what only it held is lost)")
    if gone:
        lost = pool.lost
        verb = "is" if len(gone) == 1 else "are"
        return (f"names on the workers: none: {ranks_text(gone)} {verb} gone, so the workers' "
                f"state is lost{' (' + listed(lost) + ')' if lost else ''}; the next cell replaces the "
                "workers")
    some = _on_some_ranks(pool)
    if not pool.names and not some:
        return "names on the workers: (none yet)"
    copies = set(pool.copies)
    sent = [name for name in pool.names if name in copies]
    line = "names on the workers: " + (", ".join(pool.names) or "(none on every rank)")
    if some:
        line += "\n  on some ranks only (cells with --ranks): " + ", ".join(
            f"{name} ({ranks_text(ranks)})" for name, ranks in some.items())
    if sent:
        line += "\n  of which the notebook's copies (sent, not assigned on the workers): " + \
            ", ".join(f"{name} (cell [{LEDGER.sent[name].cell}])" if name in LEDGER.sent
                      else name for name in sent)
    return line


def _on_some_ranks(pool: WorkerPool) -> dict[str, list[int]]:
    """The names that live on some ranks but not all, with those ranks."""
    everywhere, some = set(pool.names), {}
    for rank in range(pool.plan.world_size):
        for name in pool.names_on(rank):
            if name not in everywhere:
                some.setdefault(name, []).append(rank)
    return some


def failed(error: WorkerError, cell: int) -> None:
    """A cell on the pool failed with ``error``: remember it, and add the next step to its
    message while its rank still holds the failure's frames (``%accelerate debug``)."""
    global _failure
    _failure = (error.rank, error.failure.pid, cell)
    if _failure_kept():
        note = (f"%accelerate debug opens pdb on rank {error.rank}, at the frame that raised "
                "(p NAME, up, l, q)")
        error.__notes__ = [*getattr(error, "__notes__", ()), note]  # add_note, on Python 3.10 too


def _failure_kept() -> bool:
    """The rank of the pool's latest failure is the same process: its frames are there."""
    pool = current()
    if _failure is None or pool is None:
        return False
    rank, pid, _ = _failure
    return pid is not None and any(info.rank == rank and info.pid == pid and info.alive
                                   for info in pool.status())


def debug(args: argparse.Namespace) -> None:
    """``%accelerate debug``: pdb on the root-cause rank of the pool's last failed run, at the
    frame that raised, in the cell's input box."""
    pool = _require()
    try:
        pool.debug()
    except RuntimeError as error:
        if type(error) is not RuntimeError:
            raise
        if _failure is None:
            raise UsageError("nothing to debug: no cell on the pool has failed (%accelerate "
                             "debug opens pdb where a failed cell raised)") from None
        rank, _, cell = _failure
        raise UsageError(f"rank {rank}'s failure in cell [{cell}] cannot be debugged any more: "
                         f"rank {rank}'s worker was replaced since (alone, by a heal, or with "
                         "every rank), and the failure's frames with it") from None


def stacks(args: argparse.Namespace) -> None:
    """``%accelerate stacks``: every rank's stack now, ranks at the same place grouped."""
    pool = current()
    if pool is None:
        print("no pool is up; a running launch shows its ranks' stacks grouped when it seems "
              "hung (hang_after=), and a timeout= error shows where each rank was")
        return
    print(pool.stacks())


def collectives(args: argparse.Namespace) -> None:
    """``%accelerate collectives [--last N]``: every rank's last collectives side by side."""
    pool = current()
    if pool is None:
        print("no pool is up; a running launch names the collectives its ranks disagree on "
              "when it seems hung (hang_after=)")
        return
    try:
        print(pool.collectives(last=8 if args.last is None else args.last))
    except ValueError as error:
        raise UsageError(f"--last: {error}") from None


def restart(args: argparse.Namespace) -> None:
    """``%accelerate restart``: fresh workers in the pool (their names are dropped); with
    launch flags, the pool is started again with those options changed (the others as it was
    started), as ``%accelerate stop`` then ``start`` would."""
    global _pool
    pool = _require()
    if getattr(pool, "detached", False):
        raise UsageError(f"a detached pool is not restarted from a kernel: %accelerate stop "
                         f"{pool.name}, then %accelerate start --detach again")
    lost = pool.lost
    dropped = f"names dropped: {', '.join(lost)}" if lost else ""
    changed = flags_given(args)
    if not changed:
        pool.restart()
        print(f"[notebook_accel] pool restarted: {pool.plan.num_processes} fresh ranks"
              + (f"; {dropped}" if dropped else ""))
        return
    request = _request.updated(launch_options(args))  # each flag checked while the pool is up
    pool.close()
    _pool = None
    try:
        _open(request, f"pool restarted with new {', '.join(changed)}")
    except UsageError as error:
        raise UsageError(f"{error}; the pool was stopped to restart it, so none is up now: "
                         "%accelerate start starts one") from None
    if dropped:
        print(f"[notebook_accel] {dropped}")


def stop(args: argparse.Namespace) -> None:
    """``%accelerate stop [NAME]``: end the notebook's pool (or the detached pool ``NAME``);
    nothing of it is left."""
    global _pool
    pool = current()
    if args.target is not None and not (getattr(pool, "detached", False) and pool.name == args.target):
        try:
            if args.cluster is None and args.target in {p["name"] for p in detached_pools()}:
                stop_detached(args.target)
            elif (cluster := args.cluster or known_cluster()) is not None:
                stop_on_cluster(args.target, cluster)  # its keeper actor, hubs and ranks
            else:
                stop_detached(args.target)  # (not up: says which are)
        except ValueError as error:
            raise UsageError(str(error)) from None
        print(f"[notebook_accel] detached pool {args.target!r} stopped")
        return
    pool = _require()
    pool.close()
    _pool = None
    print("[notebook_accel] pool stopped; %%accelerate cells start fresh workers again")


@contextlib.contextmanager
def busy_said() -> Iterator[None]:
    """A refusal of the busy pool as a usage error (no traceback: what runs and what to do);
    a background cell's failure, raised where it is first seen, remembered for ``debug``."""
    try:
        yield
    except PoolBusy as error:
        raise UsageError(str(error)) from None
    except WorkerError as error:
        if _background_cell is not None and not hasattr(error, "_cell_seen"):
            error._cell_seen = True
            failed(error, _background_cell)
        raise


def background(pool: WorkerPool, job: Any, ranks: tuple[int, ...] | None, cell: int) -> Any:
    """Start the ``%%accelerate --background`` cell ``cell``'s ``job`` on the pool; returns its
    handle (the cell's value: ``Out[cell]``)."""
    global _background_cell
    try:
        handle = pool.start_background(job, ranks=ranks, what=f"cell [{cell}]",
                                       advice=f"%accelerate watch, or Out[{cell}].cancel()")
    except PoolUnavailable as error:
        raise UsageError(f"{error.reason}; %accelerate start starts a new pool") from None
    _background_cell = cell
    return handle


def watch(args: argparse.Namespace) -> None:
    """``%accelerate watch``: the pool's current (or last) background cell in this cell: its
    lines so far, then live, each once, until it ends; then its outcome (a failure raises its
    ``WorkerError``). The stop button stops watching, not the run."""
    pool = _require()
    handle = pool.background
    if handle is None:
        print("nothing has run in the background on this pool: %%accelerate --background runs "
              "a cell so (the notebook stays free)")
        return
    with busy_said():
        handle.watch()


def pools(args: argparse.Namespace | None) -> None:
    """``%accelerate pools``: this user's detached pools on this machine, and those on the Ray
    cluster this kernel is connected to (or ``--cluster``), one line each."""
    listed = detached_pools() + _cluster_pools(args)
    if not listed:
        print("no detached pool is up (a detached pool's keeper owns its workers and outlives "
              "the kernel)")
        return
    for info in listed:
        since = format_duration(time.time() - info["since"])
        keeper = (f"keeper actor pid {info['pid']} on {info['node']} (Ray cluster "
                  f"{info['cluster']})" if "cluster" in info else f"keeper pid {info['pid']}")
        print(f"{info['name']}: {info['alive']}/{info['ranks']} ranks on {info['device']}, "
              f"{info['state']} for {since}, memory {format_bytes(info['memory'])}, {keeper}")


def _cluster_pools(args: argparse.Namespace | None) -> list[dict[str, Any]]:
    """The detached pools on the Ray cluster named by ``--cluster``, else on the one this
    kernel is connected to (none connected: none)."""
    try:
        return cluster_pools(getattr(args, "cluster", None))
    except (ValueError, ConnectionError, ImportError) as error:
        raise UsageError(str(error)) from None
