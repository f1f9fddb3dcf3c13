"""Debugging a pool from the notebook, in a real kernel: a cell on some ranks, a post-mortem
and ``breakpoint()`` driven through Jupyter's stdin channel, the stacks of a hung job."""

from __future__ import annotations

import re
import time

import pytest

from tests.kernel_harness import Kernel, worker_processes

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the kernel's pool outlives each test: conftest checks for leaks per module


@pytest.fixture(scope="module")
def k():
    """One kernel with a 2-rank pool (ranks silent for 2 s are marked)."""
    kernel = Kernel()
    kernel.ok("%load_ext notebook_accel")
    kernel.ok("%accelerate start -n 2 --hang-after 2")
    yield kernel
    kernel.shutdown()


def answers(*lines):
    """An ``on_input`` that types ``lines`` in turn, keeping the prompts it saw."""
    typed = iter(lines)
    prompts = []

    def on_input(prompt, result):
        prompts.append((prompt, time.time()))
        return next(typed)

    on_input.prompts = prompts
    return on_input


def reduce_is_right(k):
    out = k.ok("%%accelerate\nimport torch, torch.distributed as dist\nt = torch.tensor([dist.get_rank() + 1.0])\ndist.all_reduce(t)\n"
               "t.item()")
    assert "3.0" in str(out.outputs), out


def test_a_post_mortem_on_the_failing_rank(k):
    pids = [p.pid for p in worker_processes()]
    nothing = k.run("%accelerate debug")
    assert "UsageError: nothing to debug: no cell on the pool has failed" in nothing.stderr
    failed = k.run("""%%accelerate
import torch, torch.distributed as dist
def inner(a):
    local_value = a * 10
    raise ValueError("boom on rank 1")
def outer():
    caller_value = dist.get_rank() + 100
    if dist.get_rank() == 1:
        inner(caller_value)
outer()
""")
    assert "rank 1 failed: ValueError: boom on rank 1" in failed.error["evalue"]
    assert failed.error["traceback"][-1] == (  # the next step, said where the failure is
        "%accelerate debug opens pdb on rank 1, at the frame that raised (p NAME, up, l, q)")
    typing = answers("p local_value", "up", "p caller_value", "q")
    result = k.collect(k.execute("%accelerate debug"), timeout=30, on_input=typing)
    assert result.error is None, result.traceback
    assert [prompt for prompt, _ in typing.prompts] == ["(Pdb rank 1) "] * 4
    assert "[rank 1] 1010" in result.stdout and "[rank 1] 101\n" in result.stdout
    # where pdb stands reads as in a traceback, not as the kernel's temporary file
    assert "[rank 1] > Cell In[" in result.stdout and ", line 5, in inner()" in result.stdout
    assert ", line 9, in outer()" in result.stdout, result.stdout  # after `up`
    assert "ipykernel_" not in result.stdout, result.stdout
    assert "[rank 0]" not in result.stdout  # rank 0 was not disturbed
    both = k.ok("%%accelerate\nprint('alive', callable(outer))")
    assert "[rank 0] alive True" in both.stdout and "[rank 1] alive True" in both.stdout
    reduce_is_right(k)
    assert sorted(p.pid for p in worker_processes()) == sorted(pids)  # the same workers


def test_breakpoint_on_rank_one_in_a_loop(k):
    typing = answers("p value", "c")
    result = k.collect(k.execute("""%%accelerate
import time
total = 0
for i in range(5):
    value = i * (dist.get_rank() + 1)
    if dist.get_rank() == 1 and i == 2:
        print("reaching", time.time(), flush=True)
        breakpoint()
    total += value
t = torch.tensor([float(total)])
dist.all_reduce(t)
t.item()
"""), timeout=60, on_input=typing)
    assert result.error is None, result.traceback
    reached = float(result.stdout.split("[rank 1] reaching ")[1].split()[0])
    assert typing.prompts[0][0] == "(Pdb rank 1) "
    assert typing.prompts[0][1] - reached < 2.0
    assert "[rank 1] 4\n" in result.stdout  # rank 1's value (i * 2)
    assert "30.0" in str(result.outputs)  # 10 + 20: the job's normal result


def test_a_debugger_session_shows_no_live_table_inside_its_transcript(k):
    """The user takes their time at the prompt (longer than the live view waits before it
    appears): no table lands between a pdb command and its answer, in a post-mortem (a run
    on rank 1 only) or at a breakpoint() during a run on both ranks."""
    def slowly(*lines):
        typing = answers(*lines)

        def on_input(prompt, result):
            shown[len(typing.prompts)] = len(result.outputs)
            time.sleep(1.3)
            return typing(prompt, result)

        shown = {}
        on_input.shown = shown
        return on_input

    failed = k.run("%%accelerate\nimport torch.distributed as dist\nif dist.get_rank() == 1:\n"
                   "    raise ValueError('boom')\n")
    assert failed.error is not None
    typing = slowly("p 6 * 7", "w", "q")
    debugged = k.collect(k.execute("%accelerate debug"), timeout=60, on_input=typing)
    assert "[rank 1] 42" in debugged.stdout, debugged.stdout
    assert debugged.outputs == [], [m["content"]["data"]["text/plain"] for m in debugged.outputs]
    typing = slowly("p i", "c")
    paused = k.collect(k.execute("""%%accelerate
import time
for i in range(3):
    if dist.get_rank() == 1 and i == 1:
        breakpoint()
    time.sleep(0.1)
"""), timeout=60, on_input=typing)
    assert paused.error is None, paused.traceback
    assert "[rank 1] 1" in paused.stdout
    assert paused.outputs == [], [m["content"]["data"]["text/plain"] for m in paused.outputs]


