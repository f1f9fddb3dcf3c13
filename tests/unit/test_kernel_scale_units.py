"""The kernel side at a thousand ranks: rank ranges, grouped errors, deduplicated and budgeted
output, every line kept, the live view per node, the open-file limit, connect-back checks."""

from __future__ import annotations

import io
import resource
import socket
import threading
import time
from collections import Counter

import pytest

from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.launch.views import output
from notebook_accel.launch.views.line_groups import WINDOW, LineGroups
from notebook_accel.launch.views.output import OutputRelay
from notebook_accel.launch.views.rank_logs import RankLogs
from notebook_accel.launch.views.rank_ranges import ranks_text
from notebook_accel.launch.views.record import LaunchRecord, RankStatus
from notebook_accel.wire import FailureRecord


def test_rank_lists_are_written_as_ranges():
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([1, 0]) == "ranks 0, 1"
    assert ranks_text([0, 1, 2, 5]) == "ranks 0-2, 5"
    assert ranks_text(r for r in range(1024) if r != 512) == "ranks 0-511, 513-1023"
    assert ranks_text(range(0, 40, 2), limit=3) == "ranks 0, 2, 4, ... and 17 more"


def _failure(rank, headline, secondary=True):
    return FailureRecord(rank=rank, pid=100 + rank, exitcode=1, exc_type=headline.split(":")[0],
                         headline=headline, traceback="", secondary=secondary, timestamp=1.0)


@pytest.mark.parametrize("world", [4, 256, 1024])
def test_a_worker_error_groups_the_other_ranks_by_headline_in_at_most_40_lines(world):
    cause = world // 2
    trace = "Traceback (most recent call last):\n  File \"<cell 1>\", line 3, in job\nRuntimeError: boom"
    others = [_failure(rank, "DistBackendError: connection reset") for rank in range(world)
              if rank not in (cause, 1)]
    others.append(_failure(1, "was killed by SIGKILL"))
    error = WorkerError("rank 2 failed: RuntimeError: boom", rank=cause, exitcode=1,
                        remote_traceback=trace, other_failures=others,
                        failure=_failure(cause, "RuntimeError: boom", secondary=False))
    text = str(error)
    assert len(text.splitlines()) <= 40
    assert text.startswith("rank 2 failed: RuntimeError: boom") and "RuntimeError: boom" in text
    most = [r for r in range(world) if r not in (cause, 1)]
    assert f"  {ranks_text(most)}: DistBackendError: connection reset" in text
    assert "  rank 1: was killed by SIGKILL" in text
    assert text.index("DistBackendError") < text.index("SIGKILL")  # the largest group first
    assert len(error.other_failures) == world - 1  # every rank's record stays
    assert len(error._render_traceback_()) <= 40


def test_past_eight_kinds_of_failure_the_rest_are_counted():
    others = [_failure(rank, f"ValueError: case {rank}") for rank in range(20)]
    text = str(WorkerError("rank 99 failed", rank=99, other_failures=others))
    assert "ranks 8-19: 12 other kinds of failure (each rank's record: .other_failures)" in text
    assert len(text.splitlines()) == 3 + 9


def test_line_groups_keep_each_ranks_order():
    groups, shown = LineGroups(window=0.25), []
    groups.add(1, "stdout", "B", now=0.0)
    groups.add(0, "stdout", "A", now=0.01)
    groups.add(0, "stdout", "B", now=0.02)  # B's group began before rank 0's A: a new one
    groups.add(1, "stdout", "A", now=0.03)  # rank 1's B came first: A joins after it
    groups.add(2, "stdout", "A", now=0.04)
    groups.release(0.1, lambda *line: shown.append(line))
    assert shown == []  # still in the window
    groups.release(None, lambda *line: shown.append(line))
    assert shown == [("stdout", [1], "B"), ("stdout", [0, 1, 2], "A"), ("stdout", [0], "B")]


def relay_of(world, **options):
    out, err = io.StringIO(), io.StringIO()
    relay = OutputRelay(show="all", stdout=out, stderr=err, **options)
    relay.watch({rank: f"rank {rank}" for rank in range(world)})
    return relay, out, err


def test_above_16_ranks_identical_lines_are_shown_once_with_their_ranks():
    relay, out, _ = relay_of(1024)
    assert relay.deduplicating and not relay_of(16)[0].deduplicating
    for rank in range(1024):
        relay.feed(rank, "stdout", b"epoch 1 done\n")
    relay.feed(7, "stdout", b"loss 0.5\n")
    relay.flush()
    assert out.getvalue() == "[ranks 0-1023] epoch 1 done\n[rank 7] loss 0.5\n"


