"""Every rank's last collectives side by side, aligned by number (pure)."""

from __future__ import annotations

from notebook_accel.launch.supervision.collective_table import collectives_text
from notebook_accel.wire import Collective


def _c(number, op="all_reduce", tensors=("float32[4]",), done=True, group="default"):
    return Collective(number, group, op, tensors, ("/home/user/train.py", 10 + number, "train"),
                      float(number), None, done)


def test_ranks_alike_share_a_column_and_rows_align_by_number():
    alike = tuple(_c(n) for n in range(1, 6))
    recorders = {rank: alike for rank in range(4)}
    recorders[2] = alike[:4] + (_c(5, op="broadcast", tensors=("float32[10]",), done=False),)
    recorders[3] = alike[:3]  # two behind
    text = collectives_text(recorders, last=3)
    lines = text.splitlines()
    assert lines[0] == "group default (the last 3):"
    assert lines[1].split() == ["#", "ranks", "0,", "1", "rank", "2", "rank", "3"]
    assert lines[2].startswith("3  all_reduce float32[4] train.py:13")
    assert lines[4].split()[-5:] == ["broadcast", "float32[10]", "train.py:15", "waiting", "-"]
    assert len(lines) == 5


def test_each_group_has_its_table_and_missing_answers_are_said():
    recorders = {0: (_c(1), _c(1, group="pairs")), 1: (_c(1),), 2: None}
    text = collectives_text(recorders, last=8, silent=[3])
    assert "group default (the last 1):" in text
    assert "group pairs (the last 1):\n#  rank 0\n1  all_reduce" in text  # its member only
    assert text.endswith("rank 2: no recorder\n\nrank 3: no answer (gone, or busy)")
    assert collectives_text({0: ()}, last=8) == "no collective recorded yet"


def test_1024_ranks_alike_are_one_column_and_past_eight_columns_the_rest_are_counted():
    alike = tuple(_c(n) for n in range(1, 4))
    recorders = {rank: alike for rank in range(1024)}
    recorders[513] = alike[:2] + (_c(3, op="broadcast", done=False),)
    lines = collectives_text(recorders, last=3).splitlines()
    assert lines[1].split() == ["#", "ranks", "0-512,", "514-1023", "rank", "513"]
    assert len(lines) == 5
    uneven = {rank: alike[:2] + (_c(3, tensors=(f"float32[{rank}]",)),) for rank in range(1024)}
    lines = collectives_text(uneven, last=3).splitlines()
    assert lines[1].split()[:3] == ["#", "rank", "0"] and len(lines[1].split()) == 1 + 2 * 8
    assert lines[-1] == "(ranks 8-1023: 1016 other columns, not shown)"


def test_a_long_cell_cuts_its_tensors_and_keeps_its_line_and_waiting_whole():
    many = tuple(f"float32[{n},1024]" for n in range(10))
    text = collectives_text({0: (_c(1, tensors=many, done=False),)}, last=1)
    cell = text.splitlines()[-1].split("  ", 1)[1]
    assert cell.startswith("all_reduce float32[0,1024],float32[1,")
    assert cell.endswith("... train.py:11 waiting") and len(cell) <= 64, cell
