"""Launcher pieces that need no worker: output relay, fork-safety probe, payload, errors."""

from __future__ import annotations

import io
import pickle
import socket
import threading
import time

import pytest

from notebook_accel.launch.backends.base import WorkerHandle
from notebook_accel.launch.handoff.payload import dumps_result, load_payload, serialise_payload
from notebook_accel.launch.planning.start_method import choose_start_method, fork_unsafe_reason
from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.launch.views.output import OutputRelay
from notebook_accel.machine import hardware


def relay(show="all"):
    out, err = io.StringIO(), io.StringIO()
    return OutputRelay(show=show, stdout=out, stderr=err, snapshot_every=5.0), out, err


def test_relay_prefixes_each_line_and_keeps_partial_lines():
    r, out, _ = relay()
    r.feed(0, "stdout", b"hel")
    r.feed(1, "stdout", b"other\n")
    r.feed(0, "stdout", b"lo\nwor")
    r.flush()
    assert out.getvalue() == "[rank 1] other\n[rank 0] hello\n"
    r.finish(0)
    r.flush()
    assert out.getvalue().endswith("[rank 0] wor\n")


def test_relay_collapses_carriage_returns_and_snapshots_slowly():
    r, out, _ = relay()
    for i in range(1000):
        r.feed(0, "stderr", f"\r{i}%".encode())
    r.tick(now=1e12)  # long after: one snapshot of the latest state
    r.feed(0, "stderr", b"\rdone\n")
    r.flush()
    assert out.getvalue() == ""
    assert r.tail(0) == "done"
    r2, _, err = relay()
    for i in range(5):
        r2.feed(0, "stderr", f"\r{i}%".encode())
    r2.tick(now=1e12)
    r2.tick(now=1e12)  # nothing new: no second snapshot
    r2.feed(0, "stderr", b"\r100%\n")
    r2.flush()
    assert err.getvalue() == "[rank 0] 4%\n[rank 0] 100%\n"


def test_relay_decodes_utf8_split_across_reads_and_filters_ranks():
    r, out, _ = relay(show="main")
    data = "héllo ✓\n".encode()
    r.feed(0, "stdout", data[:2])
    r.feed(0, "stdout", data[2:])
    r.feed(1, "stdout", b"hidden\n")
    r.flush()
    assert out.getvalue() == "[rank 0] héllo ✓\n"
    assert r.tail(1, "stdout") == "hidden"


def test_fork_probe_sees_driver_level_cuda_and_uvm():
    assert fork_unsafe_reason(maps="", open_files=[]) is None
    assert "libcuda.so" in fork_unsafe_reason(
        maps="7f00-7f10 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.535.1\n",
        open_files=[])
    assert "nvidia-uvm" in fork_unsafe_reason(maps="", open_files=["/dev/nvidia-uvm"])
    assert fork_unsafe_reason(maps="", open_files=["/dev/nvidiactl"]) is None  # NVML only


def test_choose_start_method_here_and_bad_names():
    assert choose_start_method("auto").method == "fork"
    assert choose_start_method("spawn").method == "spawn"
    from notebook_accel.launch.planning.request import LaunchRequest

    with pytest.raises(ValueError, match="'auto', 'fork', 'forkserver', 'spawn'"):  # at its door
        LaunchRequest.from_keywords("notebook_launcher", {"start_method": "threads"})


class Config:
    def __init__(self):
        self.name = "ok"
        self.nested = {"fine": 1, "sock": socket.socket()}


def test_payload_names_the_path_of_what_cannot_be_sent():
    config = Config()
    try:
        with pytest.raises(TypeError, match=r"kwargs\['cfg'\]\.nested\['sock'\]"):
            serialise_payload(print, (1,), {"cfg": config})
    finally:
        config.nested["sock"].close()
    lock = threading.Lock()

    def closes_over():
        return lock

    with pytest.raises(TypeError, match=r"closure variable 'lock'"):
        serialise_payload(closes_over, (), {})


