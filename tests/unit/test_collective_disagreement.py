"""The ranks' recorders and stacks -> what their collectives disagree on (pure)."""

from __future__ import annotations

import queue

from notebook_accel.launch.supervision.collective_disagreement import disagreement
from notebook_accel.wire import Collective

CELL = "/home/user/train.py"


def _c(number, op="all_reduce", tensors=("float32[1024]",), line=18, done=True, group="default"):
    return Collective(number, group, op, tensors, (CELL, line, "train"), float(number), None, done)


def _history(n, **last):
    return tuple(_c(i) for i in range(1, n)) + (_c(n, **last),)


def test_different_ops_at_the_same_number():
    text = disagreement({0: _history(412, done=False),
                         1: _history(412, op="broadcast", tensors=("float32[10]",), line=22,
                                     done=False)})
    assert text == (
        "the ranks called different collectives at #412 (group default):\n"
        '  rank 0 waits in all_reduce #412 (float32[1024]; File "/home/user/train.py", line 18, in train)\n'
        '  rank 1 waits in broadcast #412 (float32[10]; File "/home/user/train.py", line 22, in train)')


def test_different_shapes_at_the_same_number_group_ranks_alike():
    recorders = {rank: _history(7, done=False) for rank in range(8)}
    recorders[5] = _history(7, tensors=("float32[1000]",), done=False)
    text = disagreement(recorders)
    assert text.splitlines()[:3] == [
        "the ranks passed different shapes or dtypes to all_reduce #7 (group default):",
        '  ranks 0-4, 6, 7 wait in all_reduce #7 (float32[1024]; File "/home/user/train.py", line 18, in train)',
        '  rank 5 waits in all_reduce #7 (float32[1000]; File "/home/user/train.py", line 18, in train)']


def test_a_rank_that_never_arrives_is_said_with_where_it_is():
    stacks = {3: ((CELL, 9, "train"), (queue.__file__, 1, "get"))}
    recorders = {rank: _history(412, done=False) for rank in range(3)}
    recorders[3] = _history(410)
    text = disagreement(recorders, stacks)
    assert text.startswith("not every rank reached all_reduce #412 (group default):\n"
                           "  ranks 0-2 wait in all_reduce #412 (float32[1024]")
    assert ('  rank 3 never reached it: it is at File "/home/user/train.py", line 9, in train, '
            "2 collectives short") in text


def test_a_rank_with_no_collective_at_all_is_behind_by_all():
    text = disagreement({0: _history(3, done=False), 1: ()})
    assert "rank 1 never reached it: it is elsewhere (no stack), 3 collectives short" in text


def test_ranks_whose_run_ended_never_reach_the_default_groups_collective():
    text = disagreement({1: _history(9, done=False)}, {}, ended=[0, 2])
    assert text.splitlines() == [
        "not every rank reached all_reduce #9 (group default):",
        '  rank 1 waits in all_reduce #9 (float32[1024]; File "/home/user/train.py", line 18, in train)',
        "  ranks 0, 2 never reached it: their runs ended"]


def test_a_sub_group_is_said_on_its_own_members():
    sub = _c(1, group="pairs", done=False)
    text = disagreement({0: _history(5) + (sub,), 1: _history(5), 2: _history(5) + (sub,)})
    assert text.startswith("every rank of group pairs is in all_reduce #1, alike:\n"
                           "  ranks 0, 2 wait in all_reduce #1")
    assert "never reached" not in text  # rank 1 is not a member


def test_nothing_to_say():
    assert disagreement({0: _history(3), 1: _history(3)}) is None  # no rank waits
    assert disagreement({0: None, 1: ()}) is None  # no recorder
    alike = disagreement({0: _history(3, done=False), 1: _history(3, done=False)})
    assert alike.startswith("every rank of group default is in all_reduce #3, alike:")


def test_a_waiting_rank_recorded_without_frames_is_placed_by_its_stack():
    stacks = {0: ((CELL, 30, "train"), (queue.__file__, 1, "get"))}
    bare = _c(2, done=False)._replace(where=None)
    text = disagreement({0: (_c(1), bare), 1: (_c(1), bare._replace(op="broadcast"))}, stacks)
    assert 'rank 0 waits in all_reduce #2 (float32[1024]; File "/home/user/train.py", line 30' in text
    assert "rank 1 waits in broadcast #2 (float32[1024])" in text


def test_1024_ranks_take_a_line_per_answer_and_at_most_eight_of_each_kind():
    """A cluster's scale (issue 29's grouping): rank 513 broadcasts where 1019 ranks reduce,
    ranks 700-703 wait on their loader, rank 900 elsewhere: five lines; then every rank
    passing its own shape (an uneven last batch) is 8 lines and one that counts the rest."""
    loader = ((CELL, 9, "train"), (queue.__file__, 1, "get"))
    stacks = {rank: loader for rank in range(700, 704)}
    stacks[900] = ((CELL, 40, "evaluate"),)
    recorders = {rank: _history(412, done=False) for rank in range(1024)}
    recorders[513] = _history(412, op="broadcast", tensors=("float32[10]",), line=22, done=False)
    for rank in stacks:
        recorders[rank] = _history(411)
    lines = disagreement(recorders, stacks).splitlines()
    assert lines == [
        "the ranks called different collectives at #412 (group default):",
        '  ranks 0-512, 514-699, 704-899, 901-1023 wait in all_reduce #412 (float32[1024]; '
        'File "/home/user/train.py", line 18, in train)',
        '  rank 513 waits in broadcast #412 (float32[10]; File "/home/user/train.py", line 22, in train)',
        '  ranks 700-703 never reached it: they are at File "/home/user/train.py", line 9, in train, '
        "1 collective short",
        '  rank 900 never reached it: it is at File "/home/user/train.py", line 40, in evaluate, '
        "1 collective short"]
    uneven = {rank: _history(5, tensors=(f"float32[{rank}]",), done=False) for rank in range(1024)}
    lines = disagreement(uneven).splitlines()
    assert len(lines) == 1 + 8 + 1, lines
    assert lines[0] == "the ranks passed different shapes or dtypes to all_reduce #5 (group default):"
    assert lines[1].startswith("  rank 0 waits in all_reduce #5 (float32[0];")
    assert lines[-1] == "  ranks 8-1023: 1016 other calls"
