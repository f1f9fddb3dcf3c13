"""notebook_launcher in a real Jupyter kernel: results, output, failures, interrupts."""

from __future__ import annotations

import os
import re
import signal
import textwrap
import time

import psutil
import pytest

from tests.kernel_harness import Kernel, wait_no_workers, worker_processes

ALLREDUCE_CELL = """
class Box:
    def __init__(self, value):
        self.value = value

def job(box, scale):
    dist.init_process_group("gloo")
    t = torch.ones(1) * box.value
    dist.all_reduce(t)
    print("rank", dist.get_rank(), "sum", t.item())
    dist.destroy_process_group()
    return Box(t * scale(2))

result = notebook_launcher(job, (Box(3), lambda x: x + 1), num_processes=2,
                           start_method={method!r}, return_all=True)
print("types", [type(r) is Box for r in result], [r.value.tolist() for r in result])
"""


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_notebook_function_class_and_lambda_under_every_start_method(kernel, method):
    result = kernel.ok(ALLREDUCE_CELL.format(method=method), timeout=180)
    assert "types [True, True] [[18.0], [18.0]]" in result.stdout
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} sum 6.0\n" in result.stdout


def test_auto_uses_fork_when_safe_and_says_nothing(kernel):
    result = kernel.ok("r = notebook_launcher(lambda: os.getpid(), num_processes=2)\n"
                       "print('pid', r != os.getpid())".replace("os.", "__import__('os')."))
    assert result.stdout.strip() == "pid True"


def test_output_prefixes_order_c_level_and_carriage_returns(kernel):
    code = textwrap.dedent("""
    def chatty():
        import ctypes, os, sys, time
        rank = int(os.environ["RANK"])
        for i in range(50):
            print(f"line {i}")
        os.write(1, b"raw fd write\\n")
        ctypes.CDLL(None).printf(b"from C printf\\n")
        print("to stderr", file=sys.stderr)
        for i in range(300):
            print(f"\\rprogress {i}", end="", flush=True)
        print()
        print("no newline at the end", end="")
        return rank

    notebook_launcher(chatty, num_processes=2)
    """)
    result = kernel.ok(code)
    for rank in (0, 1):
        lines = [line[len(f"[rank {rank}] "):] for line in result.stdout.splitlines()
                 if line.startswith(f"[rank {rank}] ")]
        assert lines[:50] == [f"line {i}" for i in range(50)]
        assert "raw fd write" in lines and "from C printf" in lines
        assert lines.count("progress 299") == 1
        assert sum(line.startswith("progress") for line in lines) <= 3  # collapsed, not 300
        assert lines[-1] == "no newline at the end"
        assert f"[rank {rank}] to stderr\n" in result.stderr
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in result.stdout.splitlines())


def test_output_main_only(kernel):
    result = kernel.ok("notebook_launcher(lambda: print('hi'), num_processes=2, output='main')")
    assert result.stdout == "[rank 0] hi\n"