def test_payload_round_trip_and_results_move_off_device():
    import torch

    data = serialise_payload(lambda x, y=2: x * y, (3,), {"y": 4})
    function, args, kwargs = load_payload(data)
    assert function(*args, **kwargs) == 12
    model = torch.nn.Linear(2, 2)
    back = pickle.loads(dumps_result({"t": torch.ones(2), "m": model}))
    assert torch.equal(back["t"], torch.ones(2))
    assert torch.equal(back["m"].weight, model.weight)


def test_code_travels_whole_with_its_file_name_and_odd_constants_the_slower_way():
    import marshal
    import types

    def outer(x):
        def inner(y):
            return x + y
        return inner(1)

    outer.__code__ = outer.__code__.replace(co_filename="/tmp/ipykernel_1/7.py")
    function, _, _ = load_payload(serialise_payload(outer, (), {}))
    assert function(2) == 3 and function.__code__.co_filename == "/tmp/ipykernel_1/7.py"
    assert function.__code__.co_consts == outer.__code__.co_consts  # nested code included
    odd = compile("x = 1", "<cell-9>", "exec").replace(co_consts=(frozenset({object}),))
    with pytest.raises(ValueError):
        marshal.dumps(odd)  # a constant marshal cannot write: cloudpickle's way, same file name
    code = load_payload(serialise_payload(print, (odd,), {}))[1][0]
    assert isinstance(code, types.CodeType) and code.co_filename == "<cell-9>"


def test_worker_error_pickles_and_renders_for_ipython():
    from notebook_accel.wire import FailureRecord

    stopped = FailureRecord(rank=0, pid=11, exitcode=-15, exc_type=None, headline="stopped",
                            timestamp=1.0)
    cause = FailureRecord(rank=1, pid=12, exitcode=1, exc_type="ValueError",
                          headline="ValueError: x", traceback="Traceback...\nValueError: x",
                          timestamp=0.5)
    error = WorkerError("rank 1 failed: ValueError: x", rank=1, exitcode=1,
                        remote_traceback="Traceback...\nValueError: x",
                        other_failures=[stopped], failure=cause)
    back = pickle.loads(pickle.dumps(error))
    assert (back.rank, back.exitcode, back.other_failures) == (1, 1, [stopped])
    assert back.failure == cause and back.failure.exc_type == "ValueError"
    assert [str(f) for f in back.other_failures] == ["rank 0: stopped"]
    assert back.other_failures[0].signal_name == "SIGTERM" and cause.signal is None
    rendered = "\n".join(back._render_traceback_())
    assert "[rank 1]" in rendered and "ValueError: x" in rendered and "rank 0: stopped" in rendered
    assert "ValueError: x" in str(back) and "rank 0: stopped" in str(back)
    plain = WorkerError("rank 2 was killed by SIGKILL", rank=2, exitcode=-9)
    assert (plain.failure.rank, plain.failure.exitcode, plain.failure.signal_name) == (
        2, -9, "SIGKILL")


