"""A magic line's words checked before argparse reads them (magics/cell/flag_check.py)."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402

from magics.cell.flag_check import check_words  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", "--num-processes")
    parser.add_argument("--fresh", action="store_true")
    return parser


def test_a_cell_with_no_flags_and_a_line_with_one_command_pass():
    check_words(_parser(), "", True, ("start", "snapshots"), ("snapshots",))  # %%accelerate
    check_words(_parser(), "--fresh -n 2", True, ("start",), ("snapshots",))
    check_words(_parser(), "snapshots /tmp/runs", False, ("start", "snapshots"), ("snapshots",))


def test_stray_words_are_named():
    with pytest.raises(UsageError, match="unexpected 'start': the cell magic takes only flags"):
        check_words(_parser(), "start", True, ("start",))
    with pytest.raises(UsageError, match="%accelerate start: unexpected 'now'"):
        check_words(_parser(), "start now", False, ("start",))


def test_a_line_that_passed_is_not_read_again_and_a_bad_one_is_refused_every_time(monkeypatch):
    from magics.cell import flag_check

    parser = _parser()
    check_words(parser, "--fresh -n 2", True, ("start",))
    read = []
    monkeypatch.setattr(flag_check, "arg_split", lambda line: read.append(line) or line.split())
    check_words(parser, "--fresh -n 2", True, ("start",))  # a cell run again
    assert read == []
    for _ in range(2):
        with pytest.raises(UsageError, match="did you mean --fresh"):
            check_words(parser, "--fersh", True, ("start",))
    assert read == ["--fersh", "--fersh"]
    check_words(_parser(), "--fresh -n 2", True, ("start",))  # another parser: read for it
    assert read[-1] == "--fresh -n 2"
