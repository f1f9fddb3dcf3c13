"""The pure parts of debugging: rank lists, grouped stacks, the prompt's turn-taking."""

from __future__ import annotations

import pytest

from notebook_accel.launch.control.debug_prompt import Prompts
from notebook_accel.launch.supervision.stack_groups import (
    group_stacks,
    headline,
    stacks_text,
    users_part,
)
from notebook_accel.launch.supervision.tracebacks import OURS
from notebook_accel.launch.views.rank_ranges import parse_ranks
from notebook_accel.wire import InputAsk, InputLine

WORKER = OURS[0] + "launch/worker/serve.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def test_ranks_as_typed():
    assert parse_ranks(1, 4) == (1,)
    assert parse_ranks("0,2-3", 4) == (0, 2, 3)
    assert parse_ranks([3, 0, 3], 4) == (0, 3)
    for bad in ("1-x", 4, "0,5", [], True):
        with pytest.raises(ValueError, match="ranks="):
            parse_ranks(bad, 4)


def test_stacks_grouped_by_place_innermost_first():
    waiting = ((WORKER, 70, "serve"), ("/nb/train.py", 3, "train"), ("/nb/train.py", 9, "step"),
               (TORCH, 3252, "all_reduce"))
    loading = ((WORKER, 70, "serve"), ("/nb/train.py", 5, "train"),
               ("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1, "__next__"))
    idle = ((WORKER, 67, "serve"),)
    stacks = {0: waiting, 2: waiting, 3: waiting, 1: loading, 4: idle}
    assert users_part(waiting) == waiting[1:]
    assert users_part(idle) == ()
    assert headline(users_part(waiting)) == "all_reduce <- step <- train"
    assert [ranks for ranks, _ in group_stacks(stacks)] == [[0, 2, 3], [1], [4]]
    text = stacks_text(stacks, silent=[5])
    assert text.splitlines()[0] == "ranks 0, 2, 3: all_reduce <- step <- train"
    assert "rank 1: __next__ <- train" in text and "rank 4: idle (no run)" in text
    assert "rank 5: no answer" in text and "serve.py" not in text


def test_stacks_and_a_timeouts_traceback_leave_out_the_line_that_runs_a_cell():
    """A %%accelerate cell's body runs from the cell's first line (``exec`` in a ``<module>``
    of the same file): stacks start at the user's own line, as a failure's traceback does."""
    from notebook_accel.launch.supervision.tracebacks import main_thread_stack

    cell = "/tmp/ipykernel_1/3.py"
    runs_it = ((WORKER, 70, "serve"), (OURS[1] + "cell/runner.py", 140, "_in_worker_scope"),
               (cell, 1, "<module>"), (cell, 6, "<module>"), ("/nb/train.py", 9, "step"),
               (TORCH, 3252, "all_reduce"))
    assert users_part(runs_it) == runs_it[3:]
    assert headline(users_part(runs_it)) == "all_reduce <- step <- <module>"
    assert f'File "{cell}", line 1,' not in stacks_text({0: runs_it})
    dump = ("Current thread 0x00007f01 (most recent call first):\n"
            + "".join(f'  File "{f}", line {n} in {name}\n' for f, n, name in reversed(runs_it[2:])))
    traceback = main_thread_stack(dump)
    assert f'File "{cell}", line 6, in <module>' in traceback
    assert f'File "{cell}", line 1, in <module>' not in traceback


class _Handle:
    def __init__(self):
        self.sent = []

    def command(self, message):
        self.sent.append(message)
        return True


class _Worker:
    def __init__(self, rank):
        self.rank, self.handle = rank, _Handle()


def test_one_rank_has_the_prompt_until_its_session_ends(monkeypatch):
    typed = iter(["p x", "c", "q"])
    shown = []
    monkeypatch.setattr("builtins.input", lambda prompt: (shown.append(prompt), next(typed))[1])
    prompts, one, two = Prompts(), _Worker(1), _Worker(2)
    prompts.ask(two, InputAsk("(Pdb rank 2) "))
    prompts.ask(one, InputAsk("(Pdb rank 1) "))
    assert prompts.serve(lambda worker: None)  # rank 1 first (lowest), and keeps the prompt
    prompts.ask(one, InputAsk("(Pdb rank 1) "))
    assert prompts.serve(lambda worker: None)
    assert not prompts.serve(lambda worker: None)  # rank 1 runs on: rank 2 still waits
    prompts.end(1)
    assert prompts.serve(lambda worker: None)
    assert shown == ["(Pdb rank 1) ", "(Pdb rank 1) ", "(Pdb rank 2) "]
    assert one.handle.sent == [InputLine("p x"), InputLine("c")]
    assert two.handle.sent == [InputLine("q")]


def test_a_stack_answer_left_unread_by_an_earlier_run_is_not_taken_for_this_runs():
    """A rank answers a StackAsk after its run ended; the answer waits in the channel and
    the next run's supervisor reads it first: it must not pass for where the rank is now."""
    import os
    from types import SimpleNamespace

    from notebook_accel.launch.supervision.watched import Worker
    from notebook_accel.launch.supervision.worker_stacks import stack_ask
    from notebook_accel.wire import FrameReader, Stack

    stale = stack_ask()  # asked during an earlier run
    read, write = os.pipe()
    sent = []
    handle = SimpleNamespace(rank=1, frames=lambda name: FrameReader(read),
                             command=lambda ask: sent.append(ask) or True)
    try:
        worker = Worker(handle)
        idle = Stack((), 0, stale.ask)
        assert not worker.answered(idle) and worker.stack is None  # no request of this run yet
        assert worker.ask_stack()
        assert not worker.answered(idle) and worker.stack is None  # still the earlier run's
        now = Stack((("cell.py", 3, "train"),), 5, sent[0].ask)
        assert worker.answered(now) and worker.stack is now
        assert sent[0].ask > stale.ask
    finally:
        os.close(read)
        os.close(write)


def test_hang_after_is_one_launch_option_of_the_table():
    """notebook_launcher, WorkerPool and %%accelerate take it, checked once, by the table."""
    from magics.accelerate_magic import AccelerateMagics
    from magics.cell.arguments import launch_options
    from notebook_accel.launch.planning.plan import make_plan
    from notebook_accel.launch.planning.request import LaunchRequest, door_options
    from notebook_accel.launch.supervision.verdicts.hangs import HANG_AFTER

    parser = AccelerateMagics.accelerate.parser
    assert launch_options(parser.parse_args(["--hang-after", "2.5"]))["hang_after"] == 2.5
    assert "hang_after" not in launch_options(parser.parse_args([]))  # unset: the default, not None
    assert "hang_after" in door_options("WorkerPool") and HANG_AFTER == 60.0
    common = dict(num_processes=2, mixed_precision="no", use_port=None, master_addr="127.0.0.1",
                  node_rank=0, num_nodes=1, start_method="fork", timeout=None, output="all",
                  return_all=False, max_restarts=0, device="cpu")
    assert make_plan(**common).hang_after == HANG_AFTER
    assert make_plan(**common, hang_after=3).hang_after == 3.0
    assert make_plan(**common, hang_after=None).hang_after is None
    with pytest.raises(ValueError, match=r"hang_after=0 must be a positive number of seconds"):
        LaunchRequest.from_keywords("WorkerPool", {"hang_after": 0})  # checked at its door


def test_a_stack_dump_is_kept_out_of_the_cell_and_the_lines_around_it_are_shown():
    """A one-off launch's rank dumps its stacks to its stderr while it runs on: held, the
    dump parsed for its main thread, the rank's other lines shown after all."""
    import io

    from notebook_accel.launch.supervision.tracebacks import dump_frames, is_dump_line
    from notebook_accel.launch.views.output import OutputRelay

    out, err = io.StringIO(), io.StringIO()
    relay = OutputRelay(stdout=out, stderr=err)
    relay.watch({0: "rank 0"})
    relay.feed(0, "stderr", b"before\n")
    marks = {"stdout": relay.line_count(0, "stdout"), "stderr": relay.line_count(0, "stderr")}
    relay.hold(0)
    relay.feed(0, "stdout", b"meanwhile\n")
    relay.feed(0, "stderr", (
        b'Thread 0x00007f00 (most recent call first):\n'
        b'  File "/usr/lib/python3.11/threading.py", line 320 in wait\n\n'
        b'Current thread 0x00007f01 (most recent call first):\n'
        b'  File "/x/distributed_c10d.py", line 3252 in all_reduce\n'
        b'  File "/tmp/ipykernel_1/2.py", line 7 in train\n'))
    relay.flush()
    assert "meanwhile" not in out.getvalue() and "Thread" not in err.getvalue()
    dump = relay.tail(0, since=marks["stderr"])
    assert dump_frames(dump) == (("/tmp/ipykernel_1/2.py", 7, "train"),
                                 ("/x/distributed_c10d.py", 3252, "all_reduce"))
    relay.release(0, marks, drop=is_dump_line)
    relay.feed(0, "stderr", b"after\n")
    relay.flush()
    assert out.getvalue() == "[rank 0] meanwhile\n"
    assert err.getvalue() == "[rank 0] before\n[rank 0] after\n"