def test_wire_round_trips_every_message_kind_in_one_framing():
    import os

    from notebook_accel import wire

    messages = [
        wire.Progress({"n": 3, "total": 10}, timestamp=1.5),
        wire.Metrics(7, {"loss": 0.25}, timestamp=2.0),
        wire.Memory(1 << 30, timestamp=2.5),
        wire.Phase("compiling", timestamp=2.7),
        wire.Dropped(4, timestamp=3.0),
        wire.RichHidden(2, timestamp=3.2),
        wire.Display({"text/plain": "hi"}, {}, {"display_id": "d"}, True, timestamp=3.5),
        wire.Result(b"x" * 200_000, timestamp=4.0),
        wire.FailureRecord(rank=1, pid=9, exitcode=1, exc_type="KeyError", headline="KeyError: 'a'",
                           traceback="Traceback ...", secondary=True, timestamp=4.5),
        wire.Run(b"payload", True, timestamp=5.0),
        wire.RunDone(12, False, ("model", "loader"), ("loader",), ("torch",), timestamp=5.5),
        wire.StopAsk(timestamp=6.0),
        wire.StopCount({"0": 41}, (("<cell>", 3, 12),), True, timestamp=6.5),
        wire.StopCount({"0": 41}, (("<cell>", 3, 12),), False, seen=40, waiting_at=None, timestamp=6.7),
        wire.StopAt(("0",), 42, timestamp=7.0),
        wire.StackAsk(3, timestamp=7.5),
        wire.Stack((("<cell>", 3, "train"),), 41, 3, timestamp=8.0),
        wire.InputAsk("(Pdb rank 1) ", timestamp=8.5),
        wire.InputLine("p value", timestamp=9.0),
        wire.InputLine(None, timestamp=9.2),
        wire.DebugEnd(timestamp=9.5),
    ]
    assert {type(m).kind for m in messages} == set(wire.Kind)  # every kind has its message
    K = wire.Kind
    assert {k for k in K if k.reliable} == {K.DISPLAY, K.RESULT, K.ERROR, K.RUN, K.RUN_DONE,
                                           K.STOP_ASK, K.STOP_COUNT, K.STOP_AT, K.STACK_ASK,
                                           K.STACK, K.INPUT_ASK, K.INPUT_LINE, K.DEBUG_END}
    assert [wire.decode(wire.encode(m)) for m in messages] == messages
    read_fd, write_fd = os.pipe()
    try:
        os.set_blocking(read_fd, False)
        reader = wire.FrameReader(read_fd)
        frames = b"".join(wire.encode(m) for m in messages[:4])
        os.write(write_fd, frames[:5])  # a partial header: nothing yet
        assert reader.read() == ([], True)
        os.write(write_fd, frames[5:])
        got, still_open = reader.read()
        assert got == messages[:4] and still_open
        os.close(write_fd)
        write_fd = -1
        assert reader.read() == ([], False)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    read_fd, write_fd = os.pipe()  # a pool worker's commands channel: blocking reads
    os.write(write_fd, wire.encode(messages[-2]))
    os.close(write_fd)
    assert wire.receive(read_fd) == messages[-2] and wire.receive(read_fd) is None
    os.close(read_fd)
    stamped = wire.decode(wire.encode_data(wire.Kind.METRICS, {"step": 1, "values": {"a": 1.0}}))
    assert stamped == wire.Metrics(1, {"a": 1.0}, timestamp=stamped.timestamp)
    assert abs(stamped.timestamp - time.time()) < 60  # the sender's wall clock
    with pytest.raises(ValueError, match="not a kind of event"):
        wire.encode_data("result", {})
    with pytest.raises(ValueError, match="not a kind of event"):
        wire.encode_data("bench", {})


def test_visible_devices_filter_and_summary():
    names = ["A100", "A100", "H100"]
    assert hardware._apply_visible_devices(names, None) == names
    assert hardware._apply_visible_devices(names, "2,0") == ["H100", "A100"]
    assert hardware._apply_visible_devices(names, "") == []
    assert hardware._apply_visible_devices(names, "0,7,1") == ["A100"]  # stops at invalid
    summary = hardware.Hardware(cpu_count=8, gpu_names=("A100", "A100")).summary()
    assert summary == "2 × A100, 8 CPU cores"


def test_relay_limits_a_flood_and_says_how_much_was_skipped(monkeypatch):
    from notebook_accel.launch.views import output

    monkeypatch.setattr(output, "BURST_BYTES", 1000)
    monkeypatch.setattr(output, "RATE_BYTES", 0)
    r, out, err = relay()
    r.feed(0, "stdout", b"".join(b"x" * 90 + b"\n" for _ in range(100)))
    r.finish(0)
    r.flush()
    shown = out.getvalue().splitlines()
    assert 1 <= len(shown) <= 11 and all(line == "[rank 0] " + "x" * 90 for line in shown)
    assert f"{100 - len(shown)} lines" in err.getvalue() and "not shown" in err.getvalue()
    assert r.tail(0, "stdout").count("\n") == 59  # the tail still has the last lines


