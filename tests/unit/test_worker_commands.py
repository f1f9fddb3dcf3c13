"""A pool worker's commands channel (``stop_cut.Commands``): the main thread reads it between
runs; a run that lasts lends it to the reader thread, and its end takes it back."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest

from notebook_accel import wire
from notebook_accel.launch.worker import stop_cut
from notebook_accel.wire import Run, StackAsk


@pytest.fixture
def channel(monkeypatch):
    """(commands, send, answered): ``answered`` lists (ask number, the answering thread)."""
    read_end, write_end = os.pipe()
    answered: list[tuple[int, int]] = []
    got = threading.Event()

    def answer(asked: StackAsk) -> None:
        answered.append((asked.ask, threading.get_ident()))
        got.set()

    def send(*messages) -> None:
        wire.send(write_end, *messages)

    monkeypatch.setattr(stop_cut, "LOOK_EVERY", 0.01)
    commands = stop_cut.Commands(read_end, lambda message: None, {StackAsk: answer})
    yield commands, send, answered, got, write_end
    with contextlib.suppress(OSError):  # the channel's end: the loop, lent or not, reads it
        os.close(write_end)
    while commands.next() is not None:
        pass
    os.close(read_end)  # (the reader thread, lent nothing now, never looks at it again)


def test_between_runs_the_main_thread_reads_and_answers_itself(channel):
    commands, send, answered, _, _ = channel
    send(StackAsk(1), Run(b"payload", True))
    assert commands.next().payload == b"payload"
    assert answered == [(1, threading.get_ident())]


def test_a_run_that_lasts_lends_the_channel_and_its_end_takes_it_back(channel):
    commands, send, answered, got, _ = channel
    send(Run(b"one", False))
    assert commands.next().payload == b"one"
    time.sleep(0.1)  # the run lasts: the reader thread took the loan
    send(StackAsk(2))
    assert got.wait(2)
    reader = answered[0][1]
    assert answered == [(2, reader)] and reader != threading.get_ident()
    send(Run(b"two", False))  # (sent before the run's end: the reader keeps it for next())
    time.sleep(0.05)
    assert commands.next().payload == b"two"
    time.sleep(0.1)  # run "two" lasts too; then it ends, and the loop waits for the next run
    taken: list[tuple[int, bytes]] = []
    loop = threading.Thread(target=lambda: taken.append((threading.get_ident(), commands.next().payload)))
    loop.start()
    time.sleep(0.05)
    send(StackAsk(3), Run(b"three", False))
    loop.join(2)
    assert taken == [(loop.ident, b"three")] and answered[-1] == (3, loop.ident)  # not the reader


def test_a_short_run_wakes_no_second_thread(channel, monkeypatch):
    commands, send, answered, _, _ = channel
    monkeypatch.setattr(stop_cut, "LOOK_EVERY", 10.0)
    time.sleep(0.05)  # the reader thread is asleep for 10 s now
    for n in range(20):
        send(Run(b"x", False), StackAsk(n))
        assert commands.next().payload == b"x"
    send(Run(b"last", False))
    assert commands.next().payload == b"last"
    assert {thread for _, thread in answered} == {threading.get_ident()} and len(answered) == 20


@pytest.mark.parametrize("lent", [False, True])
def test_the_channel_closed_ends_the_loop_lent_or_not(channel, lent):
    commands, send, _, _, write_end = channel
    if lent:
        send(Run(b"one", False))
        commands.next()
        time.sleep(0.1)
    os.close(write_end)
    assert commands.next() is None