def test_the_stop_button_at_the_prompt_ends_the_job(k):
    pids = sorted(p.pid for p in worker_processes())
    at = {}

    def interrupt(prompt, result):
        at["t"] = time.monotonic()
        k.manager.interrupt_kernel()
        return None

    result = k.collect(k.execute("""%%accelerate
import time, torch, torch.distributed as dist
for i in range(300):
    if dist.get_rank() == 1 and i == 3:
        breakpoint()
    time.sleep(0.1)
"""), timeout=60, on_input=interrupt)
    assert time.monotonic() - at["t"] < 2.0
    assert result.error is not None and "debugger's prompt" in result.traceback, result
    reduce_is_right(k)
    assert sorted(p.pid for p in worker_processes()) == pids


def test_a_cell_on_rank_one_only(k):
    result = k.ok("%%accelerate --ranks 1\nprint('here', dist.get_rank())\ndist.get_rank() * 10")
    assert "[rank 1] here 1" in result.stdout and "[rank 0]" not in result.stdout
    assert "10" in str(result.outputs)
    k.ok("%%accelerate --ranks 1\nonly_on_one = 7")  # lives on rank 1 only
    again = k.ok("%%accelerate --ranks 1\nonly_on_one + 1")
    assert "8" in str(again.outputs)
    status = k.ok("%accelerate status").stdout
    assert "on some ranks only (cells with --ranks): only_on_one (rank 1)" in status, status
    everywhere = k.run("%%accelerate\nonly_on_one")  # rank 0 has no such name: said before it runs
    assert everywhere.error is not None and "only_on_one" in everywhere.error["evalue"], everywhere
    assert "[rank 1]" not in everywhere.stdout
    started = time.monotonic()
    lone = k.run("%%accelerate --ranks 1\ndist.all_reduce(torch.ones(1))")
    assert time.monotonic() - started < 10
    assert "entered a collective of the whole process group (all_reduce" in lone.error["evalue"]
    assert "rank 0 never joins" in lone.error["evalue"]
    # its group is never reused: rank 1, ended inside the collective, is healed from rank 0
    assert "The pool healed: rank 1 was replaced" in lone.error["evalue"]
    assert "%accelerate debug" not in lone.traceback  # its frames went with it
    gone = k.run("%accelerate debug")
    assert ("UsageError: rank 1's failure in cell [" in gone.stderr
            and "cannot be debugged any more: rank 1's worker was replaced since"
            in gone.stderr), gone.stderr
    reduce_is_right(k)


def test_a_hung_rank_is_marked_and_the_stacks_are_shown_grouped(k):
    result = k.ok("""%%accelerate
import time, torch, torch.distributed as dist
if dist.get_rank() == 1:
    time.sleep(4)
dist.all_reduce(torch.ones(1))
""")
    assert "no progress (no output, event or collective) for 2 s" in result.stderr
    stacks = result.stderr.split("every rank's stack now:")[1]
    assert "rank 0: all_reduce <- <module>\n" in stacks  # rank 0 waits in the collective
    assert "rank 1: <module>\n" in stacks and "time.sleep(4)" in stacks  # rank 1 sleeps
    # the user's frames only, as in a failure's traceback: not the %%accelerate line first
    assert "%%accelerate" not in stacks and "line 1, in <module>" not in stacks, stacks
    # above the stacks, the ranks' flight recorders said as a disagreement at a number
    said = result.stderr.split("last collectives: ")[1].split("every rank's stack now:")[0]
    assert said.startswith("not every rank reached all_reduce #"), said
    assert re.search(r"rank 0 waits in all_reduce #\d+ \(float32\[1\]; Cell In\[\d+\], line 5", said), said
    assert re.search(r"rank 1 never reached it: it is at Cell In\[\d+\], line 4, in <module> "
                     r"\(time.sleep\(4\)\), 1 collective short", said), said
    started = time.monotonic()
    idle = k.ok("%accelerate stacks")
    assert time.monotonic() - started < 2.0
    assert "ranks 0, 1: idle (no run)" in idle.stdout
    table = k.ok("%accelerate collectives --last 2").stdout  # the same all_reduce, both ranks
    assert table.startswith("group default (the last 2):\n#  ranks 0, 1\n"), table
    assert re.search(r"all_reduce float32\[1\] Cell In\[\d+\]:5\n", table), table
    assert "does not use --last" in k.run("%accelerate stacks --last 2").stderr


