"""Suite-wide: every test has config dirs of its own, and no process it started outlives it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from tests.config_isolation import isolate_config
from tests.kernel_harness import SESSION_MARKER

LEAK_GRACE_S = 8.0
# multiprocessing's helpers live exactly as long as the process that started them.
_MP_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


@pytest.fixture(autouse=True)
def isolated_config(tmp_path, monkeypatch):
    """The test's config dirs are ``tmp_path/config``, ``tmp_path/cache``, ``tmp_path/hf``."""
    isolate_config(monkeypatch, tmp_path)


@pytest.fixture(autouse=True, scope="module")
def _no_process_left_behind_by_the_module(request):
    """The leak check at module scope, for modules whose tests share long-lived workers (a warm
    pool, a kernel holding one): such a module sets ``SHARED_WORKERS = True``."""
    if not getattr(request.module, "SHARED_WORKERS", False):
        yield
        return
    yield from _leak_check()


@pytest.fixture(autouse=True)
def no_process_left_behind(request):
    """No process this test started outlives it: waits ``LEAK_GRACE_S``, then kills and fails
    (checked per module instead where the module says ``SHARED_WORKERS = True``)."""
    if getattr(request.module, "SHARED_WORKERS", False):
        yield
        return
    yield from _leak_check()


def _leak_check():
    before = {(p.pid, p.info["create_time"]) for p in psutil.process_iter(["create_time"])}
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while (left := _started_and_alive(before)) and time.monotonic() < deadline:
        time.sleep(0.1)
    named = [(p.pid, _title(p)) for p in left]
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, f"processes left behind: {named}"


def _started_and_alive(before: set[tuple[int, float]]) -> list[psutil.Process]:
    """Processes alive now, not in ``before``, that this test session started: our
    descendants, and processes marked with our session (workers whose kernel died)."""
    me, marker = os.getpid(), os.environ[SESSION_MARKER]
    found = []
    for proc in psutil.process_iter(["create_time", "status"]):
        if (proc.pid, proc.info["create_time"]) in before or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if proc.pid == me or any(h in " ".join(proc.cmdline()) for h in _MP_HELPERS):
                continue
            if any(p.pid == me for p in proc.parents()) or proc.environ().get(SESSION_MARKER) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:120] or proc.name()
    except psutil.Error:
        return "?"


def mark_every_test_in(folder_conftest: str, marker: pytest.MarkDecorator):
    """A folder's ``pytest_collection_modifyitems``: every test under that conftest's folder gets
    ``marker``, before ``-m`` selects by it (pyproject's addopts select or skip browser/xla)."""
    here = Path(folder_conftest).parent

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(items):
        for item in items:
            if here in item.path.parents:
                item.add_marker(marker)

    return pytest_collection_modifyitems
