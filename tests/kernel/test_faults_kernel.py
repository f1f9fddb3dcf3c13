"""The fault matrix (issue 7) in a real kernel: every fault ends in a clear error, no leftovers."""

from __future__ import annotations

import os
import re
import signal
import textwrap
import time

import pytest

from tests.kernel_harness import Kernel, wait_no_workers, worker_processes


@pytest.fixture(scope="module")
def kernel(kernel):
    """The shared kernel after one launch: the timings below measure failure handling,
    not the first launch's one-off imports (seconds on a busy machine)."""
    assert kernel.value("notebook_launcher(lambda: 1, num_processes=2)") == 1
    return kernel


def caught(kernel, body: str, timeout: float = 120) -> str:
    """Run ``body`` (which defines ``job``) and launch it, printing the WorkerError's parts."""
    code = textwrap.dedent(body) + textwrap.dedent("""
    import time as _time
    _start = _time.monotonic()
    from notebook_accel import last_launch as _last
    try:
        notebook_launcher(job, num_processes=2, **LAUNCH)
        print("NO ERROR")
    except WorkerError as e:
        print("ELAPSED", _time.monotonic() - _start)
        print("RANK", e.rank, "EXIT", e.exitcode)
        print("MESSAGE", e.args[0])
        print("TRACEBACK", e.remote_traceback)
        print("OTHERS", [str(failure) for failure in e.other_failures])
        f = e.failure  # the root cause's record
        print("FAILURE", f.rank, f.exc_type, f.signal_name, f.pid == _last().ranks[f.rank].pid,
              f.exitcode)
        print("LATER", all(o.timestamp >= f.timestamp for o in e.other_failures))
    """)
    if "LAUNCH =" not in code:
        code = "LAUNCH = {}\n" + code
    return kernel.ok(code, timeout=timeout).stdout


def elapsed(out: str) -> float:
    return float(out.split("ELAPSED ")[1].split()[0])


def test_rank_raising_while_its_peer_waits_in_init_process_group(kernel):
    out = caught(kernel, """
    def job():
        import os
        if os.environ["RANK"] == "1":
            raise KeyError("no process group yet")
        dist.init_process_group("gloo")   # rank 0 waits here for rank 1, forever
    """)
    assert "RANK 1 EXIT 1" in out and "KeyError: 'no process group yet'" in out
    assert "FAILURE 1 KeyError None True 1" in out
    assert elapsed(out) < 5


def test_segfault_shows_the_c_level_crash_and_python_stack(kernel):
    out = caught(kernel, """
    def job():
        import ctypes, os, time
        def crash_here():
            ctypes.string_at(0)
        if os.environ["RANK"] == "1":
            crash_here()
        time.sleep(30)
    """)
    assert "RANK 1 EXIT -11" in out and "was killed by SIGSEGV" in out
    assert "FAILURE 1 None SIGSEGV True -11" in out
    assert "Segmentation fault" in out and "crash_here" in out  # faulthandler's dump


def test_exception_class_that_cannot_be_pickled(kernel):
    out = caught(kernel, """
    import threading
    class LockedError(Exception):
        def __init__(self):
            super().__init__("holds a lock")
            self.lock = threading.Lock()
    def job():
        raise LockedError()
    """)
    # both ranks raise at once: either may be the root cause, the other is summarised
    assert re.search(r"MESSAGE rank [01] failed: LockedError: holds a lock", out), out
    assert "raise LockedError()" in out


def test_return_value_that_cannot_be_pickled(kernel):
    out = caught(kernel, """
    def job():
        import threading
        lock = threading.Lock()
        return lambda: lock
    """)
    assert "its return value could not be pickled" in out and "lock" in out


def test_all_ranks_failing_at_once_one_root_cause_the_others_summarised(kernel):
    out = caught(kernel, """
    LAUNCH = {"output": "none"}
    def job():
        import os
        raise RuntimeError(f"rank {os.environ['RANK']} gave up")
    """)
    rank = out.split("RANK ")[1].split()[0]
    other = "1" if rank == "0" else "0"
    assert f"MESSAGE rank {rank} failed: RuntimeError: rank {rank} gave up" in out
    assert f"OTHERS ['rank {other}: RuntimeError: rank {other} gave up']" in out
    assert f"FAILURE {rank} RuntimeError None True 1" in out
    assert "LATER True" in out  # the root cause is the earliest failure, on one clock


def test_a_200_mb_return_value_comes_back(kernel):
    out = kernel.ok(textwrap.dedent("""
    import time
    start = time.monotonic()
    big = notebook_launcher(lambda: torch.ones(50_000_000), num_processes=2)
    print("shape", tuple(big.shape), "sum", int(big.sum()), "took", time.monotonic() - start)
    del big
    """), timeout=120).stdout
    assert "shape (50000000,) sum 50000000" in out
    assert float(out.split("took")[1]) < 30


def test_a_rank_printing_100_mb_does_not_drown_the_kernel(kernel):
    result = kernel.ok(textwrap.dedent("""
    def flood():
        import os, sys
        line = "y" * 99 + "\\n"
        block = line * 10_000
        for _ in range(100):             # 100 MB
            sys.stdout.write(block)
        return "survived"
    print("result", notebook_launcher(flood, num_processes=2))
    """), timeout=180)
    assert "result survived" in result.stdout
    assert len(result.stdout) < 20_000_000
    assert "lines (" in result.stderr and "not shown: too much output" in result.stderr