def test_worker_tracebacks_skip_frames_that_hide_themselves():
    from notebook_accel.launch.worker.main import _format_exception

    def runner():
        __tracebackhide__ = True
        user_code()

    def user_code():
        raise ValueError("from the user")

    try:
        runner()
    except ValueError as exc:
        text = _format_exception(exc)
    assert "user_code" in text and "from the user" in text
    assert "in runner" not in text


def test_the_traceback_trimmer_knows_the_worker_entry_point():
    """Stack dumps drop the frames above the worker's entry point: its path must exist (it moved once)."""
    import os

    from notebook_accel.launch.supervision import tracebacks

    assert os.path.isfile(tracebacks._WORKER_FILE), tracebacks._WORKER_FILE


def test_a_rank_marked_failed_whose_result_came_after_its_exit_is_still_named():
    """Rank 1 exited (code 0) before its result was read, so it was marked failed; the result then
    arrived. The job's error names rank 1 instead of failing to find a root cause (an IndexError)."""
    import os

    from notebook_accel.launch.supervision.supervisor import Supervisor
    from notebook_accel.launch.supervision.verdicts.root_cause import root_cause
    from notebook_accel.launch.views.record import LaunchRecord

    class Ended(WorkerHandle):
        def __init__(self, rank):
            self.rank = rank
            self.stdout_fd, self.stderr_fd, self.control_fd, self.events_fd = (os.pipe()[0] for _ in range(4))
        pid, sentinel, exitcode = 100, -1, 0
        terminate = kill = dump_stacks = lambda self: None
        reap = lambda self, timeout: None  # noqa: E731

    record = LaunchRecord(world_size=2, num_processes=2, device_type="cpu", start_method="fork",
                          mixed_precision="no")
    supervisor = Supervisor([Ended(0), Ended(1)], relay()[0], record, view=None)
    for worker in supervisor.workers:
        worker.exited, worker.exit_time, worker.returned = True, time.time(), True
    record.ranks[0].state, record.ranks[1].state = "finished", "failed"
    error = root_cause(supervisor.workers, record, supervisor._death_tail)
    assert error.rank == 1 and record.root_cause == 1
    assert "rank 1 exited (code 0) before its function returned" in str(error)


