"""A background run's parts without workers: its kept output, its thread's output routing, its
own stop presses (apart from the notebook's stop button)."""

from __future__ import annotations

import io
import sys
import threading

import pytest

from notebook_accel.launch.control import interrupts
from notebook_accel.launch.control.interrupts import (
    LaunchInterrupted,
    StopPresses,
    check_interrupt,
    stopped_by,
)
from notebook_accel.launch.pools.run_handle import RunHandle
from notebook_accel.launch.pools.thread_output import routed_to
from notebook_accel.launch.views.run_output import RunOutput


def test_output_is_numbered_and_read_once_from_any_point():
    output = RunOutput()
    output.stdout.write("[rank 0] 1\n")
    output.stderr.write("[rank 1] 2\n")
    items, number, dropped = output.since(0, timeout=0)
    assert items == [("stdout", "[rank 0] 1\n"), ("stderr", "[rank 1] 2\n")]
    assert (number, dropped) == (2, 0)
    assert output.since(number, timeout=0)[0] == []  # nothing new: nothing twice
    output.stdout.write("[rank 0] 3\n")
    assert output.since(number, timeout=0)[0] == [("stdout", "[rank 0] 3\n")]


def test_output_keeps_the_newest_bytes_and_counts_what_it_dropped():
    output = RunOutput(keep=30)
    for i in range(10):
        output.stdout.write(f"line {i:03d}\n")  # 9 bytes each: 3 kept
    items, number, dropped = output.since(0, timeout=0)
    assert [text for _, text in items] == ["line 007\n", "line 008\n", "line 009\n"]
    assert (number, dropped) == (10, 7)
    assert (output.dropped_lines, output.dropped_bytes) == (7, 63)


def test_a_reader_waiting_for_output_wakes_when_it_comes_or_ends():
    output = RunOutput()
    threading.Timer(0.05, output.stdout.write, ("late\n",)).start()
    items, _, _ = output.since(0, timeout=5)
    assert items == [("stdout", "late\n")]
    threading.Timer(0.05, output.end).start()
    assert output.since(1, timeout=5)[0] == [] and output.ended


def test_a_routed_thread_writes_to_its_targets_and_others_are_untouched(capsys):
    mine = io.StringIO()
    original = sys.stdout

    def in_thread():
        with routed_to(mine, mine):
            print("from the run")
            print("a note", file=sys.stderr)
            seen.set()
            leave.wait(5)

    seen, leave = threading.Event(), threading.Event()
    thread = threading.Thread(target=in_thread)
    thread.start()
    seen.wait(5)
    print("from the cell")  # the main thread, while the run's thread is routed
    leave.set()
    thread.join(5)
    assert mine.getvalue() == "from the run\na note\n"
    assert capsys.readouterr().out == "from the cell\n"
    assert sys.stdout is original  # the proxy left with the last routed thread


def test_a_thread_of_its_own_answers_only_its_presses():
    """The notebook's stop button (the main thread's deferral) never stops a background run,
    and the run's presses never reach the main thread."""
    presses = StopPresses()
    outcome = []

    def run():
        with stopped_by(presses):
            try:
                check_interrupt()
                outcome.append("not stopped by the main thread's press")
                presses.press()
                check_interrupt("cancelled")
            except LaunchInterrupted as error:
                outcome.append(str(error))

    with interrupts.deferred_interrupts():
        if interrupts._active is None:
            pytest.skip("SIGINT has a custom handler here")
        interrupts._active.presses = 1  # the stop button, pressed for a cell of the main thread
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(5)
        assert interrupts.take_interrupt()  # still the main thread's
    assert outcome == ["not stopped by the main thread's press", "cancelled"]


def test_a_handle_says_its_state_and_raises_its_failure_once_to_the_pool():
    handle = RunHandle("cell [3]", "%accelerate watch")
    assert not handle.done() and handle.state().startswith("running")
    with pytest.raises(TimeoutError, match=r"cell \[3\] is still running after 0.01 s"):
        handle.result(timeout=0.01)
    assert handle.cancel(timeout=0) and handle.presses.presses == 1  # pressed; it has not ended
    error = RuntimeError("rank 1 failed")
    handle.finish(None, error)
    assert handle.done() and handle.state() == "failed"
    assert handle.unreported_failure() is error
    assert handle.unreported_failure() is None  # told once
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        handle.result()  # the outcome itself, always


def test_watch_replays_the_kept_output_then_returns_the_value(capsys):
    handle = RunHandle("a background run of f", "")
    handle.output.stdout.write("[rank 0] a\n")
    threading.Timer(0.05, lambda: (handle.output.stdout.write("[rank 0] b\n"),
                                   handle.finish(42, None))).start()
    assert handle.watch() == 42
    assert capsys.readouterr().out == "[rank 0] a\n[rank 0] b\n"
    cancelled = RunHandle("cell [5]", "")
    cancelled.finish(None, LaunchInterrupted("interrupted the run on 2 ranks at the same point"))
    assert cancelled.watch() is None and cancelled.state() == "cancelled"
    assert "cell [5] was cancelled: interrupted the run" in capsys.readouterr().err