def test_only_loopback_listens_during_a_single_node_launch(kernel):
    out = kernel.ok(textwrap.dedent("""
    def listeners():
        import os, psutil
        dist.init_process_group("gloo")
        dist.barrier()
        pids = {os.getpid(), os.getppid()}
        found = [(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
                 if c.status == "LISTEN" and c.pid in pids]
        dist.barrier()
        return found
    print("LISTEN", notebook_launcher(listeners, num_processes=2, return_all=True))
    """)).stdout
    found = eval(out.split("LISTEN ")[1])  # noqa: S307 - our own repr
    assert all(found), found
    addresses = {ip for per_rank in found for ip, _ in per_rank}
    assert addresses <= {"127.0.0.1", "::1"}, addresses


def test_kernel_signal_handlers_untouched_and_workers_in_their_own_session(kernel):
    out = kernel.ok(textwrap.dedent("""
    import os, signal
    def handlers():
        return {s: signal.getsignal(s) for s in signal.valid_signals()
                if s not in (signal.SIGKILL, signal.SIGSTOP)}
    before = handlers()
    sessions = notebook_launcher(lambda: (os.getsid(0), os.getpgid(0), os.getpid()),
                                 num_processes=2, return_all=True)
    for fn in (lambda: 1 / 0, lambda: __import__("time").sleep(60)):
        try:
            notebook_launcher(fn, num_processes=2, timeout=1, output="none")
        except WorkerError:
            pass
    print("same", handlers() == before)
    print("own", all(sid == pgid == pid for sid, pgid, pid in sessions),
          all(sid != os.getsid(0) for sid, _, _ in sessions))
    """)).stdout
    assert "same True" in out and "own True True" in out


@pytest.mark.slow
def test_second_interrupt_kills_at_once(fresh_kernel):
    k = fresh_kernel
    # a long grace, so "killed at once" and "killed after the grace" cannot be confused
    k.ok("from notebook_accel import notebook_launcher\n"
         "import notebook_accel.launch.backends.stopping as p; p.STOP_GRACE = 20")
    msg_id = k.execute(textwrap.dedent("""
    def stubborn():
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # ignores the polite stop
        print("started", flush=True)
        time.sleep(600)
    notebook_launcher(stubborn, num_processes=2)
    """))
    marks = {}

    def on_output(result):
        if result.stdout.count("started") == 2 and "first" not in marks:
            marks["first"] = time.monotonic()
            k.manager.interrupt_kernel()
            time.sleep(0.3)
            k.manager.interrupt_kernel()

    result = k.collect(msg_id, timeout=60, on_output=on_output)
    assert result.error is not None and result.error["ename"] == "LaunchInterrupted"
    assert result.error["traceback"] == ["KeyboardInterrupt: stopped 2 workers"]  # no frames of ours
    assert time.monotonic() - marks["first"] < 10  # the grace alone would be 20 s
    assert not wait_no_workers(timeout=1)


@pytest.mark.slow
def test_killed_kernel_takes_workers_and_their_children_along():
    k = Kernel()
    try:
        k.ok("from notebook_accel import notebook_launcher")
        k.execute(textwrap.dedent("""
        def with_children():
            import multiprocessing, time
            ctx = multiprocessing.get_context("fork")
            kids = [ctx.Process(target=time.sleep, args=(600,)) for _ in range(2)]
            for kid in kids:
                kid.start()                    # like DataLoader workers
            print("started", flush=True)
            time.sleep(600)
        notebook_launcher(with_children, num_processes=2)
        """))
        deadline = time.monotonic() + 60
        while len(worker_processes()) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(worker_processes()) == 6  # 2 workers + 4 children
        os.kill(k.pid, signal.SIGKILL)
        assert not wait_no_workers(timeout=15)
    finally:
        k.shutdown()


@pytest.mark.slow
def test_soak_100_launches_in_one_kernel(fresh_kernel):
    k = fresh_kernel
    k.ok("import torch\nfrom notebook_accel import notebook_launcher, WorkerError")
    out = k.ok(textwrap.dedent("""
    import gc, os, threading, psutil
    me = psutil.Process()
    def counts():
        gc.collect()
        return (len(os.listdir("/proc/self/fd")), threading.active_count(),
                len([c for c in me.children(recursive=True)
                     if c.status() != psutil.STATUS_ZOMBIE]))
    def job(i):
        if i % 5 == 4:
            raise RuntimeError("planned failure")
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        return int(os.environ["MASTER_PORT"])
    import torch.distributed as dist
    for i in range(5):  # warm up: imports, caches
        try:
            notebook_launcher(job, (i,), num_processes=2, output="none")
        except WorkerError:
            pass
    before, rss_before = counts(), me.memory_info().rss
    failures, ports = 0, []
    for i in range(100):
        try:
            ports.append(notebook_launcher(job, (i,), num_processes=2, output="none"))
        except WorkerError as e:
            assert "planned failure" in e.args[0], e
            failures += 1
    after, rss_after = counts(), me.memory_info().rss
    print("counts", before, after)
    print("rss_growth_mb", (rss_after - rss_before) / 1e6)
    print("failures", failures, "successes", len(ports))
    """), timeout=600).stdout
    before, after = out.split("counts ")[1].splitlines()[0].split(") (")
    assert before + ")" == "(" + after, out
    assert float(out.split("rss_growth_mb ")[1].split()[0]) < 50
    assert "failures 20 successes 80" in out
