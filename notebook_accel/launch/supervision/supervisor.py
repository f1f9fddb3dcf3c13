"""Watch running workers: relay their output, collect outcomes, ask the verdicts.

The kernel waits on every worker at once (output pipes, control pipes, process
sentinels: ``ready_channels.py``). On the first failure it waits a moment for other
reports, stops the rest and raises one ``WorkerError`` naming the earliest real failure
(``verdicts/root_cause.py``); errors of peers whose collectives broke because of it are
listed, not headlined. A timeout's error is ``verdicts/timeout.py``'s, a silent rank the
hang watch's (``verdicts/hangs.py``).

Workers of a warm pool (``handle.persistent``) do not exit at the end of a run: a
rank's run ends with its ``RunDone`` report, and stopping a run interrupts the ranks
still in it (KeyboardInterrupt), killing only those that do not answer within
``INTERRUPT_GRACE`` (a rank blocked in a C++ collective).

Its tuning constants are ``launch/tuning.py``'s; what one launch asks of it, its
:class:`WatchSettings`.
"""

from __future__ import annotations

import functools
import time
from collections import deque

from notebook_accel.launch import tuning
from notebook_accel.launch.backends.base import ChannelKeeper, WorkerHandle
from notebook_accel.launch.backends.signal_all import signal_all
from notebook_accel.launch.control.debug_prompt import Prompts
from notebook_accel.launch.control.interrupts import LaunchInterrupted, check_interrupt
from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.launch.supervision.ready_channels import ReadyChannels
from notebook_accel.launch.supervision.run_stop import poll_for, stop_ranks
from notebook_accel.launch.supervision.stack_dumps import StackDumps
from notebook_accel.launch.supervision.verdicts.hangs import HangWatch, cell_note
from notebook_accel.launch.supervision.verdicts.interrupted import interrupted_line
from notebook_accel.launch.supervision.verdicts.lone_collective import AT_ONCE, lone_collective
from notebook_accel.launch.supervision.verdicts.root_cause import root_cause
from notebook_accel.launch.supervision.verdicts.timeout import timeout_error
from notebook_accel.launch.supervision.watched import WatchSettings, Worker
from notebook_accel.launch.supervision.worker_stacks import ANSWERS
from notebook_accel.launch.views import NullView, View
from notebook_accel.launch.views.output import FLUSH_EVERY, OutputRelay
from notebook_accel.launch.views.record import LaunchRecord, RankState, RankStatus
from notebook_accel.launch.worker.hub.hub_link import memory_moved
from notebook_accel.wire import (
    DebugEnd,
    Display,
    FailureRecord,
    InputAsk,
    Result,
    RunDone,
    Stack,
    StopCount,
)

__all__ = ["Supervisor", "WatchSettings", "Worker"]