MAIN_ONLY = """
import time, torch
from notebook_accel import Accelerator
accelerator = Accelerator()
loss = torch.tensor([1.0 + accelerator.process_index])
if accelerator.is_main_process:
    mean_loss = accelerator.reduce(loss, "mean")
{rank_1_goes_on}
"""


def test_a_collective_under_is_main_process_is_named_and_check_collectives_raises_instead(k):
    """The commonest real bug: a collective inside ``if accelerator.is_main_process:``. The
    hang block says rank 0 waits in all_reduce #N and rank 1 never reached it, where it is
    instead; with --check-collectives the ranks raise on their own lines instead of hanging."""
    pressed = {}

    def press_once_said(result):
        if "every rank's stack now" in result.stderr and "at" not in pressed:
            pressed["at"] = time.monotonic()
            k.manager.interrupt_kernel()

    hung = k.collect(k.execute("%%accelerate" + MAIN_ONLY.format(
        rank_1_goes_on="time.sleep(60)  # rank 1 goes on with its step")), timeout=90,
        on_output=press_once_said)
    assert pressed, (hung.error, hung.stdout, hung.stderr)
    said = hung.stderr.split("last collectives: ")[1].split("every rank's stack now:")[0]
    number = re.search(r"^not every rank reached all_reduce #(\d+) \(group default\):", said)
    assert number, said
    assert re.search(rf"rank 0 waits in all_reduce #{number[1]} \(float32\[1\]; Cell In\[\d+\], "
                     r"line 7, in <module>\)", said), said
    assert re.search(r"rank 1 never reached it: it is at Cell In\[\d+\], line 8, in <module> "
                     r"\(time.sleep\(60\)  # rank 1 goes on with its step\), 1 collective short",
                     said), said
    reduce_is_right(k)
    started = time.monotonic()
    checked = k.run("%%accelerate --fresh -n 2 --check-collectives" + MAIN_ONLY.format(
        rank_1_goes_on="accelerator.wait_for_everyone()"))
    assert time.monotonic() - started < 60  # raised, not hung
    error = checked.error["evalue"] + "\n" + checked.traceback
    assert "DistributedOperationException" in error, error
    assert "check_collectives: the ranks of the default group called different collectives" in error
    assert "rank 0: all_reduce(float32[1])" in error and "rank 1: barrier()" in error, error
    own_line = {"rank 0": "line 7", "rank 1": "line 8"}[re.search(r"rank \d", checked.error["evalue"])[0]]
    assert re.findall(r"Cell In\[\d+\], line \d+", checked.traceback)[-1].endswith(own_line), error


def test_a_busy_pools_collectives_show_the_one_a_rank_waits_in(k, tmp_path):
    """``%accelerate collectives`` while a background cell runs: rank 0 waits in an all_reduce
    that rank 1, busy elsewhere, has not joined: the live recorder says so."""
    k.ok(f"GO = {str(tmp_path / 'go')!r}")
    k.ok("""%%accelerate --background
import os, time, torch, torch.distributed as dist
if dist.get_rank() == 1:
    while not os.path.exists(GO):
        time.sleep(0.05)
dist.all_reduce(torch.ones(5))
""")
    deadline = time.monotonic() + 20
    while "float32[5]" not in (table := k.ok("%accelerate collectives --last 1").stdout):
        assert time.monotonic() < deadline, table
    assert re.search(r"^\d+  all_reduce float32\[5\] Cell In\[\d+\]:6 waiting  -$", table, re.M), table
    k.ok("open(GO, 'w').close()")
    k.ok("%accelerate watch", timeout=30)
    reduce_is_right(k)


def test_the_stop_after_a_diagnosed_hang_stops_at_once_and_says_why_in_words(k):
    """Rank 1 waits in an all_reduce that rank 0, asleep, has not joined: once the hang watch
    marked both and showed their stacks, one press stops every rank at once (no stop_wait),
    says why in words (no collective counters) and keeps the marks while it stops."""
    pressed = {}

    def press_once_marked(result):
        if "every rank's stack now" in result.stderr and "at" not in pressed:
            pressed["at"] = time.monotonic()
            k.manager.interrupt_kernel()

    result = k.collect(k.execute("""%%accelerate
import time, torch, torch.distributed as dist
if dist.get_rank() == 1:
    dist.all_reduce(torch.ones(1))
else:
    time.sleep(60)
"""), timeout=90, on_output=press_once_marked)
    took = time.monotonic() - pressed["at"]
    assert took < 4.0, took  # the interrupt's grace and the kill, not stop_wait (5 s) first
    said = result.error["evalue"] + result.stderr
    assert ("rank 1 is blocked in all_reduce, which rank 0 has not joined, so every rank was "
            "stopped at once") in result.error["evalue"], said
    assert "collective 3" not in said and "rank 0 at" not in said, said  # no internal counters
    tables = [m["content"]["data"]["text/plain"] for m in result.outputs]
    marked = next(i for i, table in enumerate(tables) if "rank 1: no progress" in table)
    assert not any("rank 1: running" in table for table in tables[marked:]), tables[marked:]
    reduce_is_right(k)
