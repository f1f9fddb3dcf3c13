"""Detached pools (the keeper's slice): a keeper of its own session owns the workers and
outlives the process that started it; only its user with its token is answered; it is listed,
stopped, and ends itself when idle, saying why (real keepers, real workers)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import psutil
import pytest

from notebook_accel import WorkerError, WorkerPool
from notebook_accel.launch import PoolBusy
from notebook_accel.launch.detached.client import (
    detached_pools,
    request,
    start_detached,
    stop_detached,
)
from notebook_accel.launch.detached.runtime_dir import pool_files, runtime_dir
from tests.runtime.test_pool import notebook

pytestmark = pytest.mark.slow

CELLS = notebook("""
    import time

    def remember(value):
        global kept
        import torch
        import torch.distributed as dist
        kept = value
        t = torch.ones(1)
        dist.all_reduce(t)
        return dist.get_rank(), t.item()

    def numbered(steps, pause=0.05):
        for step in range(steps):
            print(f"numbered {step}", flush=True)
            time.sleep(pause)
        return steps

    def fails():
        raise ValueError("no luck on the keeper's workers")
""")


@pytest.fixture(autouse=True)
def private_runtime_dir(monkeypatch):
    """A runtime directory of the test's own (short: a socket's path has 108 bytes)."""
    base = tempfile.mkdtemp(prefix="na-run-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", base)
    yield base
    for info in detached_pools():  # a failed test's keeper: ended, not left behind
        os.kill(info["pid"], signal.SIGTERM)
        _wait_gone(info["pid"], 10)
    shutil.rmtree(base, ignore_errors=True)


def _wait_gone(pid: int, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return not psutil.pid_exists(pid)


def test_a_detached_pool_outlives_its_starter_and_is_listed_then_stopped(capsys):
    starter = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        from notebook_accel.launch.detached.client import start_detached
        print(start_detached("exp1", num_processes=2)["pid"], flush=True)
        time.sleep(600)  # a kernel, busy, until it is killed
    """)], stdout=subprocess.PIPE, text=True)
    try:
        keeper = int(starter.stdout.readline())
    finally:
        starter.send_signal(signal.SIGKILL)  # the kernel dies
        starter.wait()
    time.sleep(1.0)
    assert psutil.pid_exists(keeper)
    (info,) = detached_pools()
    assert (info["name"], info["pid"], info["ranks"], info["alive"], info["device"],
            info["state"]) == ("exp1", keeper, 2, 2, "cpu", "idle")
    assert info["memory"] > 0 and time.time() - 120 < info["since"] < time.time()
    process = psutil.Process(keeper)
    assert process.ppid() != starter.pid and os.getsid(keeper) != os.getsid(0)  # of its own
    workers = process.children(recursive=True)
    assert len([w for w in workers if w.is_running()]) >= 2
    for proc in [process, *workers]:  # nothing listens beyond loopback (and the Unix socket)
        for conn in proc.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip in ("127.0.0.1", "::1"), (proc, conn)
    folder = runtime_dir()
    files = pool_files("exp1")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(files.token).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(files.socket).st_mode) & 0o077 == 0

    from magics.pool import pools  # %accelerate pools

    pools(None)
    assert re.fullmatch(rf"exp1: 2/2 ranks on cpu, idle for \d+\.\d s, memory \d+\.\d [kMG]B, "
                        rf"keeper pid {keeper}\n", capsys.readouterr().out)
    with pytest.raises(ValueError, match="a detached pool named 'exp1' is up already"):
        start_detached("exp1", num_processes=1)
    stop_detached("exp1")
    assert _wait_gone(keeper) and all(_wait_gone(w.pid, 10) for w in workers)
    assert detached_pools() == [] and not files.socket.exists() and not files.token.exists()
    pools(None)
    assert capsys.readouterr().out.startswith("no detached pool is up")
    assert "detached pool 'exp1' ended: stopped on request" in files.log.read_text()
    with pytest.raises(ValueError, match="no detached pool named 'exp1' is up"):
        stop_detached("exp1")


