"""The unit tier runs in one process and forks nothing: whether that process has started OpenMP's
thread pool depends on the tests before (a big CPU op starts it), so the start method's OpenMP
probe (a forked child) is pinned to "not started" here; tests/runtime/test_fork_after_openmp.py
tests it for real, in a process of its own."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_openmp_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    from notebook_accel.launch.planning import start_method

    monkeypatch.setattr(start_method, "openmp_pool_started", lambda: False)
