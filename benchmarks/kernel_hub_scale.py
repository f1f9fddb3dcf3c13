"""The kernel side at scale: what 8 to 1024 ranks cost the one kernel, against a baseline revision.

Fake ranks speak the real wire over real pipes (stdout, stderr, control, events, and an exit
pipe as the sentinel), driven through the real kernel side (``Supervisor``, ``OutputRelay``,
``LaunchRecord``, the notebook's ``LiveView`` with a display that only counts); no torch. To keep
1024 ranks feasible on 2 cores, a few driver processes (``--drivers``, default 4) each
multiplex a quarter of the ranks: one loop writes each of its ranks' lines, events and results
to that rank's own pipes, and obeys the kernel's signals (terminate, kill, stack dump) sent on
a command pipe. Every rank prints ``epoch K done`` once a second (the same line on every rank)
and a 580-byte line of its own (``rank R metrics xxx...``), and sends a progress event twice
a second. Three runs per size:
- success: 4 s of lines, then every rank returns;
- failure: at 2 s rank N/2 raises, and every other rank then fails with a broken-collective
  error (as gloo's peers do), so the error has N failures to report;
- hang: the ranks go silent after 1.5 s; ``timeout=`` 8 s after their start stops them with
  their stacks. Its wakeups from 3 s to 0.3 s before the timeout (its stack dumps) are the quiet
  phase (nothing arrives: no line, event or end; the hubs' beats only), reported on their own:
  what waiting costs the kernel, apart from the once-per-launch steps and the bursts of every
  rank's lines that an idle wakeup of the other runs (one that read no channel and took in no
  event) may still carry (output paced to the cell, a redraw).
Also a warm pool's cells (``pool``): ``CELLS`` cells of the real pool backend through
``launch_once``, each payload with a 256 kB argument. In local mode each fake rank also has a
commands pipe, as a local pool's worker has: the real ``PoolWorkers.send_runs`` writes each rank
its own ``Run``, so the payload goes once per rank, by design (bytes, not a tensor: no shared
memory), and the drivers serve the runs as ``serve.py`` does (a line, the result, rank 0's
value, then ``RunDone``). Reported: the cells' latency, how many times the payload went per
cell, and the commands bytes a rank got per cell (its own tally, once the pool closes).
Also the connect-back: ``ChannelServer.accept`` of N ranks x 5 channels over loopback TCP, with
the cluster backend's own ``_collect`` as its check (over a stand-in for ``ray.wait``/``ray.get``
that scans its refs as Ray's does).

``--modes cluster`` runs the same through the real hub code without Ray, on simulated nodes of 8
(``simulated_nodes.py``: host processes, by default one per node as on a cluster (``--hosts``:
fewer, each playing several nodes, put several hubs' threads under one GIL, whose hand-offs
then add to every figure), each running the real ``HubPump`` per node over one link
to the kernel's ``ChannelServer``, every rank a process of its own on the wire; the kernel's real
``NodeLinks``, ``HubHandle`` and supervisor), plus a fourth run: a lost node (its host and ranks
frozen with SIGSTOP at 2 s), and the warm pool's cells, whose payload the pool hands the node
links, which send it once per node in a ``RUN`` frame: the RUN frames and bytes each node got
per cell. Its connect time is every node's link, from the word to link. Its baseline must have
the hubs (22dcecd or later).

For each side (this checkout, and BASELINE in a throwaway git worktree) and size, in its own
process, alternating: kernel CPU, the work of one wakeup of the wait loop (p50/p99, after
``select`` returned: the thread's CPU time, and wall time, which on 2 shared cores includes
being descheduled), line latency rank -> cell (p50/p99), bytes and writes per second
into the cell (the peak 1-s window; each write is one IOPub stream message or fewer), the
kernel's peak fds and threads, time to connect every rank, failure -> WorkerError, the
WorkerError's lines, and the live view's bytes per redraw.

    python benchmarks/kernel_hub_scale.py [--baseline 70fe29e] [--sizes 8,32,128,512,1024]
        [--modes local,cluster]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import pickle
import resource
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from revision_sides import ROOT, baseline_worktree, run_side

COMMAND = struct.Struct("!Ic")  # rank, what: T(erminate) K(ill) D(ump stacks)
STACK = ("Thread 0x00007f0000000001 (most recent call first):\n"
         '  File "/tmp/train.py", line 12 in wait_forever\n'
         '  File "/tmp/train.py", line 20 in job\n')


# -- the ranks' side: a driver process multiplexing many fake ranks ---------------------------

def _drive(ranks: dict[int, dict[str, int]], command_r: int, scenario: str, world: int,
           start: float) -> None:
    """One driver: every rank's lines, events, result or failure, on that rank's own fds."""
    from notebook_accel.wire import FailureRecord, Progress, Result, send

    alive = dict(ranks)
    os.set_blocking(command_r, False)
    buffer = bytearray()

    def fail(rank: int, headline: str, secondary: bool) -> None:
        fds = alive[rank]
        trace = ("Traceback (most recent call last):\n  File \"/tmp/train.py\", line 20, in job\n"
                 "    step()\n  File \"/tmp/train.py\", line 9, in step\n"
                 f"    raise RuntimeError(...)\n{headline}\n")
        send(fds["control"], FailureRecord(rank=rank, pid=os.getpid(), exitcode=1,
                                           exc_type=headline.split(":")[0], headline=headline,
                                           traceback=trace, secondary=secondary,
                                           timestamp=time.time()))
        _end(alive, rank, 1)

    step, failing = 0, world // 2
    while alive:
        now = time.time()
        due = start + step
        if now >= due and (scenario != "hang" or step <= 1):
            for rank, fds in list(alive.items()):
                os.write(fds["stdout"], f"epoch {step} done\n".encode()
                         + f"rank {rank} metrics {'x' * 560}\n".encode())
            step += 1
            if scenario == "success" and step > 4:
                for rank, fds in list(alive.items()):
                    send(fds["control"], Result(pickle.dumps(rank) if rank == 0 else None))
                    _end(alive, rank, 0)
            if scenario == "failure" and step == 3:
                if failing in alive:
                    fail(failing, "RuntimeError: boom", secondary=False)
                time.sleep(0.05)
                for rank in list(alive):
                    fail(rank, f"DistBackendError: connection reset by rank {failing}",
                         secondary=True)
        if step and scenario != "hang" and int(now * 2) != int((now - 0.01) * 2):
            for fds in alive.values():
                body = Progress({"id": 1, "n": step, "total": 5, "desc": "train"})
                try:
                    os.write(fds["events"], _frame(body))
                except BlockingIOError:
                    pass
        _obey(command_r, buffer, alive)
        time.sleep(0.01)


def _end(alive: dict[int, dict[str, int]], rank: int, code: int) -> None:
    """Rank ``rank`` of a driver ends with ``code``: its output pipes close, then its exit pipe
    says the code (a pool rank's commands pipe stays open: the driver still reads it)."""
    fds = alive.pop(rank, None)
    if fds is None:
        return
    for name in ("stdout", "stderr", "control", "events"):
        os.close(fds[name])
    os.write(fds["exit"], struct.pack("b", code))
    os.close(fds["exit"])


def _obey(command_r: int, buffer: bytearray, alive: dict[int, dict[str, int]]) -> None:
    """The kernel's signals to a driver's ranks, from its command pipe (non-blocking): a stack
    dump on stderr, or the end (terminate, kill)."""
    try:
        buffer += os.read(command_r, 65536)
    except BlockingIOError:
        pass
    while len(buffer) >= COMMAND.size:
        rank, what = COMMAND.unpack_from(buffer)
        del buffer[:COMMAND.size]
        if rank in alive and what == b"D":
            os.write(alive[rank]["stderr"], STACK.encode())
        elif rank in alive:
            _end(alive, rank, -signal.SIGTERM if what == b"T" else -signal.SIGKILL)


TALLY = "served {} runs: {} bytes of commands, {} of payloads"  # a pool rank's last line


def _serve_ranks(ranks: dict[int, dict[str, int]], command_r: int) -> None:
    """One driver's ranks as a local pool's workers (``pool``): each ``Run`` on a rank's commands
    pipe is a cell that prints a line and answers as ``serve.py`` does (its result, a value if
    asked, then ``RunDone``); a rank leaves when its commands pipe closes, its last line the
    ``TALLY`` of what that pipe brought it."""
    from notebook_accel.wire import HEADER, Result, Run, RunDone, decode, send

    alive = dict(ranks)
    os.set_blocking(command_r, False)
    signals = bytearray()
    tally = {rank: [0, 0, 0, bytearray()] for rank in ranks}  # runs, bytes, payload bytes, unread
    selector = selectors.DefaultSelector()
    selector.register(command_r, selectors.EVENT_READ, None)
    for rank, fds in ranks.items():
        selector.register(fds["commands"], selectors.EVENT_READ, rank)
    while alive:
        for key, _ in selector.select():
            rank = key.data
            if rank is None:
                _obey(command_r, signals, alive)
                continue
            data = os.read(key.fd, 1 << 16)
            counts = tally[rank]
            if not data:  # the pool closes
                selector.unregister(key.fd)
                if rank in alive:
                    os.write(alive[rank]["stdout"], (TALLY.format(*counts[:3]) + "\n").encode())
                    _end(alive, rank, 0)
                continue
            counts[1] += len(data)
            unread = counts[3]
            unread += data
            while len(unread) >= HEADER.size:
                size = HEADER.size + HEADER.unpack_from(unread)[0]
                if len(unread) < size:
                    break
                message = decode(bytes(unread[:size]))
                del unread[:size]
                if type(message) is Run and rank in alive:
                    counts[0] += 1
                    counts[2] += len(message.payload)
                    fds = alive[rank]
                    os.write(fds["stdout"], f"cell {counts[0]} done\n".encode())
                    send(fds["control"], Result(pickle.dumps(rank) if message.send_result else None),
                         RunDone(collectives=None, broke_group=False))


def _frame(message) -> bytes:
    from notebook_accel import wire

    return wire.encode(message)


# -- the kernel's side ----------------------------------------------------------------------

def _handle_class():
    from notebook_accel.launch.backends.base import WorkerHandle

    class FakeHandle(WorkerHandle):
        """A rank of a driver: the kernel's ends of its pipes; signals go to its driver."""

        def __init__(self, rank: int, fds: dict[str, int], command_w: int, driver: int,
                     node: int) -> None:
            self.rank, self._fds, self._command, self._driver = rank, fds, command_w, driver
            self.node = node
            self.commands_fd = fds.pop("commands", None)  # a pool worker's (``pool``)
            self.persistent = self.commands_fd is not None
            self.stdout_fd, self.stderr_fd = fds["stdout"], fds["stderr"]
            self.control_fd, self.events_fd = fds["control"], fds["events"]
            self._code: int | None = None

        pid = property(lambda self: self._driver)
        sentinel = property(lambda self: self._fds["exit"])

        @property
        def exitcode(self):
            if self._code is None:
                try:
                    data = os.read(self._fds["exit"], 1)
                except BlockingIOError:
                    return None
                self._code = struct.unpack("b", data)[0] if data else -9
            return self._code

        def _send(self, what: bytes) -> None:
            try:
                os.write(self._command, COMMAND.pack(self.rank, what))
            except OSError:
                pass

        def terminate(self):
            self._send(b"T")

        def kill(self):
            self._send(b"K")

        def dump_stacks(self):
            self._send(b"D")

        def reap(self, timeout):
            deadline = time.monotonic() + timeout
            while self.exitcode is None and time.monotonic() < deadline:
                time.sleep(0.005)

        def rss(self):
            try:
                with open(f"/proc/{self._driver}/statm") as f:
                    return int(f.read().split()[1]) * 4096
            except OSError:
                return None

        def close(self):
            for fd in self._fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass

    return FakeHandle


class _Cell:
    """The cell's stream: counts writes and bytes per second, and when each epoch line came. A
    write only keeps the text and its time, as a kernel's stream only buffers it (the lines are
    read after the run: reading them is not the kernel's work)."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.written: list[tuple[float, str]] = []

    def write(self, text: str) -> None:
        self.written.append((time.time(), text))

    @property
    def writes(self) -> list[tuple[float, int]]:
        return [(at, len(text.encode())) for at, text in self.written]

    @property
    def latencies(self) -> list[float]:
        return [at - (self.start + int(line.rsplit(" ", 2)[1])) for at, text in self.written
                for line in text.splitlines() if "] epoch " in line and line.endswith(" done")]

    def flush(self) -> None:
        pass


def _peak_per_second(writes: list[tuple[float, int]]) -> tuple[float, float]:
    """The largest bytes and writes in any 1-s window."""
    best_bytes = best_writes = 0
    left, total = 0, 0
    for right, (when, size) in enumerate(writes):
        total += size
        while writes[left][0] < when - 1.0:
            total -= writes[left][1]
            left += 1
        best_bytes, best_writes = max(best_bytes, total), max(best_writes, right - left + 1)
    return best_bytes, best_writes


def _local_ranks(world: int, scenario: str, drivers: int, start: float):
    """Driver processes for ``world`` fake ranks on the kernel's own pipes (and in ``pool``, a
    commands pipe each, as a local pool's worker has); returns (handles, the cleanup)."""
    FakeHandle = _handle_class()
    kernel_ends, rank_ends = {}, {}
    for rank in range(world):
        kernel_ends[rank], rank_ends[rank] = {}, {}
        for name in ("stdout", "stderr", "control", "events", "exit"):
            r, w = os.pipe()
            os.set_blocking(r, False)
            kernel_ends[rank][name], rank_ends[rank][name] = r, w
        if scenario == "pool":  # the other way: the kernel writes (blocking, as the pool's own)
            rank_ends[rank]["commands"], kernel_ends[rank]["commands"] = os.pipe()
    commands = [os.pipe() for _ in range(drivers)]
    pids = []
    for d in range(drivers):
        pid = os.fork()
        if pid == 0:
            try:
                mine = {rank: rank_ends[rank] for rank in range(d, world, drivers)}
                keep = {fd for fds in mine.values() for fd in fds.values()} | {commands[d][0]}
                for fd in [*(fd for fds in kernel_ends.values() for fd in fds.values()),
                           *(fd for fds in rank_ends.values() for fd in fds.values()),
                           *(fd for pair in commands for fd in pair)]:
                    if fd not in keep:
                        os.close(fd)
                if scenario == "pool":
                    _serve_ranks(mine, commands[d][0])
                else:
                    _drive(mine, commands[d][0], scenario, world, start)
            finally:
                os._exit(0)
        pids.append(pid)
    for fds in rank_ends.values():
        for fd in fds.values():
            os.close(fd)
    for r, _ in commands:
        os.close(r)
    handles = [FakeHandle(rank, kernel_ends[rank], commands[rank % drivers][1],
                          pids[rank % drivers], node=rank // 8) for rank in range(world)]

    def cleanup() -> None:
        for pid in pids:
            os.waitpid(pid, 0)
        for handle in handles:
            handle.close()
        for _, w in commands:
            os.close(w)

    return handles, cleanup


def _cluster_ranks(world: int, scenario: str, hosts: int):
    """Simulated nodes of 8 through the real hub code (``simulated_nodes.py``); returns (handles,
    the cleanup, seconds to link every node, the host processes, the ranks' start time)."""
    import simulated_nodes

    handles, links, procs, took, start = simulated_nodes.link_up(world, scenario, hosts)

    def cleanup() -> None:
        links.close()
        deadline = time.monotonic() + 5
        while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        simulated_nodes.end_hosts(procs)

    return handles, cleanup, took, procs, start


def _is_socket(fd: str) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    except OSError:
        return False


def _ended(handle) -> bool:
    return handle.exitcode is not None or handle.describe_end() is not None


QUIET_AFTER = 3.0  # s after the ranks' start: a hang's ranks are silent from 1.5 s (lines, events)


def run_scenario(world: int, scenario: str, drivers: int, mode: str = "local") -> dict:
    from magics.view.live_view import LiveView
    from notebook_accel.launch.supervision.errors import WorkerError
    from notebook_accel.launch.supervision.supervisor import Supervisor
    from notebook_accel.launch.views.output import OutputRelay
    from notebook_accel.launch.views.record import LaunchRecord

    connect = frozen_at = None
    if mode == "local":
        start = time.time() + 0.5
        handles, cleanup = _local_ranks(world, scenario, drivers, start)
    else:
        handles, cleanup, connect, procs, start = _cluster_ranks(world, scenario, drivers)
        if scenario == "lost":
            def freeze() -> None:
                nonlocal frozen_at
                time.sleep(max(0.0, start + 2.0 - time.time()))
                import simulated_nodes

                frozen_at = time.monotonic()
                simulated_nodes.freeze(procs[-1])  # the last node's host: alone

            threading.Thread(target=freeze, daemon=True).start()
    out, err = _Cell(start), _Cell(start)
    relay = OutputRelay(show="all", stdout=out, stderr=err)
    record = LaunchRecord(world_size=world, num_processes=world, device_type="cpu",
                          start_method="fork", mixed_precision="no")
    redraws: list[int] = []

    class Shown:
        def update(self, bundle, raw=True):
            redraws.append(sum(len(v.encode()) for v in bundle.values()))

    def display(bundle):
        Shown().update(bundle)
        return Shown()

    view = LiveView(record, display=display, appear_after=0.5)
    # hang: 8 s after the ranks' start (linking 1024 ranks' nodes takes a few), 6.5 s of silence
    timeout = {"hang": round(8.0 + max(0.0, start - time.time())), "lost": 12.0}.get(scenario)
    supervisor = Supervisor(handles, relay, timeout, record, view)
    works, cpus, peaks = [], [], {"fds": 0, "threads": 0, "sockets": 0, "at": 0.0}
    stamps: list[float] = []  # when each wakeup ended (the quiet phase's are picked by these)
    ready: list[int] = []  # the channels each wakeup read (output, control, an end; each event)
    wakeup = {"waited": 0.0, "work": 0}  # this wakeup's: time in select, channels read
    select = supervisor.selector.select
    poll = supervisor._poll

    def timed_select(*args):
        began = time.perf_counter()
        try:
            return select(*args)
        finally:
            wakeup["waited"] += time.perf_counter() - began

    def timed_poll(timeout):
        wakeup.update(waited=0.0, work=0)
        began, cpu_began = time.perf_counter(), time.thread_time()
        poll(timeout)
        works.append(time.perf_counter() - began - wakeup["waited"])
        cpus.append(time.thread_time() - cpu_began)  # waiting in select takes no CPU
        ready.append(wakeup["work"])
        stamps.append(time.time())
        if time.monotonic() - peaks["at"] >= 0.25:  # (by time: a count of wakeups would make
            peaks["at"] = time.monotonic()  # a side with more of them pay more for the figure)
            fds = os.listdir("/proc/self/fd")
            peaks["fds"] = max(peaks["fds"], len(fds))
            peaks["sockets"] = max(peaks["sockets"], sum(_is_socket(fd) for fd in fds))
            peaks["threads"] = max(peaks["threads"], threading.active_count())

    def counted(method):  # a channel read (or an event taken in): a wakeup with work
        def call(*args, **kwargs):
            wakeup["work"] += 1
            return method(*args, **kwargs)
        return call

    supervisor.selector.select, supervisor._poll = timed_select, timed_poll
    for name in ("_read_output", "_read_control", "_on_exit"):
        setattr(supervisor, name, counted(getattr(supervisor, name)))
    record.apply = counted(record.apply)
    reported: list[float] = []  # when the first failure report reached the kernel
    failed = supervisor._failed

    def noted_failure() -> None:
        if supervisor.first_failure is None:
            reported.append(time.time())
        failed()

    supervisor._failed = noted_failure
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    error_lines = error_after = ended_after = lost_after = error_head = None
    report_after = kernel_part = None
    watched = time.time()
    try:
        supervisor.run()
    except WorkerError as error:
        raised = time.time()
        error_lines = len(str(error).splitlines())
        error_head = str(error).splitlines()[0][:160]
        if scenario == "failure":
            error_after = raised - error.failure.timestamp
            if reported:
                report_after, kernel_part = reported[0] - error.failure.timestamp, raised - reported[0]
            deadline = time.monotonic() + 10
            while not all(_ended(h) for h in handles) and time.monotonic() < deadline:
                time.sleep(0.005)
            ended_after = time.time() - error.failure.timestamp
        if scenario == "lost" and frozen_at is not None:
            lost_after = time.monotonic() - frozen_at
    used = resource.getrusage(resource.RUSAGE_SELF)
    quiet = sorted(cpu for cpu, at in zip(cpus, stamps, strict=False)  # before the timeout's dumps
                   if start + QUIET_AFTER <= at <= watched + timeout - 0.3) if scenario == "hang" else []
    cleanup()
    writes = sorted(out.writes + err.writes)
    peak_bytes, peak_writes = _peak_per_second(writes)
    latencies = sorted(out.latencies) or [float("nan")]
    idle = sorted(cpu for cpu, count in zip(cpus, ready, strict=False) if not count)
    busy = [(cpu, count) for cpu, count in zip(cpus, ready, strict=False) if count]
    works.sort()
    cpus.sort()
    return {
        "cpu_s": (used.ru_utime + used.ru_stime) - (cpu.ru_utime + cpu.ru_stime),
        "wakeups": len(works),
        "wakeup_p50_ms": works[len(works) // 2] * 1e3 if works else None,
        "wakeup_p99_ms": works[int(len(works) * 0.99)] * 1e3 if works else None,
        "wakeup_cpu_p50_ms": cpus[len(cpus) // 2] * 1e3 if cpus else None,
        "wakeup_cpu_p99_ms": cpus[int(len(cpus) * 0.99)] * 1e3 if cpus else None,
        "idle_wakeup_cpu_p50_ms": idle[len(idle) // 2] * 1e3 if idle else None,
        "idle_wakeup_cpu_p99_ms": idle[int(len(idle) * 0.99)] * 1e3 if idle else None,
        "quiet_wakeups": len(quiet) or None,
        "quiet_wakeup_cpu_p50_ms": quiet[len(quiet) // 2] * 1e3 if quiet else None,
        "quiet_wakeup_cpu_p99_ms": quiet[int(len(quiet) * 0.99)] * 1e3 if quiet else None,
        "cpu_us_per_ready_channel": (sum(c for c, _ in busy) / sum(n for _, n in busy) * 1e6
                                     if busy else None),
        "latency_p50_s": latencies[len(latencies) // 2],
        "latency_p99_s": latencies[int(len(latencies) * 0.99)],
        "cell_peak_bytes_per_s": peak_bytes, "cell_peak_writes_per_s": peak_writes,
        "cell_bytes": sum(size for _, size in writes),
        "fds": peaks["fds"], "threads": peaks["threads"], "sockets": peaks["sockets"],
        "error_lines": error_lines, "error_after_s": error_after, "error_head": error_head,
        "ended_after_s": ended_after, "lost_after_s": lost_after,
        "report_after_s": report_after, "kernel_part_s": kernel_part, "connect_s": connect,
        "view_bytes_per_redraw": max(redraws, default=0),
    }


CELLS = 10  # the pool scenario's cells
CELL_ARGUMENT = 256 * 1024  # bytes each cell's payload carries (its argument)


def _pool_workers(cls: type, handles: list, **options):
    """A pool-workers object of ``cls`` (its ``send_runs`` the real one) around ``handles``,
    with the plan of ``options``, without starting anything."""
    from notebook_accel.launch.launcher import plan_launch
    from notebook_accel.launch.planning.request import LaunchRequest

    workers = cls.__new__(cls)
    workers.plan = plan_launch(LaunchRequest.from_keywords("notebook_launcher", options), [])
    workers.handles, workers.sources_sent, workers.closed = handles, set(), False
    return workers


def _pool_cells(workers) -> dict:
    """``CELLS`` cells of the real pool backend through ``launch_once`` on ``workers``, each
    payload with a ``CELL_ARGUMENT``-byte argument: the cells' latency, the payload's size."""
    import io

    from notebook_accel.launch.backends.pool import PoolBackend
    from notebook_accel.launch.handoff.payload import serialise_payload
    from notebook_accel.launch.launcher import launch_once

    cells = []
    for _ in range(CELLS):
        payload = serialise_payload(len, (b"x" * CELL_ARGUMENT,), {})
        began = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            launch_once(PoolBackend(workers), workers.plan, payload)
        cells.append(time.perf_counter() - began)
    cells.sort()
    return {"cell_p50_s": cells[len(cells) // 2], "cell_max_s": cells[-1],
            "payload_bytes": len(payload)}


def run_pool(world: int, hosts: int) -> dict:
    """A warm pool on simulated nodes: ``_pool_cells`` through a ``ClusterPoolWorkers`` (its
    payload handed to the node links once); the RUN frames and bytes the kernel sent each node."""
    import simulated_nodes

    from notebook_accel.launch.backends.cluster import ClusterPoolWorkers
    from notebook_accel.launch.worker.hub.hub_link import Frame

    handles, links, procs, _, start = simulated_nodes.link_up(world, "pool", hosts)
    nodes = world // simulated_nodes.PER_NODE
    runs, sent = [0] * nodes, [0] * nodes
    send = links.send

    def counted(node: int, *parts: bytes) -> bool:  # (one part, or a frame's parts)
        runs[node] += parts[0][0] == Frame.RUN
        sent[node] += sum(map(len, parts)) if parts[0][0] != Frame.BEAT else 0
        return send(node, *parts)

    links.send = counted
    workers = _pool_workers(ClusterPoolWorkers, handles, cluster="in-process",
                            num_processes=simulated_nodes.PER_NODE, num_nodes=nodes)
    workers.links = links
    time.sleep(max(0.0, start - time.time()))  # the ranks start serving
    try:
        figures = _pool_cells(workers)
    finally:
        workers.close()
        simulated_nodes.end_hosts(procs)
    return {**figures, "payload_sends_per_cell": sum(runs) / CELLS,
            "run_frames_per_node_per_cell": max(runs) / CELLS,
            "bytes_to_a_node_per_cell": max(sent) / CELLS}


def run_local_pool(world: int, drivers: int) -> dict:
    """A warm local pool of the fake ranks (``pool``): ``_pool_cells`` through a ``PoolWorkers``,
    whose real ``send_runs`` writes each rank a ``Run`` on its own commands pipe, so the payload
    goes once per rank, by design (its argument is bytes, not a tensor: no shared memory);
    what each rank's commands pipe brought it, as the ranks' tallies say once the pool closes."""
    import re

    from notebook_accel.launch.backends.pool import PoolWorkers

    handles, cleanup = _local_ranks(world, "pool", drivers, 0.0)
    tallies = []
    try:
        figures = _pool_cells(_pool_workers(PoolWorkers, handles, num_processes=world))
    finally:
        for handle in handles:  # the pool closes: each rank's last line is its tally
            os.close(handle.commands_fd)
        for handle in handles:
            handle.reap(5.0)
            text = b""
            with contextlib.suppress(BlockingIOError):
                while chunk := os.read(handle.stdout_fd, 1 << 16):
                    text += chunk
            found = re.search(TALLY.replace("{}", "(\\d+)"), text.decode())
            tallies.append([int(n) for n in found.groups()] if found else [0, 0, 0])
        cleanup()
    _, sent, payloads = zip(*tallies, strict=True)
    return {**figures, "payload_sends_per_cell": sum(payloads) / CELLS / figures["payload_bytes"],
            "commands_bytes_to_a_rank_per_cell": max(sent) / CELLS}


def connect_time(world: int) -> float:
    """Seconds for ``world`` ranks x 5 channels to connect back and be accepted."""
    from notebook_accel.launch.backends import cluster
    from notebook_accel.launch.cluster.channel_server import ChannelServer
    try:  # one link per node (this checkout), or five connections per rank (before the hubs)
        from notebook_accel.launch.worker.hub.hub_link import HELLO
        from notebook_accel.launch.worker.hub.hub_link import LINK_CHANNELS as RUN_CHANNELS
    except ImportError:
        from notebook_accel.launch.worker.node_agent import HELLO, RUN_CHANNELS

    class Ref:
        def __init__(self, rank: int) -> None:
            self.rank = rank

    class FakeRay:  # ray.wait scans its refs (and ray.get answers at once): the started agents
        @staticmethod
        def wait(refs, num_returns, timeout=None):
            done = [ref for ref in refs if ref.rank >= 0]
            return done[:num_returns], done[num_returns:]

        @staticmethod
        def get(ref):
            return [([1000 + each.rank], 0) for each in ref]

    server = ChannelServer("127.0.0.1", world)
    refs = [Ref(rank) for rank in range(world)]
    by_dict = "starts.pop" in inspect.getsource(cluster._collect)
    starts = {ref: ref.rank for ref in refs} if by_dict else refs
    pids: dict[int, int] = {}
    clients: list[socket.socket] = []
    lock = threading.Lock()

    def connect(ranks) -> None:
        for rank in ranks:
            for index in range(len(RUN_CHANNELS)):
                sock = socket.create_connection(server.address)
                sock.sendall(HELLO.pack(server.token, rank, index))
                with lock:
                    clients.append(sock)

    began = time.perf_counter()
    threads = [threading.Thread(target=connect, args=(range(i, world, 4),)) for i in range(4)]
    for thread in threads:
        thread.start()
    got = server.accept(time.monotonic() + 300, lambda: cluster._collect(FakeRay, starts, pids))
    took = time.perf_counter() - began
    for thread in threads:
        thread.join()
    server.close()
    for channels in got.values():
        for sock in channels.values():
            sock.close()
    for sock in clients:
        sock.close()
    return took


SCENARIOS = {"local": ("success", "failure", "hang"),
             "cluster": ("success", "failure", "hang", "lost")}
POOL = {"local": run_local_pool, "cluster": run_pool}  # the warm pool's cells, each mode's


def measure(world: int, drivers: int, mode: str, hosts: int = 0) -> dict:
    """One side's figures at one size (in a process with that side's code on PYTHONPATH);
    cluster mode runs ``hosts`` host processes (0: one per node, each node's hub in a process of
    its own, as on a cluster), local mode ``drivers``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the harness's own pipes, both sides
    with selectors.DefaultSelector():
        pass
    if mode == "cluster":
        import simulated_nodes

        drivers = hosts or world // simulated_nodes.PER_NODE
    figures = {name: run_scenario(world, name, drivers, mode) for name in SCENARIOS[mode]}
    try:
        figures["pool"] = POOL[mode](world, drivers)
    except Exception as error:  # noqa: BLE001 - a side without that pool (the hubs', a local one)
        figures["pool"] = {"cell_p50_s": f"failed: {error!r}"[:200]}
    figures["connect_s"] = (connect_time(world) if mode == "local"
                            else figures["success"]["connect_s"])
    return figures


# -- the two sides --------------------------------------------------------------------------

def _side(directory: Path, world: int, args: argparse.Namespace, mode: str) -> dict:
    return run_side(__file__, directory, ["--measure", str(world), "--drivers", str(args.drivers),
                                          "--hosts", str(args.hosts), "--mode", mode], timeout=600)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


ROWS = [  # (scenario, key, label)
    ("success", "cpu_s", "kernel CPU s (success, 4.5 s)"),
    ("success", "wakeups", "wakeups"),
    ("success", "wakeup_cpu_p50_ms", "CPU ms per wakeup p50"),
    ("success", "wakeup_cpu_p99_ms", "CPU ms per wakeup p99"),
    ("success", "idle_wakeup_cpu_p50_ms", "CPU ms per idle wakeup p50"),
    ("success", "idle_wakeup_cpu_p99_ms", "CPU ms per idle wakeup p99"),
    ("success", "cpu_us_per_ready_channel", "CPU us per channel read"),
    ("success", "wakeup_p50_ms", "wall ms per wakeup p50 (2 cores shared)"),
    ("success", "wakeup_p99_ms", "wall ms per wakeup p99 (2 cores shared)"),
    ("success", "latency_p50_s", "line latency rank->cell p50 s"),
    ("success", "latency_p99_s", "line latency rank->cell p99 s"),
    ("success", "cell_peak_bytes_per_s", "cell bytes/s (peak 1-s window)"),
    ("success", "cell_peak_writes_per_s", "cell writes/s (peak 1-s window)"),
    ("success", "fds", "kernel fds (peak)"),
    ("success", "sockets", "kernel sockets (peak)"),
    ("success", "threads", "kernel threads (peak)"),
    ("success", "view_bytes_per_redraw", "live view bytes per redraw (max)"),
    (None, "connect_s", "connect every rank (cluster: node) s"),
    ("failure", "error_after_s", "failure -> WorkerError s"),
    ("failure", "report_after_s", "  of which: failure -> 1st report in kernel"),
    ("failure", "kernel_part_s", "  of which: 1st report -> WorkerError s"),
    ("failure", "ended_after_s", "failure -> every rank ended s"),
    ("failure", "error_lines", "WorkerError lines (failure)"),
    ("failure", "cpu_s", "kernel CPU s (failure)"),
    ("hang", "error_lines", "WorkerError lines (timeout)"),
    ("hang", "wakeup_cpu_p99_ms", "CPU ms per wakeup p99 (hang)"),
    ("hang", "idle_wakeup_cpu_p99_ms", "CPU ms per idle wakeup p99 (hang)"),
    ("hang", "quiet_wakeups", "wakeups in the quiet phase (hang)"),
    ("hang", "quiet_wakeup_cpu_p50_ms", "CPU ms per quiet wakeup p50 (hang)"),
    ("hang", "quiet_wakeup_cpu_p99_ms", "CPU ms per quiet wakeup p99 (hang)"),
    ("lost", "lost_after_s", "lost node (SIGSTOP) -> WorkerError s"),
    ("lost", "error_head", "lost node: the error's first line"),
    ("pool", "cell_p50_s", "pool cell s p50 (256 kB argument)"),
    ("pool", "cell_max_s", f"pool cell s max (of {CELLS})"),
    ("pool", "payload_sends_per_cell", "pool: payload sent per cell (times)"),
    ("pool", "run_frames_per_node_per_cell", "pool: RUN frames per node per cell"),
    ("pool", "bytes_to_a_node_per_cell", "pool: bytes to a node per cell (max)"),
    ("pool", "commands_bytes_to_a_rank_per_cell", "pool: bytes to a rank per cell (max)"),
    ("pool", "payload_bytes", "pool: the cell's payload bytes"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="70fe29e", help="the revision to compare against")
    parser.add_argument("--sizes", default="8,32,128,512,1024")
    parser.add_argument("--drivers", type=int, default=4,
                        help="local mode: processes simulating the ranks")
    parser.add_argument("--hosts", type=int, default=0,
                        help="cluster mode: host processes playing the nodes (0: one per node, "
                             "as on a cluster; fewer put several hubs' threads under one GIL)")
    parser.add_argument("--modes", default="local,cluster",
                        help="local: fake ranks on the kernel's pipes; cluster: simulated nodes "
                             "of 8 through the real hub code (node links), without Ray")
    parser.add_argument("--measure", type=int, metavar="RANKS", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="local", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:  # one side, one size, in its own process
        print("FIGURES", json.dumps(measure(args.measure, args.drivers, args.mode, args.hosts)),
              flush=True)
        return
    sizes = [int(size) for size in args.sizes.split(",")]
    modes = args.modes.split(",")
    for mode in modes:
        _compare(args, sizes, mode)


def _compare(args: argparse.Namespace, sizes: list[int], mode: str) -> None:
    """Both sides at every size in one mode, alternating; then the table."""
    results: dict[int, dict[str, dict]] = {}
    with baseline_worktree(args.baseline) as base:
        for world in sizes:
            results[world] = {"baseline": _side(base, world, args, mode),
                              "this": _side(ROOT, world, args, mode)}
            print(f"measured {world} ranks ({mode})", file=sys.stderr, flush=True)
    simulated = (f"{args.drivers} driver processes" if mode == "local" else
                 f"{args.hosts} host processes" if args.hosts else "a host process per node")
    print(f"\n== {mode} mode: baseline {args.baseline} vs this checkout; {simulated}; "
          "cell = the relay's target stream; ratio = this / baseline")
    for world in sizes:
        sides = results[world]
        print(f"\n{world} ranks")
        for side in ("baseline", "this"):
            if "error" in sides[side]:
                print(f"  {side} FAILED: {sides[side]['error'][-800:]}")
        for scenario, key, label in ROWS:
            if scenario is not None and scenario not in (*SCENARIOS[mode], "pool"):
                continue
            if scenario == "pool" and key != "cell_p50_s" and not any(
                    key in sides[side].get("pool", {}) for side in sides):
                continue  # the other mode's row (or neither side's pool got that far)
            values = []
            for side in ("baseline", "this"):
                figures = sides[side]
                if "error" in figures:
                    values.append(None)
                    continue
                values.append(figures.get(key) if scenario is None
                              else figures.get(scenario, {}).get(key))
            before, after = values
            ratio = (f"{after / before:.2f}" if isinstance(before, (int, float)) and before
                     and isinstance(after, (int, float)) else "-")
            if isinstance(before, str) or isinstance(after, str):
                print(f"  {label}:\n    baseline {before}\n    this     {after}")
                continue
            print(f"  {label:<36} baseline {_fmt(before):>10}  this {_fmt(after):>10}  "
                  f"ratio {ratio}")


if __name__ == "__main__":
    main()
