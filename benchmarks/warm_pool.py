"""Warm pool: start, a no-op run, a 1-element all_reduce run, a %%accelerate cell on the pool,
beside a one-off notebook_launcher launch and ipyparallel's %%px, measured in one run.

Also the workers' CPU time over 10 idle seconds (an idle pool must not poll), beside two plain
processes idle in a gloo group (gloo's own loop thread is the floor), and the
time and extra memory of a 1 GiB tensor argument (shared memory, not one copy per rank).

    python benchmarks/warm_pool.py [--runs 500] [--cells 200] [--no-px] [--gib 1]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import textwrap
import time

import psutil

from notebook_accel import WorkerPool, notebook_launcher
from notebook_accel.launch.handoff.ports import free_port


def noop() -> None:
    return None


def one_allreduce() -> float:
    import torch
    import torch.distributed as dist

    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    return tensor.item()


def one_off_allreduce() -> float:
    from notebook_accel import PartialState

    PartialState()
    return one_allreduce()


def hold(tensor) -> tuple[float, int]:
    """Read the whole tensor; then the machine's available memory, while every rank holds it."""
    import torch.distributed as dist

    total = float(tensor.sum())
    dist.barrier()
    return total, psutil.virtual_memory().available


def big_argument(gib: float) -> tuple[float, float]:
    """(seconds, extra GiB) for a ``gib`` GiB tensor argument to a 2-rank pool run."""
    import torch

    tensor = torch.ones(int(gib * (1 << 30)) // 4)
    with WorkerPool(num_processes=2, return_all=True, output="none") as pool:
        before = psutil.virtual_memory().available
        start = time.perf_counter()
        values = pool.run(hold, tensor)
        seconds = time.perf_counter() - start
    return seconds, (before - min(available for _, available in values)) / (1 << 30)


def timed(function, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def idle_cpu(pool: WorkerPool, seconds: float = 10.0) -> float:
    """The pool's workers' CPU time over ``seconds`` idle seconds, as a share of one core."""
    processes = [psutil.Process(info.pid) for info in pool.status()]
    before = [sum(p.cpu_times()[:2]) for p in processes]
    time.sleep(seconds)
    after = [sum(p.cpu_times()[:2]) for p in processes]
    return sum(a - b for a, b in zip(after, before, strict=True)) / seconds


def _plain_gloo_rank(rank: int, port: int, ready, done) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for _ in range(50):
        dist.all_reduce(torch.ones(1))
    ready.put(rank)
    done.wait()
    dist.destroy_process_group()


def idle_cpu_plain_gloo(seconds: float = 10.0) -> float:
    """The reference: the same CPU share for two plain processes idle in a gloo group (no
    notebook_accel), after the same warm-up of collectives."""
    import multiprocessing

    port = free_port()
    context = multiprocessing.get_context("spawn")
    ready, done = context.Queue(), context.Event()
    ranks = [context.Process(target=_plain_gloo_rank, args=(r, port, ready, done)) for r in (0, 1)]
    for rank in ranks:
        rank.start()
    try:
        for _ in ranks:
            ready.get(timeout=120)
        processes = [psutil.Process(rank.pid) for rank in ranks]
        time.sleep(1.0)
        before = [sum(p.cpu_times()[:2]) for p in processes]
        time.sleep(seconds)
        after = [sum(p.cpu_times()[:2]) for p in processes]
    finally:
        done.set()
        for rank in ranks:
            rank.join(30)
    return sum(a - b for a, b in zip(after, before, strict=True)) / seconds


class KernelTimer:
    """A real Jupyter kernel in which cells are timed with %timeit."""

    def __init__(self) -> None:
        from jupyter_client import KernelManager

        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 300) -> str:
        msg_id = self.client.execute(textwrap.dedent(code), store_history=False)
        out, error = [], None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                error = "\n".join(msg["content"]["traceback"])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        if error:
            raise RuntimeError(error)
        return "".join(out)

    def seconds(self, code: str) -> tuple[float, float]:
        """(median, best) seconds of one run of ``code`` (a statement)."""
        text = self.run(f"_t = %timeit -q -o {code}\n"
                        "import statistics\n"
                        "print('TIMES', statistics.median(_t.all_runs) / _t.loops, _t.best)")
        line = next(line for line in text.splitlines() if line.startswith("TIMES"))
        median, best = map(float, line.split()[1:])
        return median, best

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def cell_on_pool(kernel: KernelTimer, cells: int) -> tuple[float, float]:
    kernel.run("%load_ext notebook_accel\n%accelerate start -n 2")
    kernel.run("%%accelerate\nx = 1")  # warm
    result = kernel.seconds(f"-n {cells} -r 5 get_ipython().run_cell_magic('accelerate', '', 'x = 1')")
    kernel.run("%accelerate stop")
    return result


def px(kernel: KernelTimer, cells: int) -> dict[str, float]:
    """ipyparallel's %%px on 2 engines: cluster start, a no-op cell, an all_reduce cell."""
    start = time.perf_counter()
    kernel.run("""
        import ipyparallel as ipp
        cluster = ipp.Cluster(n=2, log_level=40)
        rc = cluster.start_and_connect_sync(activate=True)
        rc.wait_for_engines(2, timeout=120)
        view = rc[:]
        view.activate()
    """)
    started = time.perf_counter() - start
    kernel.run("""
        from notebook_accel.launch.handoff.ports import free_port
        port = free_port()
        view.scatter("rank", [0, 1], flatten=True, block=True)
        view.push({"port": port}, block=True)
    """)
    kernel.run("""%%px --block
        import os, torch, torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
    """)
    noop_cell = kernel.seconds(f"-n {cells} -r 5 get_ipython().run_cell_magic('px', '--block', 'pass')")
    reduce_cell = kernel.seconds(
        f"-n {cells} -r 5 get_ipython().run_cell_magic('px', '--block', "
        "'t = torch.ones(1); dist.all_reduce(t)')")
    kernel.run("cluster.stop_cluster_sync()")
    return {"start": started, "noop": noop_cell[0], "all_reduce": reduce_cell[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--no-px", action="store_true", help="skip ipyparallel's %%px")
    parser.add_argument("--gib", type=float, default=1.0, help="size of the big tensor argument")
    options = parser.parse_args()

    rows: list[tuple[str, float, float | None]] = []  # name, median s, p99 s
    WorkerPool(num_processes=2, start_method="forkserver", output="none").close()  # warm it
    for method in ("forkserver", "fork"):  # the fork pool is the one measured below
        start = time.perf_counter()
        pool = WorkerPool(num_processes=2, start_method=method, output="none")
        rows.append((f"pool start ({method}, group ready)", time.perf_counter() - start, None))
        if method == "forkserver":
            pool.close()
    timed(lambda: pool.run(noop), 50)  # warm
    rows.append(("pool.run(noop)", *summary(timed(lambda: pool.run(noop), options.runs))))
    rows.append(("pool.run(1-element all_reduce)",
                 *summary(timed(lambda: pool.run(one_allreduce), options.runs))))
    launches = timed(lambda: notebook_launcher(one_off_allreduce, num_processes=2, output="none"), 7)
    rows.append(("one-off notebook_launcher (all_reduce)", *summary(launches)))
    cpu = idle_cpu(pool)
    pool.close()
    plain_cpu = idle_cpu_plain_gloo()
    big_seconds, big_extra = big_argument(options.gib)
    rows.append((f"pool.run with a {options.gib:g} GiB tensor argument", big_seconds, None))

    kernel = KernelTimer()
    try:
        cell = cell_on_pool(kernel, options.cells)
        rows.append(("%%accelerate cell on the pool (%timeit)", cell[0], None))
        peer = None
        if not options.no_px:
            try:
                peer = px(kernel, options.cells)
            except Exception as error:  # noqa: BLE001 - ipyparallel missing or failing
                print(f"ipyparallel's %%px skipped: {str(error).splitlines()[-1]}", file=sys.stderr)
        if peer:
            rows += [("ipyparallel %%px cluster start", peer["start"], None),
                     ("ipyparallel %%px no-op cell", peer["noop"], None),
                     ("ipyparallel %%px all_reduce cell", peer["all_reduce"], None)]
    finally:
        kernel.close()

    print(f"\nwarm pool, 2 ranks ({psutil.cpu_count()} cores)")
    for name, median, p99 in rows:
        tail = f"   p99 {p99 * 1e3:8.3f} ms" if p99 is not None else ""
        print(f"  {name:42s} {median * 1e3:9.3f} ms{tail}")
    figures = {name: median for name, median, _ in rows}
    noop_run = figures["pool.run(noop)"]
    ratio = f" (ratio {cpu / plain_cpu:.2f}x)" if plain_cpu else ""
    print(f"  idle pool: workers' CPU over 10 s = {cpu * 100:.3f}% of one core; two plain processes "
          f"idle in a gloo group (reference): {plain_cpu * 100:.3f}%{ratio}")
    print(f"  the {options.gib:g} GiB argument took {big_extra:.2f} GiB of extra memory on 2 ranks "
          "(the machine's available memory, so other programs add noise)")
    print("ratios:")
    print(f"  one-off launch / pool all_reduce run: "
          f"{figures['one-off notebook_launcher (all_reduce)'] / figures['pool.run(1-element all_reduce)']:.0f}x")
    if peer:
        print(f"  %%px no-op / pool.run(noop): {peer['noop'] / noop_run:.1f}x; "
              f"%%px all_reduce / pool all_reduce run: "
              f"{peer['all_reduce'] / figures['pool.run(1-element all_reduce)']:.1f}x; "
              f"%%px no-op / %%accelerate cell on the pool: "
              f"{peer['noop'] / figures['%%accelerate cell on the pool (%timeit)']:.1f}x")


if __name__ == "__main__":
    main()