def test_grouped_lines_wait_for_their_window_only():
    relay, out, _ = relay_of(64)
    relay.feed(0, "stdout", b"hello\n")
    relay.flush(pace=0.01)
    assert out.getvalue() == ""  # waiting for the same line of other ranks
    time.sleep(WINDOW + 0.05)
    relay.flush(pace=0.01)
    assert out.getvalue() == "[rank 0] hello\n"


def test_the_cell_gets_at_most_its_budget_whatever_the_ranks_and_every_line_is_kept(monkeypatch):
    # the relay's clock stands still (a loaded machine's slow feed would earn it more budget):
    # 1024 lines of 1 kB at once get the burst, about 100 lines, and no more
    frozen = time.monotonic()
    monkeypatch.setattr(output, "time", type("FrozenTime", (), {"monotonic": staticmethod(lambda: frozen)}))
    relay, out, err = relay_of(1024, dedup=False)
    for rank in range(1024):
        relay.feed(rank, "stdout", f"{rank:04d} ".encode() + b"x" * 995 + b"\n")
    relay.flush()
    shown = out.getvalue()
    assert len(shown) <= output.CELL_BURST + 1100
    left_out = 1024 - shown.count("\n")
    assert left_out > 900
    assert (f"[notebook_accel] ... {left_out} lines (" in err.getvalue()
            and "not shown: the cell shows at most 400 kB/s; every line is kept: "
                "last_launch().logs(rank)" in err.getvalue())
    record = LaunchRecord(world_size=1024, num_processes=1024, device_type="cpu",
                          start_method="fork", mixed_precision="no", output=relay.logs)
    assert record.logs(1023) == "1023 " + "x" * 995


def test_a_ranks_log_keeps_its_share_and_says_what_it_dropped(monkeypatch):
    from notebook_accel.launch.views import rank_logs

    monkeypatch.setattr(rank_logs, "RANK_MIN", 100)
    monkeypatch.setattr(rank_logs, "LOG_BYTES", 200)
    logs = RankLogs(ranks=2)
    for index in range(30):
        logs.add(0, "stdout" if index % 2 else "stderr", f"line {index:02d}")
    text = logs.text(0).splitlines()
    assert text[0].startswith("[notebook_accel] 18 earlier lines (0.0 MB) not kept")
    assert text[1:] == [f"line {index:02d}" for index in range(18, 30)]
    assert logs.text(0, "stdout").splitlines()[1] == "line 19"


def _big_record(world):
    record = LaunchRecord(world_size=world, num_processes=world, device_type="cuda",
                          start_method="fork", mixed_precision="bf16")
    for rank in range(world):
        record.ranks[rank] = RankStatus(rank=rank, pid=1000 + rank, node=rank // 8,
                                        state="running", rss=2_000_000_000 + rank,
                                        gpu_memory=10_000_000_000, last_line="epoch 3 done " * 12)
        record.progress[rank] = {"n": 40 if rank != 77 else 12, "total": 100, "time": time.time()}
    if world > 301:
        record.ranks[77].last_line = "waiting for data"
        for rank in (300, 301):
            record.ranks[rank].state, record.ranks[rank].exitcode = "failed", 1
        record.root_cause = 301
    return record


@pytest.mark.parametrize("world", [1024, 8192])
def test_the_live_view_is_per_node_above_32_ranks_and_at_most_50_kb(world):
    from magics.view.live_view import render

    record = _big_record(world)
    bundle = render(record)
    assert sum(len(value.encode()) for value in bundle.values()) <= 50_000
    plain = bundle["text/plain"]
    assert "node 9 (ranks 72-79): 8 running, slowest rank 77" in plain
    assert "rank 77: waiting for data" in plain
    assert plain.index("node 37 (ranks 296-303): 6 running, 2 failed") < plain.index("node 0 ")
    assert plain.index("rank 301: failed (exit 1) · root cause") < plain.index("rank 300: failed")
    small = _big_record(32)
    assert "rank 31: running, pid 1031" in render(small)["text/plain"]