class Supervisor:
    """Runs the watch loop for one launch: polls the channels, and asks the verdicts."""

    def __init__(self, handles: list[WorkerHandle], relay: OutputRelay, record: LaunchRecord,
                 view: View, settings: WatchSettings | None = None,
                 keeper: ChannelKeeper | None = None) -> None:
        """``settings``: the launch's (``WatchSettings.of(plan)``; None: the defaults);
        ``keeper``: where workers that outlive the run keep their channels registered."""
        self.workers = workers = [Worker(handle) for handle in handles]
        self.settings = settings = settings or WatchSettings()
        self._looked = 0.0
        self.prompts = Prompts()  # the ranks' debugger prompts
        self.at_once: str | None = None  # why a stop cannot wait for a cut (stop at once)
        self.stopped_at_once: str | None = None  # why the stop button could not use a cut
        self.relay = relay
        relay.watch({h.rank: h.prefix for h in handles})
        record.output = relay.logs  # every rank's lines: last_launch().logs(rank)
        self.record = record
        self.view = view
        for w in workers:
            record.ranks[w.rank] = RankStatus(rank=w.rank, pid=w.pid, node=w.handle.node)
        self.by_rank = {w.rank: w for w in workers}
        self.channels = ReadyChannels.kept(keeper, self.by_rank, record)
        self.unfinished = {w.rank for w in workers}
        # memory: each rank sampled once a second, a few per wakeup (a warm pool's first
        # samples wait that long); a rank whose inbox tells when its figure moves (a
        # cluster's: its hub's) is sampled once, then told
        first = time.monotonic() + tuning.RSS_EVERY if any(h.persistent for h in handles) else 0.0
        self._samples: deque[tuple[float, int]] = deque((first, w.rank) for w in workers)
        self.dumps = StackDumps(relay)  # the stacks of ranks that cannot answer a StackAsk
        self.hangs = HangWatch(list(self.by_rank), settings.hang_after, record,
                               functools.partial(cell_note, relay), self.dumps)
        self.first_failure: float | None = None
        self.timed_out_at: float | None = None  # time.time() when the timeout hit

    # -- reading -----------------------------------------------------------------------------

    def _register(self) -> None:
        self.channels.register(self.workers)
        if self.channels.inboxes:  # what came before this run (a pool's idle time) is read once
            self._drain()

    def _read_output(self, worker: Worker, name: str) -> None:
        while True:
            data = worker.handle.read_output(name)
            if data is None:
                return
            if not data:
                if worker.handle.inbox is None:
                    self.channels.unregister(getattr(worker.handle, f"{name}_fd"))
                return
            self.relay.feed(worker.rank, name, data)
            self.hangs.moved(worker.rank)
            if len(data) < tuning.OUTPUT_READ:
                return  # drained (what comes later wakes the loop again): one read, not two

    def _read_events(self, worker: Worker) -> None:
        messages, still_open = worker.events.read()
        if messages:
            self.hangs.moved(worker.rank)
        for message in messages:
            self.record.apply(worker.rank, message)
        if not still_open and worker.handle.inbox is None:
            self.channels.unregister_events(worker.handle.events_fd)

    def _read_control(self, worker: Worker) -> None:
        messages, still_open = worker.control.read()
        for message in messages:
            if type(message) is Result:
                worker.returned, worker.result = True, message.value
            elif type(message) is FailureRecord:
                worker.error = message
                self._failed()
            elif type(message) is Display:
                self.relay.display(message)
            elif type(message) is RunDone:
                worker.handle.last_report = message
                self._run_ended(worker)
            elif type(message) is StopCount:  # not progress: an answer (a mark stays)
                worker.stop_count = message
                continue
            elif type(message) is InputAsk:
                self.prompts.ask(worker, message)
            elif type(message) is DebugEnd:
                self.prompts.end(worker.rank)
            elif type(message) is Stack:  # not progress: an answer
                ANSWERS.deliver(worker.rank, message)  # (an ask of pool.collectives())
                if worker.answered(message):
                    self._check_collective(worker, message)
                continue
            self.hangs.moved(worker.rank)
        if not still_open and worker.handle.inbox is None:
            self.channels.unregister(worker.handle.control_fd)

    def _on_exit(self, worker: Worker) -> None:
        self.prompts.end(worker.rank)
        worker.handle.reap(timeout=tuning.EXIT_REAP_WAIT)
        worker.exited, worker.exit_time = True, time.time()
        self.unfinished.discard(worker.rank)
        if worker.handle.inbox is None:
            self.channels.unregister(worker.handle.sentinel)
        self._await_ends(worker)
        self._read_control(worker)
        self._read_events(worker)
        self._read_output(worker, "stdout")
        self._read_output(worker, "stderr")
        self.relay.finish(worker.rank)
        self.record.ranks[worker.rank].exitcode = worker.exitcode
        self._settle(worker, self.timed_out_at or time.time(), finished=worker.returned and worker.exitcode == 0,
                     stopped=worker.stopped)

    def _await_ends(self, worker: Worker) -> None:
        """Read an ended rank's output and control channels to their ends, for at most its
        handle's ``end_grace`` seconds: over a network its last lines and its result may arrive
        after its end, which came on another connection."""
        if not worker.handle.end_grace:
            return
        for name in self.channels.until_ended(worker):
            if name == "control":
                self._read_control(worker)
            else:
                self._read_output(worker, name)

    def _run_ended(self, worker: Worker) -> None:
        """A persistent worker reported the end of its run (its output is all in its pipes)."""
        worker.run_done = True
        self.prompts.end(worker.rank)
        self.unfinished.discard(worker.rank)
        self._read_output(worker, "stdout")
        self._read_output(worker, "stderr")
        self._read_events(worker)
        self.relay.finish(worker.rank)
        self._settle(worker, time.time(), finished=worker.returned, stopped=worker.interrupted)

    def _settle(self, worker: Worker, ended: float, finished: bool, stopped: bool) -> None:
        """The rank's end in the record: finished, stopped, or failed (which may end the job)."""
        status = self.record.ranks[worker.rank]
        status.ended = ended
        if finished:
            status.state = RankState.FINISHED
        elif stopped:
            status.state = RankState.STOPPED
        else:
            status.state = RankState.FAILED
            self._failed()

    def _failed(self) -> None:
        if self.first_failure is None:
            self.first_failure = time.monotonic()

    def _drain(self) -> None:
        ended = [rank for rank, kind in self.channels.news(None) if kind == "exit"]  # the rest: below
        for w in self.workers:
            self._read_output(w, "stdout")
            self._read_output(w, "stderr")
            self._read_control(w)
            self._read_events(w)
        for rank in ended:
            if not self.by_rank[rank].exited:
                self._on_exit(self.by_rank[rank])
        self._flush()

    def _flush(self) -> None:
        """Relay what was gathered, unless the live view still has to appear above it."""
        if not getattr(self.view, "holds_output", False):
            self.relay.flush(pace=FLUSH_EVERY)

    # -- the loop ------------------------------------------------------------------------------

    def _poll(self, timeout: float) -> None:
        """One wakeup, within ``WAKEUP_BUDGET``: the record and the view brought up to date
        with what the last wakeups read, then what is ready (what the last wakeup left first,
        then output and events, control, ends) until the budget is spent (one channel at
        least; the rest is left to the next wakeup, which comes at once), then the cell. So a
        burst of every rank's lines is taken over several short wakeups, back to back."""
        ready = self.channels.ready(timeout)
        deadline = time.perf_counter() + tuning.WAKEUP_BUDGET
        self._refresh()
        self._read_ready_events(deadline)
        taken = 0
        while ready and not (taken and time.perf_counter() > deadline):
            rank, kind = ready.popleft()
            taken += 1
            worker = self.by_rank[rank]
            if kind == "exit":
                if not worker.exited:
                    self._on_exit(worker)
            elif kind == "control":
                self._read_control(worker)
            elif kind == "events":
                self._read_events(worker)
            else:
                self._read_output(worker, kind)
        self.relay.tick()
        self._flush()

    def _read_ready_events(self, deadline: float) -> None:
        """Read the ranks' events that are ready until ``deadline`` (a
        ``time.perf_counter()``; one rank's at least)."""
        left = self.channels.ready_events()
        taken = 0
        while left and not (taken and time.perf_counter() > deadline):
            self._read_events(self.by_rank[left.popleft()])
            taken += 1

    def _wait_for(self) -> float:
        """How long the loop may wait: ``LONGEST_WAIT``, less when gathered output is due in
        the cell, not at all when the last wakeup's budget left something ready."""
        if self.channels.busy:
            return 0.0
        if getattr(self.view, "holds_output", False):
            return tuning.LONGEST_WAIT
        return min(tuning.LONGEST_WAIT, self.relay.due_in(FLUSH_EVERY))

    def _refresh(self) -> None:
        """Bring the record up to date (the ranks' last lines, memory) and redraw; costs what
        changed since the last wakeup, not the number of ranks."""
        self._take_last_lines()
        now, samples = time.monotonic(), self._samples
        deadline = time.perf_counter() + tuning.RSS_BUDGET
        while samples and samples[0][0] <= now:
            rank = samples.popleft()[1]
            worker = self.by_rank[rank]
            if not worker.exited:
                status, rss = self.record.ranks[rank], worker.handle.rss()
                if memory_moved(status.rss, rss):
                    status.rss = rss
                if not worker.handle.rss_told:
                    samples.append((now + tuning.RSS_EVERY, rank))
            if time.perf_counter() > deadline:
                break
        self._draw()

    def _draw(self, final: bool = False) -> None:
        """Redraw the view, except while a rank's debugger has the cell (a table would land
        between a pdb command and its answer)."""
        if self.prompts.holder is None or final:
            self.view.update(self.record, final)

    def _debugger_shown(self) -> None:
        """A rank's debugger has the cell: a view that has not appeared yet never will in
        this run (its table, below the transcript or inside it, would count the user's typing
        and show ranks the session is not on); one already shown stays above it."""
        if self.view.holds_output:
            self.view = NullView()

    def _take_last_lines(self) -> None:
        """Each rank's last line, for the ranks that wrote since the last look."""
        for rank in self.relay.take_touched():
            self.record.ranks[rank].last_line = self.relay.last_line(rank)

    def run(self) -> list[Worker]:
        """Watch until every worker has ended; returns them when all succeeded.

        Raises:
            WorkerError: a worker failed, or the timeout passed.
            KeyboardInterrupt: the user interrupted; every worker has been stopped.
        """
        outcome = "failed"
        try:
            self._watch()
            outcome = "finished"
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        except WorkerError:
            outcome = "timed out" if self.timed_out_at else "failed"
            raise
        finally:
            self.record.finish(outcome, self.timed_out_at)
            self._take_last_lines()  # what the last wakeups read: the summary's last lines
            self._draw(final=True)
            self.relay.flush()  # below the summary: output held while it had to appear
        return self.workers

    def _watch(self) -> None:
        self._register()
        for w in self.workers:  # shown "starting" until watched (once, before the loop)
            status = self.record.ranks[w.rank]
            if status.state == RankState.STARTING and not w.finished:
                status.state = RankState.RUNNING
        start, timeout = time.monotonic(), self.settings.timeout
        try:
            while self.unfinished:
                now = time.monotonic()
                if self.first_failure is not None and (
                        now - self.first_failure >= tuning.COLLECT_AFTER_FAILURE or self._all_reported()):
                    break
                if timeout is not None and now - start >= timeout:
                    raise self._timed_out()
                check_interrupt()
                self._poll(self._wait_for())
                self._look_at_stacks()
                self.hangs.look(self.workers)
                if self.prompts.serve(self._show_output):
                    self.hangs.waited()
        except KeyboardInterrupt:
            if self.prompts.interrupted:
                self.at_once = "the stop button was pressed at a debugger's prompt"
            self._stop()
            self._finish()
            raise LaunchInterrupted(interrupted_line(self.workers, self.stopped_at_once)) from None
        if self.first_failure is not None or not all(w.succeeded for w in self.workers):
            self._stop()
            self._finish()
            raise root_cause(self.workers, self.record, self._death_tail)
        self._finish()

    def _all_reported(self) -> bool:
        """Every rank still running has sent its failure (it is ending): no report is left to
        gather before the rest are stopped. (A rank that returned is left to end by itself.)"""
        return all(self.by_rank[rank].error is not None for rank in self.unfinished)

    def _stop(self) -> None:
        """Stop every worker still running (``run_stop.py``): a pool run's at a point they
        agree on, else at once (a KeyboardInterrupt; at once too when the hang watch already
        saw that no such point can be reached, or ``at_once`` says why not)."""
        self.stopped_at_once = stop_ranks(
            self.workers, self._poll, self._drain,
            lambda live: self.at_once or self.hangs.cut_unreachable(live), self.settings.stop_wait)

    def _show_output(self, worker: Worker) -> None:
        """Everything ``worker`` wrote so far, in the cell now (before its debugger's prompt)."""
        self._debugger_shown()
        self._read_output(worker, "stdout")
        self._read_output(worker, "stderr")
        self.relay.tick()
        self.relay.flush()

    def _look_at_stacks(self) -> None:
        """On a run on some ranks of a pool, ask the ranks where they are every
        ``SUBSET_LOOK_EVERY`` seconds (their answers go to :meth:`_check_collective`)."""
        if (not self.settings.collectives_before
                or time.monotonic() - self._looked < tuning.SUBSET_LOOK_EVERY):
            return
        self._looked = time.monotonic()
        for w in self.workers:
            if not w.finished:
                w.ask_stack()

    def _check_collective(self, worker: Worker, stack: Stack) -> None:
        """A rank of a run on some ranks entered a collective of the whole group, which the
        other ranks never join: it fails (the cause named) and the run stops at once."""
        before = (self.settings.collectives_before or {}).get(worker.rank)
        failure = lone_collective(worker, stack, before, self.by_rank, self.record.world_size)
        if failure is not None:
            worker.error = failure
            self.at_once = AT_ONCE
            self._failed()

    def _finish(self) -> None:
        if self.dumps.taking:  # the job ended while the ranks' stacks were being dumped
            self.dumps.take()
        ended = False
        for w in self.workers:  # ended meanwhile (with an exit status, or a lost node's rank)
            if not w.exited and (w.exitcode is not None or w.handle.describe_end() is not None):
                self._on_exit(w)
                ended = True
        if ended or not self._all_done():
            self._drain()
        for w in self.workers:
            self.relay.finish(w.rank)
        self._flush()
        self.channels.release()

    def _all_done(self) -> bool:
        """Every rank reported its run's end (``_run_ended`` read its channels then): nothing
        is left to drain (but a cluster's inboxes, which also tell of ends and memory)."""
        return not self.channels.inboxes and all(w.run_done for w in self.workers)

    # -- verdicts ------------------------------------------------------------------------------

    def _timed_out(self) -> WorkerError:
        """Stop the ranks still running, their stacks dumped first; the timeout's verdict."""
        self.timed_out_at = time.time()
        elapsed = self.timed_out_at - self.record.started  # the figure the live view shows
        running = [w for w in self.workers if not w.finished]
        marks = {w.rank: self.relay.line_count(w.rank) for w in running}
        for w in running:
            self.relay.hold(w.rank)  # the dump is shown once, in the error, cleaned up
        signal_all([w.handle for w in running], "dump_stacks")  # once per node on a cluster
        poll_for(self._poll, tuning.TIMEOUT_DUMP_WAIT)
        self._stop()
        self._finish()
        dumps = {w.rank: self.relay.tail(w.rank, since=marks[w.rank]) for w in running}
        return timeout_error(running, running[0] if running else self.workers[0], dumps, elapsed,
                             self.settings.timeout, self.timed_out_at)

    def _death_tail(self, rank: int) -> str:
        """The last lines of ``rank``'s stderr (why it died, for the root-cause verdict)."""
        return self.relay.tail(rank, limit=tuning.DEATH_TAIL)

