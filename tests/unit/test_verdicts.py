"""The supervisor's verdicts, each asked directly of made-up ranks (no process, no pipe): the
root cause, a timeout's error, a lone collective, the stop's line, the hang watch; and the
pieces they share (RankState, WatchSettings)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from notebook_accel.launch.supervision.verdicts.hangs import HangWatch
from notebook_accel.launch.supervision.verdicts.interrupted import interrupted_line
from notebook_accel.launch.supervision.verdicts.lone_collective import lone_collective
from notebook_accel.launch.supervision.verdicts.root_cause import (
    ENDED_BY_US,
    describe_exit,
    root_cause,
)
from notebook_accel.launch.supervision.verdicts.timeout import timeout_error
from notebook_accel.launch.supervision.watched import WatchSettings, Worker
from notebook_accel.launch.views.record import LaunchRecord, RankState, RankStatus
from notebook_accel.wire import FailureRecord, Stack


def _rank(rank, exitcode=None, persistent=False, ended=None, answers=True):
    handle = SimpleNamespace(
        rank=rank, pid=1000 + rank, exitcode=exitcode, persistent=persistent, node=0,
        label=f"rank {rank}", frames=lambda name: None, describe_end=lambda: ended,
        sent=[], command=lambda ask: answers)
    handle.command = lambda ask: handle.sent.append(ask) or answers
    return Worker(handle)


def _record(world):
    record = LaunchRecord(world_size=world, num_processes=world, device_type="cpu",
                          start_method="fork", mixed_precision="no")
    for rank in range(world):
        record.ranks[rank] = RankStatus(rank=rank)
    return record


def _raised(rank, when, secondary=False, exc="RuntimeError"):
    return FailureRecord(rank=rank, pid=1000 + rank, exitcode=None, exc_type=exc,
                         headline=f"{exc}: on rank {rank}", traceback=f"tb {rank}",
                         timestamp=when, secondary=secondary)


def _no_tail(rank):
    return ""


def test_the_earliest_own_failure_is_the_cause_before_deaths_and_secondary_ones():
    ranks = [_rank(r) for r in range(4)]
    ranks[0].error = _raised(0, 10.0, secondary=True)  # a broken collective: a consequence
    ranks[1].error = _raised(1, 12.0)
    ranks[2].error = _raised(2, 11.0)  # the earliest of its own
    ranks[3].exited, ranks[3].exit_time, ranks[3].handle.exitcode = True, 9.0, -9
    record = _record(4)
    error = root_cause(ranks, record, _no_tail)
    assert error.rank == 2 and record.root_cause == 2
    assert str(error).startswith("rank 2 failed: RuntimeError: on rank 2")
    assert [f.rank for f in error.other_failures] == [1, 3, 0]  # own, then deaths, then secondary
    assert error.other_failures[1].headline == "was killed by SIGKILL"


def test_a_death_without_a_report_is_the_cause_and_its_stderr_says_why():
    ranks = [_rank(0), _rank(1, exitcode=3)]
    ranks[1].exited, ranks[1].exit_time = True, 5.0
    ranks[0].stopped = True  # we stopped it: listed as such, not headlined
    tails = {1: "Fatal Python error: Segmentation fault\nsomething else"}
    error = root_cause(ranks, _record(2), lambda rank: tails.get(rank, ""))
    assert error.rank == 1 and error.exitcode == 3
    assert str(error).startswith("rank 1 exited with code 3 without reporting an error")
    assert "Segmentation fault" in error.failure.traceback
    assert [(f.rank, f.headline) for f in error.other_failures] == [(0, "stopped")]


def test_a_pool_rank_the_stop_had_to_kill_is_said_as_ours():
    ranks = [_rank(0, persistent=True), _rank(1, exitcode=-9, persistent=True)]
    ranks[0].error = _raised(0, 1.0)
    ranks[1].stopped, ranks[1].exited = True, True
    error = root_cause(ranks, _record(2), _no_tail)
    (other,) = error.other_failures
    assert other.headline.startswith(f"{ENDED_BY_US}, as it did not answer the interrupt within 1.5 s")


def test_with_no_failure_seen_the_rank_marked_failed_is_named():
    ranks = [_rank(0, exitcode=0), _rank(1, exitcode=0)]
    for w in ranks:
        w.exited, w.returned = True, True
    record = _record(2)
    record.ranks[1].state = RankState.FAILED
    assert root_cause(ranks, record, _no_tail).rank == 1


@pytest.mark.parametrize(("code", "said"), [
    (-9, "was killed by SIGKILL"), (-200, "was killed by signal 200"),
    (0, "exited (code 0) before its function returned (os._exit() or a killed interpreter)"),
    (1, "exited with code 1 without reporting an error")])
def test_an_exit_is_said_in_words(code, said):
    assert describe_exit(code) == said


_DUMP = """Current thread 0x00007f (most recent call first):
  File "/home/u/train.py", line {line} in {name}