def test_a_launch_raises_the_soft_open_file_limit_up_to_the_hard_one():
    from notebook_accel.launch.planning.fd_limit import FDS_PER_RANK, ensure_fd_room, open_fds

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < open_fds() + 1000 * FDS_PER_RANK:
        pytest.skip(f"hard limit {hard} is too low to show it")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(open_fds() + 64, 256), hard))
    try:
        ensure_fd_room(1000)
        raised = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert raised[0] >= open_fds() + 1000 * FDS_PER_RANK and raised[1] == hard
        ensure_fd_room(10)  # never lowered
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == raised
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connect_back_checks_the_ranks_every_so_often_not_per_connection():
    from notebook_accel.launch.backends.cluster import _collect
    from notebook_accel.launch.cluster.channel_server import ChannelServer
    from notebook_accel.launch.worker.hub.hub_link import HELLO, LINK_CHANNELS

    world, calls = 200, []
    server = ChannelServer("127.0.0.1", world)
    clients = []

    def connect():
        for rank in range(world):
            for index in range(len(LINK_CHANNELS)):
                sock = socket.create_connection(server.address)
                sock.sendall(HELLO.pack(server.token, rank, index))
                clients.append(sock)

    thread = threading.Thread(target=connect)
    thread.start()
    began = time.monotonic()
    got = server.accept(time.monotonic() + 60, lambda: calls.append(1))
    thread.join()
    assert len(got) == world
    assert len(calls) <= 2 + (time.monotonic() - began) / 0.25  # not 200
    for channels in got.values():
        for sock in channels.values():
            sock.close()
    for sock in clients:
        sock.close()
    server.close()

    class Ray:
        waited: list[int] = []

        def wait(self, refs, num_returns, timeout):
            self.waited.append(len(refs))
            return refs[:2], refs[2:]

        got: list[list[int]] = []

        def get(self, refs):
            self.got.append(refs)
            return [([ref * 10], 1) for ref in refs]

    starts, pids, ray = {r: r for r in range(5)}, {}, Ray()  # ref -> rank
    _collect(ray, starts, pids)
    _collect(ray, starts, pids)
    assert pids == {0: [0], 1: [10], 2: [20], 3: [30]} and ray.waited == [5, 3]  # only what is pending
    assert ray.got == [[0, 1], [2, 3]]  # one ray.get for what each wait found done


def test_a_redraw_recomputes_only_the_nodes_whose_ranks_changed():
    """The per-node summary is kept up to date by the ranks' statuses: a wakeup and a redraw
    after a few changes remake their shown nodes' rows only, and show the change (O(changed)
    and the shown rows, not O(ranks))."""
    from magics.view.live_view import render
    from notebook_accel.launch.views.nodes import node_table, prepare_node_table

    record = _big_record(1024)
    render(record)
    rows = dict(node_table(record).rows)
    record.ranks[9].last_line = "rank 9 says something else"
    record.ranks[1000].state = "failed"
    prepare_node_table(record)
    plain = render(record)["text/plain"]
    now = node_table(record).rows
    assert len(rows) == len(now) == 32  # rows only for the nodes shown
    assert {node for node in rows if now.get(node) is not rows[node]} == {1, 30}  # 30: left out
    assert 125 in now and 125 not in rows  # a failed rank's node is shown first
    assert "rank 9: rank 9 says something else" in plain and "rank 1000: failed" in plain
    assert node_table(record).states == Counter(s.state for s in record.ranks.values())


def test_a_redraw_with_nothing_changed_makes_nothing_anew(monkeypatch):
    """A quiet redraw (every rank marked "no progress", nothing new since) remakes no row, no
    node line and names no rank anew: it costs what a redraw of 8 ranks' nodes costs."""
    from magics.view import status
    from magics.view.live_view import render
    from notebook_accel.launch.views import nodes, text

    record = _big_record(1024)
    for each in record.ranks.values():
        if each.state == "running":
            each.enter_phase("no progress", time.time())
    render(record)
    made: list[str] = []
    for module, name in ((nodes, "_row"), (status, "_make_node_line"), (text, "_firsts")):
        monkeypatch.setattr(module, name, lambda *args, name=name: made.append(name))
    plain = render(record)["text/plain"]
    assert made == [], made
    assert "1022 no progress (rank 0 for" in plain and "rank 301: failed" in plain, plain[:300]


def test_a_paced_flush_releases_grouped_lines_a_slice_at_a_time_and_loses_none(monkeypatch):
    """Releasing a thousand groups at once would hold the watch loop for milliseconds: a paced
    flush stops after its slice (one group at least), asks to be called again at once, and
    writes everything together, in order, when the last due group is out."""
    monkeypatch.setattr(output, "RELEASE_SLICE", 0.0)  # one group per call
    relay, out, _ = relay_of(64)
    for index in range(40):
        relay.feed(index, "stdout", f"line {index}\n".encode())
    time.sleep(WINDOW + 0.05)
    calls = 0
    while True:
        relay.flush(pace=output.FLUSH_EVERY)
        calls += 1
        if out.getvalue():
            break
        assert relay.due_in() == 0.0  # more groups are due: the loop comes back at once
    assert calls == 40
    assert out.getvalue() == "".join(f"[rank {index}] line {index}\n" for index in range(40))


