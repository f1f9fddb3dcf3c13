"""Shared pieces of the runtime tests (tests/test_runtime_*.py)."""

from __future__ import annotations

import psutil
import pytest


@pytest.fixture(autouse=True)
def no_worker_left_behind():
    """No process started by this test outlives it.

    Overrides the suite-wide fixture of the same name for the runtime tests: that
    one looks at (and kills) launcher workers anywhere on the machine, so it would
    blame, and kill, workers of a launcher test running concurrently in another
    session. Here we check our own descendants only.
    """
    me = psutil.Process()
    yield
    left = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for proc in left:
        proc.kill()
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
