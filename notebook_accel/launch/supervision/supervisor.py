"""Watch running workers: relay their output, collect outcomes, find the root cause.

The kernel waits on every worker at once (output pipes, control pipes, process
sentinels). On the first failure it waits a moment for other reports, stops the
rest and raises one ``WorkerError`` naming the earliest real failure; errors of
peers whose collectives broke because of it are listed, not headlined.

Workers of a warm pool (``handle.persistent``) do not exit at the end of a run: a
rank's run ends with its ``RunDone`` report, and stopping a run interrupts the ranks
still in it (KeyboardInterrupt), killing only those that do not answer within
``INTERRUPT_GRACE`` (a rank blocked in a C++ collective).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import selectors
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from notebook_accel.launch.backends.base import WorkerHandle
from notebook_accel.launch.backends.signal_all import signal_all
from notebook_accel.launch.backends.stopping import stop_workers
from notebook_accel.launch.control.debug_prompt import Prompts
from notebook_accel.launch.control.interrupts import (
    LaunchInterrupted,
    check_interrupt,
    take_interrupt,
)
from notebook_accel.launch.control.stop_agreement import STOP_WAIT, agree_and_stop, stop_now
from notebook_accel.launch.supervision.bounded_selector import BoundedSelector
from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.launch.supervision.hang_watch import HANG_AFTER, HangWatch
from notebook_accel.launch.supervision.stack_dumps import StackDumps
from notebook_accel.launch.supervision.stack_groups import headline, stacks_text, users_part
from notebook_accel.launch.supervision.tracebacks import death_text, main_thread_stack
from notebook_accel.launch.supervision.worker_stacks import ANSWERS, stack_ask
from notebook_accel.launch.views import NullView, View
from notebook_accel.launch.views.output import FLUSH_EVERY, OutputRelay
from notebook_accel.launch.views.rank_ranges import ranks_text
from notebook_accel.launch.views.record import LaunchRecord, RankStatus
from notebook_accel.launch.views.text import format_duration
from notebook_accel.launch.worker.hub.hub_link import memory_moved
from notebook_accel.wire import (
    DebugEnd,
    Display,
    FailureRecord,
    FrameReader,
    InputAsk,
    Result,
    RunDone,
    Stack,
    StopCount,
)

_COLLECT_AFTER_FAILURE = 0.3  # seconds to gather other ranks' reports before stopping them
# (less when every rank still running has reported already)
_STACK_DUMP_WAIT = 0.5
_STACKS_SHOWN = 2  # distinct stacks a timeout's error shows (the rest are counted)
_WAKEUP_BUDGET = 0.0004  # seconds a wakeup spends on what is ready (one channel at least): a
# burst of every rank's lines is taken over several wakeups, back to back, the oldest first
_MOST_READY = 64  # channels one select takes from the kernel (more wait their turn, in order):
# what a wakeup pays for them is bounded too, even when thousands are ready at once
_RSS_BUDGET = 0.0001  # seconds a wakeup spends sampling memory (one rank at least; each rank
# at most once a second): a few system calls (a local rank's), or dozens of figures at hand
INTERRUPT_GRACE = 1.5  # seconds a persistent worker has to end its run after an interrupt
_LOOK_EVERY = 0.5  # seconds between two looks at the stacks of a run on some ranks of a pool


@dataclass
class Worker:
    """What the supervisor knows of one rank: its handle (any backend's), and what it reported."""

    handle: WorkerHandle
    result: bytes | None = None
    returned: bool = False  # it sent its Result
    error: FailureRecord | None = None  # the failure it reported
    exited: bool = False
    exit_time: float | None = None  # time.time() when the kernel saw it exit
    stopped: bool = False  # we stopped it (after another rank failed, a timeout, an interrupt)
    run_done: bool = False  # a persistent worker reported the end of its run
    stop_count: StopCount | None = None  # its answer when the stop button asked where it is
    stack: Stack | None = None  # its latest answer to a StackAsk of this run
    first_ask: int | None = None  # the number of this run's first StackAsk to it
    control: FrameReader = field(init=False)
    events: FrameReader = field(init=False)

    def __post_init__(self) -> None:
        self.control = self.handle.frames("control")
        self.events = self.handle.frames("events")

    @property
    def rank(self) -> int:
        return self.handle.rank

    def ask_stack(self, recorder: int = 0) -> bool:
        """Ask for its stack (and its last ``recorder`` collectives per group, without their
        lines: a fast read, the stack says where the rank waits): a pool's worker answers;
        False: it cannot."""
        ask = stack_ask(recorder, lines=False)
        if self.first_ask is None:
            self.first_ask = ask.ask
        return self.handle.command(ask)

    def answered(self, stack: Stack) -> bool:
        """Whether ``stack`` answers a request of this run (not one an earlier run left
        unread in the channel); if so, it is the latest known."""
        if self.first_ask is None or stack.ask < self.first_ask:
            return False
        self.stack = stack
        return True

    @property
    def finished(self) -> bool:
        """Its part of the run is over: it exited, or (a persistent worker) reported the end."""
        return self.exited or (self.handle.persistent and self.run_done)

    @property
    def succeeded(self) -> bool:
        if self.handle.persistent:
            return self.returned and self.run_done and not self.exited
        return self.exitcode == 0

    @property
    def interrupted(self) -> bool:
        """We stopped it and its only report is the KeyboardInterrupt we caused."""
        return self.stopped and (self.error is None or self.error.exc_type == "KeyboardInterrupt")

    @property
    def pid(self) -> int | None:
        return self.handle.pid

    @property
    def exitcode(self) -> int | None:
        return self.handle.exitcode


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    if code == 0:
        return "exited (code 0) before its function returned (os._exit() or a killed interpreter)"
    return f"exited with code {code} without reporting an error"


class Supervisor:
    """Runs the watch loop for one launch."""

    def __init__(
        self,
        handles: list[WorkerHandle],
        relay: OutputRelay,
        timeout: float | None,
        record: LaunchRecord,
        view: View,
        stop_wait: float = STOP_WAIT,
        collectives_before: dict[int, int | None] | None = None,
        hang_after: float | None = HANG_AFTER,
    ) -> None:
        self.workers = workers = [Worker(handle) for handle in handles]
        # a run on some ranks of a pool: each rank's default-group count before it (one more
        # is a collective the other ranks never join: the run is stopped)
        self.collectives_before = collectives_before
        self._looked = 0.0
        self.prompts = Prompts()  # the ranks' debugger prompts
        self.at_once: str | None = None  # why a stop cannot wait for a cut (stop at once)
        self.stop_wait = stop_wait  # a pool run's ranks have this long to reach the stop's cut
        self.stopped_at_once: str | None = None  # why the stop button could not use a cut
        self.relay = relay
        relay.watch({h.rank: h.prefix for h in handles})
        record.output = relay.logs  # every rank's lines: last_launch().logs(rank)
        self.timeout = timeout
        self.record = record
        self.view = view
        for w in workers:
            record.ranks[w.rank] = RankStatus(rank=w.rank, pid=w.pid, node=w.handle.node)
        self.by_rank = {w.rank: w for w in workers}
        self.selector = BoundedSelector()
        # events are read when the loop wakes anyway, not woken per event (a pipe holds ~10k);
        # a selector of their own tells which ranks have some, so a wakeup costs what is ready
        self.event_selector = BoundedSelector()
        self._inboxes: list = []  # the groups' inboxes (handles without descriptors)
        self.unfinished = {w.rank for w in workers}
        # what a wakeup's budget left ready, taken first by the next (before asking again)
        self._left: deque[tuple[int, str]] = deque()
        self._events_left: deque[int] = deque()  # the ranks whose events are left
        # memory: each rank sampled once a second, a few per wakeup (a warm pool's runs are
        # often far shorter than a second: its first samples wait that long); a rank whose
        # inbox tells when its figure moves (a cluster's: its hub's) is sampled once, then told
        first = time.monotonic() + 1.0 if any(h.persistent for h in handles) else 0.0
        self._samples: deque[tuple[float, int]] = deque((first, w.rank) for w in workers)
        self.dumps = StackDumps(relay)  # the stacks of ranks that cannot answer a StackAsk
        # (a function of the relay, not a method: no cycle keeps the workers' pipes open after)
        self.hangs = HangWatch(list(self.by_rank), hang_after, record,
                               functools.partial(_report, relay), self.dumps)
        self.first_failure: float | None = None
        self.timed_out_at: float | None = None  # time.time() when the timeout hit

    # -- reading -----------------------------------------------------------------------------

    def _register(self) -> None:
        for w in self.workers:
            inbox = w.handle.inbox
            if inbox is not None:  # one descriptor for the group's every channel
                if inbox not in self.selector:
                    self.selector.register(inbox, (None, "inbox"))
                    self._inboxes.append(inbox)
                continue
            self.selector.register(w.handle.stdout_fd, (w.rank, "stdout"))
            self.selector.register(w.handle.stderr_fd, (w.rank, "stderr"))
            self.selector.register(w.handle.control_fd, (w.rank, "control"))
            self.selector.register(w.handle.sentinel, (w.rank, "exit"))
            self.event_selector.register(w.handle.events_fd, w.rank)
        if self._inboxes:  # what came before this run (a pool's idle time) is read once
            self._drain()

    def _unregister(self, fd: int | None) -> None:
        with contextlib.suppress(KeyError):
            self.selector.unregister(fd)

    def _news(self, most: int | None = _MOST_READY) -> list[tuple[int, str]]:
        """The (rank, channel) pairs the inboxes have news of, at most ``most`` of each (a
        moved memory figure is taken in at once)."""
        news = []
        for inbox in self._inboxes:
            for rank, kind in inbox.take(self.by_rank, most):
                if kind == "memory":
                    self.record.ranks[rank].rss = self.by_rank[rank].handle.rss()
                else:
                    news.append((rank, kind))
        return news

    def _read_output(self, worker: Worker, name: str) -> None:
        while True:
            data = worker.handle.read_output(name)
            if data is None:
                return
            if not data:
                if worker.handle.inbox is None:
                    self._unregister(getattr(worker.handle, f"{name}_fd"))
                return
            self.relay.feed(worker.rank, name, data)
            self.hangs.moved(worker.rank)
            if len(data) < 1 << 16:
                return  # drained (what comes later wakes the loop again): one read, not two

    def _read_events(self, worker: Worker) -> None:
        messages, still_open = worker.events.read()
        if messages:
            self.hangs.moved(worker.rank)
        for message in messages:
            self.record.apply(worker.rank, message)
        if not still_open and worker.handle.inbox is None:
            with contextlib.suppress(KeyError):
                self.event_selector.unregister(worker.handle.events_fd)

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
            self._unregister(worker.handle.control_fd)

    def _on_exit(self, worker: Worker) -> None:
        self.prompts.end(worker.rank)
        worker.handle.reap(timeout=1)
        worker.exited, worker.exit_time = True, time.time()
        self.unfinished.discard(worker.rank)
        if worker.handle.inbox is None:
            self._unregister(worker.handle.sentinel)
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
        deadline = time.monotonic() + worker.handle.end_grace
        names = {worker.handle.stdout_fd: "stdout", worker.handle.stderr_fd: "stderr",
                 worker.handle.control_fd: "control"}
        with selectors.DefaultSelector() as ends:  # never select.select: fds may pass 1023
            for fd, name in names.items():
                if fd in self.selector:
                    ends.register(fd, selectors.EVENT_READ, name)
            while ends.get_map() and (left := deadline - time.monotonic()) > 0:
                for key, _ in ends.select(left):
                    if key.data == "control":
                        self._read_control(worker)
                    else:
                        self._read_output(worker, key.data)
                    if key.fd not in self.selector:
                        ends.unregister(key.fd)

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
            status.state = "finished"
        elif stopped:
            status.state = "stopped"
        else:
            status.state = "failed"
            self._failed()

    def _failed(self) -> None:
        if self.first_failure is None:
            self.first_failure = time.monotonic()

    def _drain(self) -> None:
        ended = [rank for rank, kind in self._news(None) if kind == "exit"]  # the rest: below
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
        """One wakeup, within ``_WAKEUP_BUDGET``: the record and the view brought up to date
        with what the last wakeups read, then what is ready (what the last wakeup left first,
        then output and events, control, ends) until the budget is spent (one channel at
        least; the rest is left to the next wakeup, which comes at once), then the cell. So a
        burst of every rank's lines is taken over several short wakeups, back to back."""
        order = {"stdout": 0, "stderr": 0, "events": 0, "control": 1, "exit": 2}
        # what the last wakeup left is taken before a pipe is asked again
        fresh = [] if self._left else self.selector.select(timeout, _MOST_READY)
        if self._inboxes and any(rank is None for rank, _ in fresh):  # an inbox has news
            fresh = [item for item in fresh if item[0] is not None] + self._news()
        deadline = time.perf_counter() + _WAKEUP_BUDGET
        self._refresh()
        self._read_ready_events(deadline)
        ready = self._left  # (an item twice, left and news again, finds nothing the second time)
        ready.extend(sorted(fresh, key=lambda item: order[item[1]]))
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
        """Read the ranks' events that are ready (those the last wakeup left first) until
        ``deadline`` (a ``time.perf_counter()``; one rank's at least). A cluster's come through
        its inbox, with the other channels."""
        if not self.event_selector:
            return
        left = self._events_left
        if not left:
            left.extend(self.event_selector.select(0, _MOST_READY))
        taken = 0
        while left and not (taken and time.perf_counter() > deadline):
            self._read_events(self.by_rank[left.popleft()])
            taken += 1

    def _wait_for(self) -> float:
        """How long the loop may wait: 0.1 s, less when gathered output is due in the cell, not
        at all when the last wakeup's budget left something ready."""
        if self._left or self._events_left:
            return 0.0
        if getattr(self.view, "holds_output", False):
            return 0.1
        return min(0.1, self.relay.due_in(FLUSH_EVERY))

    def _refresh(self) -> None:
        """Bring the record up to date (the ranks' last lines, memory) and redraw; costs what
        changed since the last wakeup, not the number of ranks."""
        self._take_last_lines()
        now, samples = time.monotonic(), self._samples
        deadline = time.perf_counter() + _RSS_BUDGET
        while samples and samples[0][0] <= now:
            rank = samples.popleft()[1]
            worker = self.by_rank[rank]
            if not worker.exited:
                status, rss = self.record.ranks[rank], worker.handle.rss()
                if memory_moved(status.rss, rss):
                    status.rss = rss
                if not worker.handle.rss_told:
                    samples.append((now + 1.0, rank))
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
            if status.state == "starting" and not w.finished:
                status.state = "running"
        start = time.monotonic()
        try:
            while self.unfinished:
                now = time.monotonic()
                if self.first_failure is not None and (
                        now - self.first_failure >= _COLLECT_AFTER_FAILURE or self._all_reported()):
                    break
                if self.timeout is not None and now - start >= self.timeout:
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
            raise LaunchInterrupted(self._interrupted_line()) from None
        if self.first_failure is not None or not all(w.succeeded for w in self.workers):
            self._stop()
            self._finish()
            raise self._root_cause()
        self._finish()

    def _all_reported(self) -> bool:
        """Every rank still running has sent its failure (it is ending): no report is left to
        gather before the rest are stopped. (A rank that returned is left to end by itself.)"""
        return all(self.by_rank[rank].error is not None for rank in self.unfinished)

    def _interrupted_line(self) -> str:
        if not any(w.handle.persistent for w in self.workers):
            return f"stopped {len(self.workers)} workers"
        killed = [w.rank for w in self.workers if w.exited]
        at_once = f" ({self.stopped_at_once}, so every rank was stopped at once)" \
            if self.stopped_at_once else ""
        if not killed:
            where = "" if self.stopped_at_once else " at the same point"
            return (f"interrupted the run on {len(self.workers)} ranks{where}{at_once}; "
                    "the pool keeps its state")
        # why they had to be ended, and what it did then (healed, or replaced every rank), the
        # pool says once, above
        were = "was" if len(killed) == 1 else "were"
        return (f"interrupted the run{at_once}; {ranks_text(killed)} {were} ended; what the "
                "pool did then is said above")

    def _stop(self) -> None:
        """Stop every worker still running (marked stopped), relaying their output meanwhile."""
        if any(w.handle.persistent for w in self.workers):
            self._interrupt()
            return
        for w in self.workers:
            if not w.exited and w.exitcode is None:  # (a lost rank has exited, with no code)
                w.stopped = True
        stop_workers([w.handle for w in self.workers], on_wait=self._drain)

    def _interrupt(self) -> None:
        """End the run of every persistent worker still in it: at a point they agree on
        (``stop_agreement``), else at once (a KeyboardInterrupt; at once too when the hang
        watch already saw that no such point can be reached), killing those that do not
        report within ``INTERRUPT_GRACE`` (blocked in C++ code)."""
        live = [w for w in self.workers if not w.finished]
        for w in live:
            w.stopped = True
        self.stopped_at_once = (self.at_once or self.hangs.cut_unreachable(live)
                                or agree_and_stop(live, self._poll, self.stop_wait))
        if self.stopped_at_once is None:
            return
        live = [w for w in live if not w.finished]
        stop_now(live)
        deadline = time.monotonic() + INTERRUPT_GRACE
        while any(not w.finished for w in live) and time.monotonic() < deadline:
            self._poll(0.05)
        stuck = [w for w in live if not w.finished]
        signal_all([w.handle for w in stuck], "kill")
        for w in stuck:
            w.handle.reap(timeout=5.0)
        take_interrupt()  # more presses meanwhile asked for what was just done

    def _show_output(self, worker: Worker) -> None:
        """Everything ``worker`` wrote so far, in the cell now (before its debugger's prompt)."""
        self._debugger_shown()
        self._read_output(worker, "stdout")
        self._read_output(worker, "stderr")
        self.relay.tick()
        self.relay.flush()

    def _look_at_stacks(self) -> None:
        """On a run on some ranks of a pool, ask the ranks where they are every ``_LOOK_EVERY``
        seconds (their answers go to :meth:`_check_collective`)."""
        if not self.collectives_before or time.monotonic() - self._looked < _LOOK_EVERY:
            return
        self._looked = time.monotonic()
        for w in self.workers:
            if not w.finished:
                w.ask_stack()

    def _check_collective(self, worker: Worker, stack: Stack) -> None:
        """A rank of a run on some ranks entered a collective of the whole group, which the
        other ranks never join: it fails (the cause named) and the run stops at once."""
        before = (self.collectives_before or {}).get(worker.rank)
        if (before is None or stack.collectives is None or stack.collectives <= before
                or worker.error is not None or worker.finished):
            return
        here = {w.rank for w in self.workers}
        others = [r for r in range(self.record.world_size) if r not in here]
        frames = users_part(stack.frames)
        worker.error = FailureRecord(
            rank=worker.rank, pid=worker.pid, exitcode=None, exc_type=None,
            headline=(f"entered a collective of the whole process group ({headline(frames)}), "
                      f"which {ranks_text(others)} never {'joins' if len(others) == 1 else 'join'} "
                      f"in a run on {ranks_text(here)}; "
                      "it was stopped (run collectives in a cell on every rank)"),
            traceback=stacks_text({worker.rank: stack.frames}), timestamp=time.time())
        self.at_once = "a rank waits in a collective the other ranks never join"
        self._failed()

    def _finish(self) -> None:
        if self.dumps.taking:  # the job ended while the ranks' stacks were being dumped
            self.dumps.take()
        for w in self.workers:  # ended meanwhile (with an exit status, or a lost node's rank)
            if not w.exited and (w.exitcode is not None or w.handle.describe_end() is not None):
                self._on_exit(w)
        self._drain()
        for w in self.workers:
            self.relay.finish(w.rank)
        self._flush()
        self.selector.close()
        self.event_selector.close()

    # -- verdicts ------------------------------------------------------------------------------

    def _timed_out(self) -> WorkerError:
        self.timed_out_at = time.time()
        elapsed = self.timed_out_at - self.record.started  # the figure the live view shows
        running = [w for w in self.workers if not w.finished]
        marks = {w.rank: self.relay.line_count(w.rank) for w in running}
        for w in running:
            self.relay.hold(w.rank)  # the dump is shown once, in the error, cleaned up
        signal_all([w.handle for w in running], "dump_stacks")  # once per node on a cluster
        deadline = time.monotonic() + _STACK_DUMP_WAIT
        while time.monotonic() < deadline:
            self._poll(0.05)
        self._stop()
        self._finish()
        first = running[0] if running else self.workers[0]
        stacks: dict[str, list[int]] = {}
        for w in running:
            stack = main_thread_stack(self.relay.tail(w.rank, since=marks[w.rank]))
            stacks.setdefault(stack, []).append(w.rank)
        message = (f"timed out after {format_duration(elapsed)} (timeout={self.timeout:g} s): "
                   f"{ranks_text(w.rank for w in running)} stopped while still running")
        groups = sorted(stacks.items(), key=lambda item: -len(item[1]))
        texts = [f"{ranks_text(group)} {'was' if len(group) == 1 else 'were'} here when stopped:\n"
                 f"{stack}" for stack, group in groups]
        where = "\n\n".join(texts)  # every stack: kept on the error's failure record
        shown = "\n\n".join(texts[:_STACKS_SHOWN])
        if len(groups) > _STACKS_SHOWN:
            rest = [rank for _, group in groups[_STACKS_SHOWN:] for rank in group]
            shown += (f"\n\n{ranks_text(rest)}: {len(groups) - _STACKS_SHOWN} other stacks "
                      "(all in .failure.traceback)")
        failure = FailureRecord(rank=first.rank, pid=first.pid, exitcode=None,
                                exc_type=None, headline=message, traceback=where,
                                timestamp=self.timed_out_at)
        return WorkerError(message, rank=first.rank, remote_traceback=shown, failure=failure)

    def _root_cause(self) -> WorkerError:
        candidates = []
        for w in self.workers:
            if w.error is not None and not w.interrupted:
                tier = 2 if w.error.secondary else 0
                candidates.append((tier, w.error.timestamp, w))
            elif (w.exited and not (w.stopped and w.handle.describe_end() is None)
                  and not (w.returned and w.exitcode == 0)):  # (a lost node's rank, even stopped)
                candidates.append((1, w.exit_time, w))
        if not candidates:  # a rank marked failed for exiting (code 0) before its result arrived
            failed = [w for w in self.workers if self.record.ranks[w.rank].state == "failed"]
            candidates = [(3, 0.0, w) for w in failed or self.workers]
        candidates.sort(key=lambda c: (c[0], c[1] or 0.0, c[2].rank))
        cause = candidates[0][2]
        self.record.root_cause = cause.rank
        failure = self._failure(cause)
        others = [self._failure(w) for _, _, w in candidates[1:]]
        others += [self._failure(w, headline="stopped") for w in self.workers
                   if w.interrupted and w is not cause and w.handle.describe_end() is None]
        headline = f"failed: {failure.headline}" if cause.error is not None else failure.headline
        return WorkerError(
            f"{cause.handle.label} {headline}", rank=cause.rank, exitcode=cause.exitcode,
            remote_traceback=failure.traceback, other_failures=others, failure=failure,
        )

    def _failure(self, worker: Worker, headline: str | None = None) -> FailureRecord:
        """How ``worker`` failed: the record it sent (with the exit code seen here), else one
        made here from its exit (its traceback: the last lines of its stderr)."""
        if worker.error is not None and headline is None:
            if worker.exitcode is None:
                return worker.error
            return dataclasses.replace(worker.error, exitcode=worker.exitcode)
        if headline and worker.handle.persistent and worker.exited:
            headline = (f"{ENDED_BY_US}, as it did not answer the interrupt within "
                        f"{INTERRUPT_GRACE:g} s (blocked in C++ code, e.g. a collective)")
        return FailureRecord(
            rank=worker.rank, pid=worker.pid, exitcode=worker.exitcode, exc_type=None,
            headline=headline or worker.handle.describe_end() or _describe_exit(worker.exitcode),
            traceback="" if headline else death_text(self.relay.tail(worker.rank, limit=1000).splitlines()),
            timestamp=worker.exit_time or time.time(),
        )


ENDED_BY_US = "stopped: killed"  # the headline of a rank the stop had to end (not an outside kill)


def _report(relay: OutputRelay, text: str) -> None:
    """A note of ours in the cell, below the output gathered so far."""
    relay.flush()
    print(f"[notebook_accel] {text}", file=sys.stderr, flush=True)