def test_a_redraw_takes_no_rank_by_rank_work_and_leaves_changed_rows_to_the_wakeups_between(
        monkeypatch):
    """What the ranks change is taken in as it changes. A redraw of the live view remakes no
    row and never walks the ranks: it puts together the rows made so far (a failed rank shows
    at once in the header and the abnormal ranks); the wakeups between redraws remake the
    changed rows within their budget, those whose ranks changed state first; the end remakes
    every one."""
    from magics.view.live_view import render
    from magics.view.status import node_line
    from notebook_accel.launch.views import nodes

    record = _big_record(1024)
    monkeypatch.setattr(nodes, "PREPARE_BUDGET", 1.0)
    nodes.prepare_node_table(record, node_line)  # the live view's wakeups: every row made
    assert "node 30 (ranks 240-247)" in render(record)["text/plain"]
    monkeypatch.setattr(nodes, "LOOK_AGAIN", 0.0)
    for status in record.ranks.values():
        status.last_line = f"rank {status.rank} moved on"
    record.ranks[1000].state = "failed"
    record.ranks[5].state = "stopped"
    remade, took_in = [], []
    row, changed = nodes._row, nodes.NodeTable.changed
    monkeypatch.setattr(nodes, "_row", lambda *args: remade.append(args[1]) or row(*args))
    monkeypatch.setattr(nodes.NodeTable, "changed",
                        lambda self, *args: took_in.append(args) or changed(self, *args))
    plain = render(record)["text/plain"]
    assert took_in == [] and remade == []  # no rank looked at, no row made in a redraw
    assert "1020 running, 3 failed (rank 300, exit code 1, rank 301, exit code 1, rank 1000), 1 stopped" in plain
    assert "rank 1000: failed" in plain and "rank 5: stopped" in plain
    assert "node 125 " not in plain and "... and 97 more nodes" in plain  # its row: not yet
    monkeypatch.setattr(nodes, "PREPARE_BUDGET", 0.0)
    for _ in range(2):
        nodes.prepare_node_table(record, node_line)  # a wakeup between redraws: one row each
    assert sorted(remade) == [0, 125]  # the nodes whose ranks changed state: first
    plain = render(record)["text/plain"]
    assert "node 0 (ranks 0-7): 7 running, 1 stopped" in plain
    assert "node 125 (ranks 1000-1007): 7 running, 1 failed" in plain
    record.finish("failed")
    render(record, final=True)
    assert len(remade) == 2 + 30  # the end: every shown row made afresh
    assert "rank 1 moved on" in render(record)["text/plain"]


def test_the_text_view_of_a_large_launch_looks_at_its_ranks_only_when_one_changed(monkeypatch):
    """Outside a notebook (a script, a terminal) the text view is asked every wakeup whether
    a line is due: per node, it answers from the state counts, looking at ranks again only
    after a state or phase changed or when a young phase turns notable (a phase shorter than a
    second prints no line of its own)."""
    from notebook_accel.launch.views import text
    from notebook_accel.launch.views.text import TextView

    record = _big_record(1024)
    record.started -= 2.0
    out, looked = io.StringIO(), []
    monkeypatch.setattr(text, "_lasting_state", lambda status: looked.append(status) or "x")
    view = TextView(record, stream=out, clock=lambda: 0.0)
    view.update(record)
    assert out.getvalue().count("\n") == 1 and "1022 running, 2 failed" in out.getvalue()
    for _ in range(100):
        view.update(record)
    assert looked == [] and out.getvalue().count("\n") == 1  # nothing changed: no rank walked
    record.ranks[9].enter_phase("compiling", time.time() - 0.8)  # young: counted as running
    view.update(record)
    assert out.getvalue().count("\n") == 1
    time.sleep(0.3)  # now notable
    view.update(record)
    assert out.getvalue().count("\n") == 2 and "1 compiling (rank 9 for" in out.getvalue()
    record.ranks[3].state = "failed"
    view.update(record)
    assert out.getvalue().count("\n") == 3 and "3 failed" in out.getvalue().splitlines()[-1]
    assert looked == []