"""


def test_a_timeout_groups_the_ranks_by_stack_and_shows_the_biggest_groups():
    ranks = [_rank(r) for r in range(5)]
    dumps = {0: _DUMP.format(line=3, name="step"), 1: _DUMP.format(line=3, name="step"),
             2: _DUMP.format(line=9, name="load"), 3: _DUMP.format(line=3, name="step"),
             4: _DUMP.format(line=20, name="save")}
    error = timeout_error(ranks, ranks[0], dumps, elapsed=12.0, timeout=10.0, at=100.0)
    assert str(error).startswith("timed out after 12.0 s (timeout=10 s): ranks 0-4 stopped "
                                 "while still running")
    shown = error.remote_traceback
    assert shown.startswith("ranks 0, 1, 3 were here when stopped:\nTraceback (most recent call "
                            "last):\n  File \"/home/u/train.py\", line 3, in step")
    assert "rank 2 was here when stopped:" in shown  # (ties: in the ranks' order)
    assert shown.endswith("\n\nrank 4: 1 other stacks (all in .failure.traceback)")
    assert error.failure.traceback.count("here when stopped") == 3  # every stack kept
    assert error.failure.timestamp == 100.0 and error.rank == 0


def test_a_rank_entering_a_collective_the_others_never_join_fails_with_the_cause():
    worker = _rank(1)
    frames = (("/home/u/cell.py", 4, "train"),)
    assert lone_collective(worker, Stack(frames, 7), 7, {1}, 4) is None  # no new collective
    assert lone_collective(worker, Stack(frames, 8), None, {1}, 4) is None  # not a subset run
    failure = lone_collective(worker, Stack(frames, 8), 7, {1}, 4)
    assert failure.rank == 1 and failure.headline.startswith(
        "entered a collective of the whole process group (")
    assert "(train), which ranks 0, 2, 3 never join in a run on rank 1;" in failure.headline
    worker.error = failure
    assert lone_collective(worker, Stack(frames, 9), 7, {1}, 4) is None  # once


def test_the_stop_line_says_what_a_pool_kept_and_what_a_launch_stopped():
    launch = [_rank(0), _rank(1)]
    assert interrupted_line(launch, None) == "stopped 2 workers"
    pool = [_rank(0, persistent=True), _rank(1, persistent=True)]
    assert interrupted_line(pool, None) == ("interrupted the run on 2 ranks at the same point; "
                                            "the pool keeps its state")
    assert interrupted_line(pool, "rank 1 is stuck") == (
        "interrupted the run on 2 ranks (rank 1 is stuck, so every rank was stopped at once); "
        "the pool keeps its state")
    pool[1].exited = True
    assert interrupted_line(pool, None) == ("interrupted the run; rank 1 was ended; what the "
                                            "pool did then is said above")


def test_the_hang_watch_marks_a_silent_rank_says_it_once_and_a_move_clears_it(monkeypatch):
    from notebook_accel.launch.supervision.verdicts import hangs

    clock = [1000.0]
    monkeypatch.setattr(hangs.time, "monotonic", lambda: clock[0])
    record, said = _record(2), []
    ranks = [_rank(0, persistent=True), _rank(1, persistent=True)]
    watch = HangWatch([0, 1], 5.0, record, said.append)
    clock[0] += 3.0
    watch.moved(0)
    clock[0] += 3.0  # rank 1 silent for 6 s, rank 0 for 3 s
    watch.look(ranks)
    assert record.ranks[1].state == RankState.NO_PROGRESS == "no progress"
    assert record.ranks[0].state == RankState.STARTING and said == []  # asked, not answered yet
    assert all(w.handle.sent for w in ranks)  # every running rank asked for its stack
    for w in ranks:
        w.answered(Stack((("/home/u/cell.py", 2, "train"),), 5, w.handle.sent[-1].ask, ()))
    clock[0] += 1.0
    watch.look(ranks)
    assert len(said) == 1 and said[0].startswith(
        "no progress (no output, event or collective) for 5 s on rank 1")
    watch.moved(1)
    assert record.ranks[1].state == RankState.RUNNING
    assert watch.cut_unreachable(ranks) is None  # rank 1 moves: the cut may be reached


def test_rank_states_read_as_their_words_and_phases_become_states():
    status = RankStatus(rank=0)
    assert f"{status.state}" == str(status.state) == "starting"
    status.enter_phase("compiling", time.time())
    assert status.state is RankState.COMPILING
    status.enter_phase("a phase of its own", time.time())
    assert status.state == "a phase of its own"  # a worker's own phase: shown by its name
    status.state = RankState.FAILED
    status.enter_phase(None, time.time())
    assert status.state is RankState.FAILED  # an ended rank keeps its state


def test_the_watch_settings_are_the_plans():
    plan = SimpleNamespace(timeout=30.0, stop_wait=2.0, hang_after=None)
    settings = WatchSettings.of(plan, {0: 4})
    assert settings == WatchSettings(timeout=30.0, stop_wait=2.0, hang_after=None,
                                     collectives_before={0: 4})
    assert WatchSettings().hang_after == 60.0 and WatchSettings().timeout is None