def test_only_its_user_with_its_token_is_answered():
    info = start_detached("guarded", num_processes=1)
    files = pool_files("guarded")
    try:
        with pytest.raises(PermissionError, match="refused: wrong token for detached pool 'guarded'"):
            request(files, "info", token=b"0" * 64)
        if os.getuid() == 0:  # another user: the runtime directory is closed to them
            child = os.fork()
            if child == 0:
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                    request(files, "info", token=b"0" * 64)
                    os._exit(1)  # answered: wrong
                except PermissionError as error:
                    os._exit(0 if "only the user who started it" in str(error) else 2)
                except BaseException:
                    os._exit(3)
            assert os.waitpid(child, 0)[1] >> 8 == 0
        assert request(files, "info")["pid"] == info["pid"]  # the owner still is
        assert "refused a connection with a wrong token" in files.log.read_text()
    finally:
        stop_detached("guarded")


def test_bad_input_is_refused_before_any_process_starts():
    before = set(psutil.Process().children(recursive=True))
    with pytest.raises(ValueError, match=r"name='no/slash': a detached pool's name is 1 to 64"):
        start_detached("no/slash")
    with pytest.raises((TypeError, ValueError), match="mixed_precision"):
        start_detached("bad", mixed_precision="fp64")
    with pytest.raises(ValueError, match="idle_timeout=0"):
        start_detached("bad", idle_timeout=0)
    assert set(psutil.Process().children(recursive=True)) == before


def test_an_idle_keeper_ends_itself_and_says_why():
    info = start_detached("sleepy", idle_timeout=2, num_processes=1)
    assert _wait_gone(info["pid"], 30)
    log = pool_files("sleepy").log.read_text()
    assert "detached pool 'sleepy' ended: no run and no request for 2 s (idle_timeout)" in log
    assert detached_pools() == []


def test_runs_go_through_the_keeper_and_any_process_of_its_user_attaches(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_ACCEL_IDLE_TIMEOUT", "600")  # the row's environment variable
    with pytest.raises(ValueError, match=r"name='x': only a detached pool takes it; add detach=True"):
        WorkerPool(num_processes=1, name="x")
    pool = WorkerPool(num_processes=2, device="cpu", detach=True, name="exp2")
    try:
        (info,) = detached_pools()
        assert (info["name"], info["idle_timeout"], pool.plan.world_size) == ("exp2", 600.0, 2)
        keeper = psutil.Process(info["pid"])
        pids = [keeper.pid, *(child.pid for child in keeper.children(recursive=True))]
        assert pool.run(CELLS["remember"], 7) == (0, 2.0)  # rank 0's value, a real all_reduce
        assert pool.names == ("kept",)  # names stay on the keeper's workers
        handle = pool.submit(CELLS["numbered"], 40)
        with pytest.raises(PoolBusy, match=r"the pool is running a background run of numbered"):
            pool.run(CELLS["remember"], 8)
        watcher = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            from notebook_accel import WorkerPool
            print("value", WorkerPool.attach("exp2").background.watch())
        """)], capture_output=True, text=True, timeout=120, check=True)  # another process
        for rank in (0, 1):
            counts = [watcher.stdout.count(f"[rank {rank}] numbered {i}\n") for i in range(40)]
            assert counts == [1] * 40, (rank, counts, watcher.stdout)
        assert "value 40" in watcher.stdout and handle.result(timeout=30) == 40
        assert handle.logs(1).splitlines() == [f"numbered {i}" for i in range(40)]

        threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT)).start()  # the stop button
        with pytest.raises(KeyboardInterrupt):  # ...in a run shown live: the run stops
            pool.run(CELLS["numbered"], 10_000)
        assert pool.background.state() == "cancelled" and "kept" in pool.names

        long = pool.submit(CELLS["numbered"], 10_000)
        time.sleep(1.0)
        assert long.cancel(timeout=30) and long.state() == "cancelled"
        assert "kept" in pool.names  # the stop's cut kept the workers' state
        with pytest.raises(WorkerError, match="no luck on the keeper's workers"):
            pool.run(CELLS["fails"])
        assert pool.run(CELLS["remember"], 9) == (0, 2.0)  # the pool goes on after a failure
    finally:
        pool.close()
    assert detached_pools() == [] and all(_wait_gone(pid, 30) for pid in pids)