def test_worker_environment_and_no_leak_into_kernel(kernel):
    code = textwrap.dedent("""
    import os
    before = dict(os.environ)
    def env():
        import os
        keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT", "NOTEBOOK_ACCEL_MIXED_PRECISION",
                "NOTEBOOK_ACCEL_DEVICE"]
        return {k: os.environ.get(k) for k in keys}
    envs = notebook_launcher(env, num_processes=2, mixed_precision="bf16", return_all=True)
    print(envs)
    print("leak", dict(os.environ) == before)
    """)
    result = kernel.ok(code)
    envs = eval(result.stdout.splitlines()[0])  # noqa: S307 - our own repr
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert all(e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2" for e in envs)
    assert all(e["MASTER_ADDR"] == "127.0.0.1" and e["GROUP_RANK"] == "0" for e in envs)
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert all(e["NOTEBOOK_ACCEL_MIXED_PRECISION"] == "bf16" for e in envs)
    assert all(e["NOTEBOOK_ACCEL_DEVICE"] == "cpu" for e in envs)
    assert "leak True" in result.stdout


def test_rank_raising_while_peer_waits_in_barrier(kernel):
    code = textwrap.dedent("""
    def fails():
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            raise ValueError("rank one is broken")
        dist.barrier()
    notebook_launcher(fails, num_processes=2)
    """)
    result = kernel.run(code)
    assert result.error is not None and result.error["ename"] == "WorkerError"
    text = result.traceback
    assert "rank 1 failed: ValueError: rank one is broken" in text
    assert 'raise ValueError("rank one is broken")' in text  # the cell's own source line
    assert "notebook_accel/launch" not in text  # no launcher internals
    assert result.elapsed < 5
    assert kernel.value("notebook_launcher(lambda: 7, num_processes=2)") == 7  # still usable


def test_rank_killing_itself_with_sigkill(kernel):
    code = textwrap.dedent("""
    def dies():
        import os, signal, time
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    try:
        notebook_launcher(dies, num_processes=2)
    except WorkerError as e:
        print("caught", e.rank, e.exitcode, e.args[0])
    """)
    result = kernel.ok(code)
    assert "caught 1 -9 rank 1 was killed by SIGKILL" in result.stdout
    assert result.elapsed < 5


def test_exit_without_result_is_a_failure(kernel):
    code = textwrap.dedent("""
    import os, sys
    for fn in (lambda: os._exit(0), lambda: sys.exit(3)):
        try:
            notebook_launcher(fn, num_processes=2)
        except WorkerError as e:
            print("caught", e.exitcode, e.args[0])
    """)
    out = kernel.ok(code).stdout
    # both ranks exit at once: either may be the root cause
    assert re.search(r"caught 0 rank [01] exited \(code 0\) before its function returned", out), out
    assert re.search(r"caught 3 rank [01] failed: called sys.exit\(3\)", out), out


def test_timeout_stops_a_hung_job_with_its_stack(kernel):
    code = textwrap.dedent("""
    def hangs():
        import time
        def stuck_here():
            time.sleep(600)
        stuck_here()
    try:
        notebook_launcher(hangs, num_processes=2, timeout=2, output="none")
    except WorkerError as e:
        print("caught", e.rank, e.args[0])
        print(e.remote_traceback)
    """)
    result = kernel.ok(code)
    assert "caught 0 timed out after" in result.stdout
    assert "stuck_here" in result.stdout  # faulthandler's stack dump of the hung rank
    assert result.elapsed < 10


def test_unpicklable_argument_named_before_any_worker_starts(kernel):
    code = textwrap.dedent("""
    import threading
    class Holder:
        def __init__(self):
            self.lock = threading.Lock()
    try:
        notebook_launcher(lambda h: 1, (Holder(),), num_processes=2)
    except TypeError as e:
        print("TypeError:", e)
    gen = (i for i in range(3))
    def uses_global():
        return list(gen)
    try:
        notebook_launcher(uses_global, num_processes=2)
    except TypeError as e:
        print("TypeError:", e)
    """)
    out = kernel.ok(code).stdout
    assert "cannot send args[0].lock to the workers" in out
    assert "'uses_global' (global 'gen')" in out and "generator" in out


BAD_INPUTS = [
    ("num_processes=0", "ValueError", "num_processes=0 must be an int >= 1"),
    ("num_processes=-2", "ValueError", "num_processes=-2"),
    ("num_processes='2'", "TypeError", "num_processes='2' must be an int"),
    ("num_processes=2.0", "TypeError", "num_processes=2.0"),
    ("num_processes=2, device='cuda'", "ValueError", "no NVIDIA GPU"),
    ("mixed_precision='fp32'", "ValueError", "'no', 'fp16', 'bf16'"),
    ("start_method='thread'", "ValueError", "'auto', 'fork', 'forkserver', 'spawn'"),
    ("num_nodes=2, node_rank=2, master_addr='10.0.0.1', use_port=29400", "ValueError",
     "node_rank=2 must be < num_nodes=2"),
    ("num_nodes=2, node_rank=1", "ValueError", "master_addr"),
    ("use_port=70000", "ValueError", "use_port=70000"),
    ("timeout=0", "ValueError", "timeout=0"),
    ("output='some'", "ValueError", "'all', 'main', 'none'"),
    ("rdzv_backend='etcd'", "ValueError", "'static', 'c10d'"),
]


def test_bad_input_refused_before_any_worker_starts(kernel):
    for call, ename, fragment in BAD_INPUTS:
        result = kernel.run(f"notebook_launcher(lambda: 1, {call})")
        assert result.error is not None, call
        assert result.error["ename"] == ename, (call, result.error)
        assert fragment in result.error["evalue"], (call, result.error["evalue"])
    for call, ename, fragment in [
        ("notebook_launcher(42)", "TypeError", "function=42 is not callable"),
        ("notebook_launcher(print, args=5)", "TypeError", "args must be a tuple or list"),
    ]:
        result = kernel.run(call)
        assert result.error["ename"] == ename and fragment in result.error["evalue"]
    assert not worker_processes()


def test_busy_port_is_named_and_a_given_free_port_is_used(kernel):
    code = textwrap.dedent("""
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
    busy = s.getsockname()[1]
    try:
        notebook_launcher(lambda: 1, num_processes=2, use_port=busy)
    except ValueError as e:
        print("ValueError:", e, "| busy", busy)
    s.close()
    from notebook_accel.launch.handoff.ports import free_port
    port = free_port()
    print("port", notebook_launcher(lambda: __import__("os").environ["MASTER_PORT"],
                                    num_processes=2, use_port=str(port)) == str(port))
    """)
    out = kernel.ok(code).stdout
    busy = out.split("| busy ")[1].split()[0]
    assert f"port {busy} on 127.0.0.1 is busy" in out
    assert "port True" in out


def test_twenty_launches_keep_fds_threads_and_children_flat(kernel):
    code = textwrap.dedent("""
    import os, threading, psutil
    me = psutil.Process()
    def counts():
        return (len(os.listdir("/proc/self/fd")), threading.active_count(),
                len([c for c in me.children(recursive=True)
                     if c.status() != psutil.STATUS_ZOMBIE]))
    def maybe_fail(i):
        if i % 4 == 3:
            raise RuntimeError("planned")
        return i
    notebook_launcher(maybe_fail, (0,), num_processes=2)
    before = counts()
    ports = set()
    for i in range(20):
        try:
            notebook_launcher(maybe_fail, (i,), num_processes=2)
        except WorkerError:
            pass
    after = counts()
    print("before", before, "after", after)
    """)
    out = kernel.ok(code, timeout=180).stdout
    line = [line for line in out.splitlines() if line.startswith("before")][-1]
    before, after = line[len("before "):].split(" after ")
    assert eval(before) == eval(after), line  # noqa: S307 - our own repr


@pytest.mark.slow
def test_interrupt_button_stops_every_worker(fresh_kernel):
    k = fresh_kernel
    k.ok("from notebook_accel import notebook_launcher")
    code = textwrap.dedent("""
    def forever():
        import time
        print("started", flush=True)
        while True:
            time.sleep(0.1)
    notebook_launcher(forever, num_processes=2)
    """)
    msg_id = k.execute(code)
    started = {}

    def on_output(result):
        if result.stdout.count("started") == 2 and "t" not in started:
            started["t"] = time.monotonic()
            k.manager.interrupt_kernel()

    result = k.collect(msg_id, timeout=60, on_output=on_output)
    assert "t" in started, result
    assert result.error is not None and result.error["ename"] == "LaunchInterrupted"
    assert result.error["traceback"] == ["KeyboardInterrupt: stopped 2 workers"]  # no frames of ours
    assert time.monotonic() - started["t"] < 10
    assert not wait_no_workers(timeout=2)
    assert k.value("notebook_launcher(lambda: 'again', num_processes=2)") == "again"


@pytest.mark.slow
def test_killed_kernel_takes_its_workers_along():
    for method in ("fork", "forkserver"):
        k = Kernel()
        k.ok("from notebook_accel import notebook_launcher")
        msg_id = k.execute(textwrap.dedent(f"""
        def forever():
            import time
            print("started", flush=True)
            time.sleep(600)
        notebook_launcher(forever, num_processes=2, start_method={method!r})
        """))
        deadline = time.monotonic() + 60
        while len(worker_processes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(worker_processes()) >= 2
        os.kill(k.pid, signal.SIGKILL)
        left = wait_no_workers(timeout=15)  # the promise: gone within 15 s
        k.shutdown()
        assert msg_id and not left, (method, left)


@pytest.mark.slow
def test_auto_switches_to_forkserver_when_the_cuda_driver_is_loaded(fresh_kernel, tmp_path):
    """A fake libcuda.so loaded in the kernel (as cuInit would) makes fork unsafe."""
    source = tmp_path / "fake.c"
    source.write_text("int cuInit(unsigned int flags) { return 0; }\n")
    lib = tmp_path / "libcuda.so.1"
    os.system(f"cc -shared -fPIC -o {lib} {source}")  # noqa: S605
    assert lib.exists(), "a C compiler is needed for this test"
    k = fresh_kernel
    k.ok("from notebook_accel import notebook_launcher")
    k.ok(f"import ctypes; ctypes.CDLL({str(lib)!r}).cuInit(0)")
    result = k.ok("print('result', notebook_launcher(lambda: 5, num_processes=2))", timeout=120)
    assert "start method: forkserver (the CUDA driver is loaded in this kernel" in result.stdout
    assert "result 5" in result.stdout
    explicit = k.run("notebook_launcher(lambda: 5, num_processes=2, start_method='fork')")
    assert explicit.error["ename"] == "ValueError" and "unsafe" in explicit.error["evalue"]
    # the forkserver is started once per kernel and reused: the second launch is fast
    again = k.ok("import time; t = time.perf_counter(); notebook_launcher(lambda: 5, num_processes=2);"
                 " print('took', time.perf_counter() - t)")
    took = float(again.stdout.split("took")[1])
    assert took < 2.0, took
    assert psutil.pid_exists(k.pid)


def test_an_accelerator_made_in_the_kernel_does_not_block_a_launch(kernel):
    """The peer refuses to launch once an Accelerator exists in the kernel; we must not."""
    code = textwrap.dedent("""
    from notebook_accel import Accelerator
    here = Accelerator()
    def world():
        from notebook_accel import Accelerator
        accelerator = Accelerator(mixed_precision=None)
        t = torch.ones(1, device=accelerator.device)
        return accelerator.num_processes, accelerator.mixed_precision, float(accelerator.reduce(t))
    print("workers", notebook_launcher(world, num_processes=2, mixed_precision="bf16"))
    print("kernel", here.num_processes)
    """)
    out = kernel.ok(code).stdout
    assert "workers (2, 'bf16', 2.0)" in out
    assert "kernel 1" in out


def test_max_restarts_relaunches_after_a_failure(kernel, tmp_path):
    marker = tmp_path / "attempts"
    code = textwrap.dedent(f"""
    def flaky(path):
        import os
        if os.environ["RANK"] == "0":
            with open(path, "a") as f:
                f.write("x")
        if len(open(path).read()) < 2:
            raise RuntimeError("first attempt fails")
        return "second attempt"
    print("result", notebook_launcher(flaky, ({str(marker)!r},), num_processes=2,
                                      max_restarts=2, output="none"))
    """)
    result = kernel.ok(code)
    assert "result second attempt" in result.stdout
    assert "restarting (1/2)" in result.stderr
