"""``%%accelerate``: run a notebook cell on every worker, names in and results out.

Data flows one way: cell -> names it reads (``names``) -> checked shipment
(``shipping``) -> ``notebook_launcher`` running ``cell_runner.cell_job`` on every
worker -> rank 0's assigned names (``pulling``) -> the notebook namespace.

While the notebook's pool is up (``%accelerate start``, :mod:`magics.pool`) the cell
runs on its warm workers instead, in each worker's namespace; only the names the
workers lack are shipped.
"""

from __future__ import annotations

import ast
import collections
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from magics import commands
from magics import pool as notebook_pool
from magics.cell import crossings, pulling
from magics.cell.arguments import (
    COMMANDS,
    WITH_ARGUMENT,
    flags_given,
    launch_options,
    magic_flags,
    parse_line,
    pool_flags_given,
    unused_flags,
)
from magics.cell.flag_check import check_words
from magics.cell.ledger import LEDGER
from magics.cell.names import imported_names
from magics.cell.runner import CELL_VALUE, cell_job
from magics.cell.shipping import check_defined, collect_names
from magics.cell.source import cell_number, make_cell_code
from notebook_accel.launch import LaunchInterrupted, WorkerError, deferred_interrupts


@magics_class
class AccelerateMagics(Magics):
    """The ``%%accelerate`` cell magic and the ``%accelerate env|test|config`` line magic."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self._raw_cell: str | None = None
        if shell is not None:
            shell.events.register("pre_run_cell", self._remember_cell)

    def _remember_cell(self, info: Any) -> None:
        self._raw_cell = getattr(info, "raw_cell", None)

    @line_cell_magic
    @magic_flags
    def accelerate(self, line: str, cell: str | None = None) -> Any:
        """Run this cell on every worker: the notebook's names go in, the results come out.

        Cell magic::

            %%accelerate -n 2 --mixed-precision bf16
            accelerator = Accelerator()
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            ...

        Every worker runs the cell in a fresh namespace holding the notebook names
        the cell reads (modules are imported again, notebook functions and classes
        travel by value); names that cannot be sent are listed before any worker
        starts. Output appears live, prefixed ``[rank N]``; a failing rank fails the
        cell with its own traceback. Afterwards the names the cell assigned come
        back from rank 0 (tensors on the CPU, models unwrapped from DDP); one line
        names what was sent and what came back, another what cannot come back; a
        notebook object the cell only changed in place comes back when named with
        --pull. A last expression's value is shown, as in any cell. The process
        group is ready in every cell; ``Accelerator()`` picks up the flags through
        the worker environment. An object that belongs to one rank (an
        ``Accelerator``, a prepared model, optimizer or loader, rank 0's copies of
        them) is never sent: the cell is refused, saying which cell builds it.

        On the pool, the workers' names win: a name they hold is not sent again
        (the cell says when the notebook's differs); --push NAMES sends it anyway.

        Line magic::

            %accelerate env      versions, devices and the config in force
            %accelerate test     a short training sanity check on the workers (-n N)
            %accelerate config   the configuration panel
            %accelerate start    start the notebook's warm pool (-n N, launch flags):
                                 later cells run on its workers, whose state stays;
                                 --detach [--name NAME]: a keeper owns them, they
                                 outlive the kernel
            %accelerate status   its ranks, pids, memory, the names living on them
            %accelerate restart  fresh workers for the pool (with launch flags: those
                                 options changed); %accelerate stop ends it
            %accelerate debug    pdb on the rank that failed the pool's last run
            %accelerate stacks   every rank's stack now, ranks at one place grouped
            %accelerate snapshots [DIR]  a snapshot directory's snapshots: step, when
                                 saved, size, complete or not, which one resume() loads
            %accelerate collectives  every rank's last collectives side by side (--last N)
            %accelerate watch    the pool's background cell: its lines so far, then live
            %accelerate pools    this user's detached pools on this machine (and on
                                 the Ray cluster connected, or --cluster ADDRESS)
            %accelerate attach [NAME]  make a detached pool the notebook's pool (from
                                 any kernel of yours; one on a Ray cluster: by name,
                                 --cluster ADDRESS); %accelerate stop NAME ends one

        ``%%accelerate --ranks 1`` (or ``0,2-3``) runs the cell on some ranks of the pool;
        ``breakpoint()`` in a pool cell opens pdb on that rank, in the cell's input box.
        ``%%accelerate --background`` runs the cell on the pool in the background and returns
        its handle at once (``.watch()``, ``.cancel()``, ``.result()``, ``.logs(rank)``): the
        notebook stays free; its names stay on the workers.

        Unset flags fall back to NOTEBOOK_ACCEL_* environment variables, then the
        config file (--config, else the default one), then auto-detection.
        """
        check_words(self.accelerate.parser, line, cell is not None, COMMANDS, WITH_ARGUMENT)
        args = parse_line(self.accelerate, line)
        pool_flags = pool_flags_given(args)
        if pool_flags and args.command not in ("start", "restart"):
            raise UsageError(f"{', '.join(pool_flags)} set{'s' if len(pool_flags) == 1 else ''} "
                             "the notebook's pool: use with %accelerate start (or restart)")
        if cell is not None and args.command:
            raise UsageError(f"'{args.command}' is a line magic: use %accelerate {args.command} "
                             "(one % sign) in a cell of its own")
        with deferred_interrupts():  # the stop button must not cut an import half-way
            return self._line(args) if cell is None else self._cell(args, line, cell)

    def _line(self, args: Any) -> Any:
        if args.command is None:
            raise UsageError("%accelerate needs a command: env, test or config; "
                             "use %%accelerate at the top of a cell to run the cell on the "
                             "workers (%%accelerate? for help)")
        unused = unused_flags(args)
        if unused:
            raise UsageError(f"%accelerate {args.command} does not use {', '.join(unused)}; "
                             "launch flags go with %accelerate start, restart or test, or on a "
                             "%%accelerate cell")
        runner = {"env": commands.env, "test": commands.test, "config": commands.config,
                  "start": notebook_pool.start, "status": notebook_pool.status,
                  "restart": notebook_pool.restart, "stop": notebook_pool.stop,
                  "debug": notebook_pool.debug, "stacks": notebook_pool.stacks,
                  "snapshots": commands.snapshots,
                  "collectives": notebook_pool.collectives,
                  "watch": notebook_pool.watch, "pools": notebook_pool.pools,
                  "attach": notebook_pool.attach}
        with notebook_pool.busy_said():
            return runner[args.command](args)

    def _cell(self, args: Any, line: str, body: str) -> Any:
        if args.last is not None:
            raise UsageError("--last goes with %accelerate collectives (a line magic), not a cell")
        raw_cell, self._raw_cell = self._raw_cell, None
        code, tree, names = make_cell_code(self.shell, line, body, raw_cell)
        pool = None if args.fresh else notebook_pool.current()
        if pool is not None and flags_given(args):
            raise UsageError(f"{', '.join(flags_given(args))}: this cell would run on the pool, "
                             "which keeps the flags it was started with; add --fresh to run it "
                             "on fresh workers with these flags, or %accelerate stop and start "
                             "the pool again with them")
        ranks = self._ranks(args, pool)
        if args.background:
            self._background_allowed(args, pool)
        if pool is not None:
            with notebook_pool.busy_said():  # (a background cell's failure: raised here, once)
                pool.revive()  # one rule: workers that died, idle or mid-run, are replaced (said)
        on_workers = set(pool.names_on(ranks)) if pool is not None else set()  # (the chosen ranks')
        user_ns = self.shell.user_ns
        missing = [name for name in args.push if name not in user_ns]
        if missing:
            raise UsageError(f"--push {','.join(missing)}: the notebook has no such name")
        if not names.star_import:  # `import *` binds names we cannot know
            check_defined(names.reads, names.assigns, collections.ChainMap(user_ns, dict.fromkeys(on_workers)))
        crossing = crossings.choose(names.reads, user_ns, LEDGER, on_workers,
                                    pool.copies_on(ranks) if pool is not None else (), args.push)
        shipment = collect_names(crossing.send, user_ns, self.shell.user_ns_hidden, LEDGER)
        pull, skipped = pulling.default_pull(names.assigns) if args.pull is None else (args.pull, {})
        if (ranks is not None or args.background) and args.pull is None:
            pull, skipped = (), {}  # names come back from rank 0; from other ranks only when asked
        if args.pull != () and not args.background and tree.body and isinstance(tree.body[-1], ast.Expr):
            pull = (*pull, CELL_VALUE)
        job = cell_job(code, shipment.values, shipment.modules, tuple(pull),
                       pooled=pool is not None, replace=tuple(crossing.replace),
                       pack_rank=None if ranks is None else ranks[0], asked=args.pull is not None)
        number = cell_number(self.shell)
        LEDGER.record_sent(shipment.values, number, on_pool=pool is not None)
        crossings.report_kept(crossing)
        if args.background:
            return notebook_pool.background(pool, job, ranks, number)
        try:
            result = self._run(job, pool, args, ranks)
        except WorkerError as error:
            if pool is not None:
                notebook_pool.failed(error, number)
            raise
        except LaunchInterrupted as stop:  # nothing comes back: said in the stop's line
            state = [name for name in pull if name not in imported_names(tree)]
            on_workers = None if pool is None else [  # this cell's names the workers hold
                name for name in pool.names_on(ranks) if name in pool.lost]
            raise LaunchInterrupted(pulling.stopped_text(stop, state, user_ns, on_workers)) from None
        values, failed = pulling.unpack(result, pull, explicit=args.pull is not None)
        if result is not None:
            skipped.update(result.skipped)
        value = values.pop(CELL_VALUE, None)
        if CELL_VALUE in failed:
            failed["the cell's value"] = failed.pop(CELL_VALUE)
        line = crossings.summary(shipment.values, values, crossing, pool is not None, LEDGER)
        self.shell.push(values)
        LEDGER.record_pulled(values, number, on_pool=pool is not None)
        LEDGER.record_skipped(skipped, number)  # said by %accelerate status, not here
        if line:
            print(line, flush=True)
        pulling.report(failed)
        return value

    @staticmethod
    def _background_allowed(args: Any, pool: Any) -> None:
        """``--background`` runs on the notebook's pool and brings nothing back."""
        if pool is None:
            raise UsageError("--background runs a cell on the notebook's pool while the notebook "
                             "stays free: start one with %accelerate start -n N"
                             + (" (not with --fresh)" if args.fresh else ""))
        if args.pull:
            raise UsageError(f"--pull {','.join(args.pull)}: a --background cell brings nothing "
                             "back (its names stay on the workers); a later cell reads them "
                             "there, or brings one back with --pull")

    @staticmethod
    def _ranks(args: Any, pool: Any) -> tuple[int, ...] | None:
        """The ranks ``--ranks`` chose (None: every rank)."""
        if args.ranks is None:
            return None
        if pool is None:
            raise UsageError("--ranks runs a cell on some ranks of the notebook's pool: start "
                             "one with %accelerate start -n N (fresh workers run every rank)")
        from notebook_accel.launch import parse_ranks

        try:
            return parse_ranks(args.ranks, pool.plan.world_size)
        except ValueError as error:
            raise UsageError(f"--ranks: {error}") from None

    @staticmethod
    def _run(job: Any, pool: Any, args: Any, ranks: tuple[int, ...] | None) -> Any:
        """Run the cell's job on the pool (some of its ranks), or on fresh workers with the
        cell's flags."""
        if pool is not None:
            from notebook_accel.launch import PoolUnavailable

            try:
                return pool.run(job) if ranks is None else pool.run_on(ranks, job)
            except PoolUnavailable as error:  # said in the magic's words
                raise UsageError(f"{error.reason}; %accelerate start starts a new pool, or "
                                 "%%accelerate --fresh runs this cell on fresh workers") from None
        from notebook_accel.launch import launch_request

        try:  # the flags' request as it is: an error about a value names its flag
            return launch_request(job, launch_options(args))
        except (TypeError, ValueError) as error:  # a bad option or config value: no traceback needed
            raise UsageError(str(error)) from None