def test_a_payload_whose_module_the_worker_cannot_import_says_why(tmp_path, monkeypatch):
    import sys

    (tmp_path / "kernel_only.py").write_text("def train():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import kernel_only

    data = serialise_payload(kernel_only.train, (), {})  # imported: travels by reference
    monkeypatch.delitem(sys.modules, "kernel_only")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    with pytest.raises(ModuleNotFoundError, match=r"No module named 'kernel_only', which the kernel "
                                                  r"imported .* 'kernel_only' must be importable where"):
        load_payload(data)


class _NetworkRank(WorkerHandle):
    """A rank whose channels are sockets, as a cluster's are: its end (the *alive* connection's)
    comes first, and its last line and its result arrive ``late`` seconds after."""

    pid, exitcode, sentinel = 100, 0, -1
    terminate = kill = dump_stacks = lambda self: None
    reap = lambda self, timeout: None  # noqa: E731

    def __init__(self, grace: float, late: float) -> None:
        self.rank, self.end_grace = 0, grace
        pairs = {name: socket.socketpair() for name in ("stdout", "stderr", "control", "events",
                                                         "alive")}
        self._kernel = {name: ours for name, (ours, _) in pairs.items()}
        self._worker = {name: theirs for name, (_, theirs) in pairs.items()}
        for sock in self._kernel.values():
            sock.setblocking(False)
        self.stdout_fd, self.stderr_fd = self._kernel["stdout"].fileno(), self._kernel["stderr"].fileno()
        self.control_fd, self.events_fd = self._kernel["control"].fileno(), self._kernel["events"].fileno()
        self.sentinel = self._kernel["alive"].fileno()
        threading.Thread(target=self._end, args=(late,), daemon=True).start()

    def _end(self, late: float) -> None:
        from notebook_accel import wire

        self._worker["alive"].close()
        time.sleep(late)
        self._worker["stdout"].sendall(b"last line\n")
        wire.send(self._worker["control"].fileno(), wire.Result(b"42"))
        for name in ("stdout", "stderr", "control", "events"):
            self._worker[name].close()


class _NoView:
    holds_output = False

    def update(self, record, final=False):
        pass


@pytest.mark.parametrize("grace", [0.0, 2.0])
def test_a_ranks_result_and_last_line_arriving_after_its_end_are_waited_for_over_a_network(grace):
    """A cluster's ranks talk over separate connections: the one that says the rank ended can
    overtake its last output and its result. Local pipes (no grace) have them all by then."""
    from notebook_accel.launch.supervision.supervisor import Supervisor
    from notebook_accel.launch.views.record import LaunchRecord

    record = LaunchRecord(world_size=1, num_processes=1, device_type="cpu", start_method="fork",
                          mixed_precision="no")
    output, out, _ = relay()
    handle = _NetworkRank(grace, late=0.3)
    supervisor = Supervisor([handle], output, record, view=_NoView())
    if grace:
        (worker,) = supervisor.run()
        assert worker.returned and worker.result == b"42"
        assert "[rank 0] last line" in out.getvalue()
    else:
        with pytest.raises(WorkerError, match="rank 0 exited"):
            supervisor.run()


def _plan(num_processes, starting, **options):
    from notebook_accel.launch.planning.plan import make_plan

    settings = dict(num_processes=num_processes, mixed_precision=None, use_port=None,
                    master_addr="127.0.0.1", node_rank=0, num_nodes=1, start_method="spawn",
                    timeout=None, output="all", return_all=False, max_restarts=0, device=None)
    return make_plan(**{**settings, **options}, starting=starting)


def test_the_plan_tells_count_and_start_method_before_detecting_the_hardware(monkeypatch):
    """Detecting the hardware imports torch (seconds on a cold kernel): a given count is told
    before it, so a launch can say what it starts at once; the default count once detected."""
    told = []
    detect = hardware.detect
    monkeypatch.setattr(hardware, "detect", lambda: told.append("detected") or detect())
    starting = lambda count, start: told.append((count, start.method))  # noqa: E731
    assert _plan(2, starting, device="cpu").num_processes == 2
    assert told == [(2, "spawn"), "detected"]
    told.clear()
    plan = _plan(None, starting, device="cpu")
    assert told == ["detected", (plan.num_processes, "spawn")]
    told.clear()
    from notebook_accel.launch.planning.request import LaunchRequest

    for bad in ({"mixed_precision": "fp64"}, {"device": "gpu"}):  # refused at the door: no plan
        with pytest.raises(ValueError, match=next(iter(bad))):
            LaunchRequest.from_keywords("notebook_launcher", {"num_processes": 2, **bad})
    assert told == []


def test_a_launch_says_it_starts_workers_only_when_the_start_takes_seconds(monkeypatch, capsys):
    import sys

    from notebook_accel.launch.launcher import announce_start

    said = "[notebook_accel] starting 2 workers (fork)...\n"
    monkeypatch.delitem(sys.modules, "notebook_accel.launch.worker.warm", raising=False)
    announce_start(2, "fork", "all")  # torch and the workers' modules still to import
    assert capsys.readouterr() == ("", said)  # a script's stdout is its own (a kernel's: test_cold_start_kernel)
    announce_start(2, "fork", "none")  # the launch shows nothing
    monkeypatch.setitem(sys.modules, "notebook_accel.launch.worker.warm", sys)
    announce_start(2, "fork", "main")  # forked workers start warm: a moment
    assert capsys.readouterr().err == ""
    announce_start(1, "spawn", "all")  # every spawned worker imports torch
    assert capsys.readouterr().err == "[notebook_accel] starting 1 worker (spawn)...\n"
    from multiprocessing import forkserver

    monkeypatch.setattr(forkserver._forkserver, "_forkserver_pid", None)
    announce_start(2, "forkserver", "all")  # the forkserver imports torch before it forks
    monkeypatch.setattr(forkserver._forkserver, "_forkserver_pid", 12345)
    announce_start(2, "forkserver", "all")  # it runs, warm
    assert capsys.readouterr().err == "[notebook_accel] starting 2 workers (forkserver)...\n"


class _FailedRank(WorkerHandle):
    """A rank that has sent its failure and is still running (its process ends when stopped)."""

    pid, sentinel = 100, -1
    dump_stacks = lambda self: None  # noqa: E731

    def __init__(self, rank: int) -> None:
        import os

        from notebook_accel import wire

        self.rank, self.code = rank, None
        pipes = {name: os.pipe() for name in ("stdout", "stderr", "control", "events", "alive")}
        for name in ("stdout", "stderr", "events"):
            os.close(pipes[name][1])
        wire.send(pipes["control"][1], wire.FailureRecord(
            rank=rank, pid=100, exitcode=1, exc_type="RuntimeError",
            headline=f"RuntimeError: rank {rank}", traceback="", secondary=rank > 0,
            timestamp=time.time() + rank))
        os.close(pipes["control"][1])
        self._alive = pipes["alive"][1]
        self.stdout_fd, self.stderr_fd = pipes["stdout"][0], pipes["stderr"][0]
        self.control_fd, self.events_fd = pipes["control"][0], pipes["events"][0]
        self.sentinel = pipes["alive"][0]

    @property
    def exitcode(self):
        return self.code

    def terminate(self):
        import os

        if self.code is None:
            self.code = -15
            os.close(self._alive)

    kill = terminate
    reap = lambda self, timeout: None  # noqa: E731


def test_once_every_running_rank_has_reported_its_failure_the_rest_are_stopped_at_once(monkeypatch):
    """The kernel gathers the other ranks' reports for a moment after a failure; when every rank
    still running has sent its failure already, nothing is left to gather: no wait."""
    from notebook_accel.launch import tuning
    from notebook_accel.launch.supervision import supervisor as watching
    from notebook_accel.launch.views.record import LaunchRecord

    monkeypatch.setattr(tuning, "COLLECT_AFTER_FAILURE", 60.0)
    record = LaunchRecord(world_size=3, num_processes=3, device_type="cpu", start_method="fork",
                          mixed_precision="no")
    began = time.monotonic()
    with pytest.raises(WorkerError, match="rank 0 failed: RuntimeError: rank 0") as raised:
        watching.Supervisor([_FailedRank(rank) for rank in range(3)], relay()[0], record,
                            view=_NoView()).run()
    assert time.monotonic() - began < 10  # not the 60 s of gathering
    assert [failure.rank for failure in raised.value.other_failures] == [1, 2]


def test_a_ranks_memory_that_moved_by_a_few_pages_is_no_news(monkeypatch):
    """A rank's memory is sampled once a second; a figure that moved by 1% or less stays as it
    was (a view shows 3-4 digits: a quiet job's redraw then finds nothing changed)."""
    from notebook_accel.launch.supervision import supervisor as watching
    from notebook_accel.launch.views.record import LaunchRecord

    handle = _FailedRank(0)
    record = LaunchRecord(world_size=1, num_processes=1, device_type="cpu", start_method="fork",
                          mixed_precision="no")
    supervisor = watching.Supervisor([handle], relay()[0], record, view=_NoView())
    clock = [1000.0]
    monkeypatch.setattr(watching.time, "monotonic", lambda: clock[0])
    seen = []
    for rss in (100 << 20, (100 << 20) + 4096 * 100, 110 << 20):
        handle.rss = lambda rss=rss: rss
        supervisor._refresh()
        seen.append(record.ranks[0].rss)
        clock[0] += 1.0
    assert seen == [100 << 20, 100 << 20, 110 << 20]