def test_a_large_launchs_summary_is_taken_in_a_little_each_wakeup_before_it_is_drawn(
        monkeypatch):
    """Taking in 1024 ranks at a launch's first redraw would cost that wakeup milliseconds:
    the wakeups before (the view is not shown yet) take them in a budget at a time."""
    from magics.view.live_view import LiveView
    from notebook_accel.launch.views import nodes

    record = _big_record(1024)
    monkeypatch.setattr(nodes, "PREPARE_BUDGET", 0.0)  # one chunk of ranks per wakeup
    drawn = []
    view = LiveView(record, display=lambda bundle: drawn.append(bundle), appear_after=3600)
    view.update(record)
    table = record.node_table
    assert table.taken == nodes.TAKE_IN_CHUNK and not table.in_order and drawn == []
    for _ in range(1024 // nodes.TAKE_IN_CHUNK - 1):
        view.update(record)
    assert table.taken == 1024 and len(table.in_order) == 128
    view.update(record)  # every rank in: now rows, a budget at a time
    assert len(table.rows) == 1
    assert sum(table.states.values()) == 1024 and table.abnormal == {300, 301}
    view.appear_after = 0.0
    view.update(record)  # the first redraw: what is made so far
    assert "node 37 (ranks 296-303)" in drawn[0]["text/plain"]
    assert "... and 127 more nodes" in drawn[0]["text/plain"] and len(table.rows) == 1


def test_the_slowest_rank_follows_the_progress_events_as_they_come():
    """Each node keeps its least-done rank from the events themselves: a rank falling behind
    takes its place; when that rank moves on, the node's ranks are asked again."""
    from notebook_accel.launch.views.nodes import node_table
    from notebook_accel.wire import Progress

    record = _big_record(64)
    table = node_table(record)
    assert table.slowest() == 0  # every rank at 40 of 100: the lowest rank
    record.apply(13, Progress({"n": 5, "total": 100}))
    assert table.slowest() == 13
    record.apply(13, Progress({"n": 90, "total": 100}))
    assert table.slowest() == 0 and table.least_done[1] == (0.4, 8)
    record.apply(42, Progress({"n": 10, "total": 1000}))  # a longer bar: by fraction done
    assert table.slowest() == 42


def test_a_wakeup_takes_what_is_ready_within_its_budget_and_leaves_the_rest_to_the_next(
        monkeypatch):
    """A burst of every rank's lines is taken over several wakeups, back to back: each takes
    what fits in its budget (one channel at least), the next comes at once and takes what was
    left first, and no line is lost or out of its rank's order."""
    import os

    from notebook_accel.launch import tuning
    from notebook_accel.launch.backends.base import WorkerHandle
    from notebook_accel.launch.supervision import supervisor as watching
    from notebook_accel.launch.views import NullView

    class Speaking(WorkerHandle):
        pid, exitcode = 100, None
        terminate = kill = dump_stacks = lambda self: None
        reap = lambda self, timeout: None  # noqa: E731

        def __init__(self, rank: int) -> None:
            self.rank = rank
            self.pipes = {name: os.pipe() for name in ("stdout", "stderr", "control", "events",
                                                        "alive")}
            for read, _ in self.pipes.values():
                os.set_blocking(read, False)
            os.write(self.pipes["stdout"][1], f"line 1 of {rank}\nline 2 of {rank}\n".encode())
            self.stdout_fd, self.stderr_fd = self.pipes["stdout"][0], self.pipes["stderr"][0]
            self.control_fd, self.events_fd = self.pipes["control"][0], self.pipes["events"][0]

        @property
        def sentinel(self) -> int:
            return self.pipes["alive"][0]

    monkeypatch.setattr(tuning, "WAKEUP_BUDGET", 0.0)
    handles = [Speaking(rank) for rank in range(8)]
    out = io.StringIO()
    record = LaunchRecord(world_size=8, num_processes=8, device_type="cpu", start_method="fork",
                          mixed_precision="no")
    supervisor = watching.Supervisor(handles, OutputRelay(show="all", stdout=out, stderr=out),
                                     record, view=NullView())
    try:
        supervisor._register()
        supervisor._poll(0.0)
        assert len(supervisor.channels.left) == 7 and supervisor._wait_for() == 0.0  # one read: 7 left
        wakeups = 1
        while supervisor.channels.left:
            supervisor._poll(supervisor._wait_for())
            wakeups += 1
        assert wakeups == 8 and supervisor._wait_for() > 0.0
        supervisor.relay.flush()
        for rank in range(8):
            assert f"[rank {rank}] line 1 of {rank}\n[rank {rank}] line 2 of {rank}\n" in out.getvalue()
    finally:
        for handle in handles:
            for fd in (fd for pair in handle.pipes.values() for fd in pair):
                os.close(fd)
