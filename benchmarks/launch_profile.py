"""Launch profile: a one-off launch and warm-pool runs broken into their parts, kernel and worker.

One process, 2 workers, CPU/gloo. Rows, each with median and p99 over the repetitions:

- one-off ``notebook_launcher`` of a function that builds an ``Accelerator`` and does one
  ``reduce``, alternated with Hugging Face Accelerate's ``notebook_launcher`` of the same function
  (the peer; its ``Accelerator``) for the ratio;
- ``pool.run(noop)`` and ``pool.run`` of a 1-element ``all_reduce``;
- a ``%%accelerate`` cell on the notebook's pool (``x = 1``, one with an ``all_reduce``, and
  an 80-line cell, a training cell's size, run again with ``--no-pull``), through the magic's own
  code path in an in-process IPython shell (no kernel, no ZMQ); and
  ``x = 1`` again after 2,000 cells of a session (a payload must not grow with them), then
  with 350 names living on the ranks (what each run's end reports);
- the machine's floor under a pool run: a byte written to two forked Python processes that
  wait in ``poll`` and write it back (no pickle, no threads, no bookkeeping).

The parts come from ``time.perf_counter_ns`` stamps taken by wrappers this script puts around
the engine's functions (the kernel's, and the worker's, which forked workers inherit); nothing
in the product is instrumented, so the plain runs (no wrappers) give the totals and the
profiled runs (alternated with them) the parts. Stamps of every process share one clock
(CLOCK_MONOTONIC), so a worker's stamps and the kernel's read on one time line.

    python benchmarks/launch_profile.py [--launches 15] [--runs 1000] [--cells 300]
    python benchmarks/launch_profile.py --baseline REV   # both revisions' figures, same run
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import select
import signal
import statistics
import sys
import time

os.environ.setdefault("ACCELERATE_USE_CPU", "yes")  # the peer really distributes on the CPU

STAMPS: list[tuple[str, int]] = []  # this process's stamps (a forked worker: its own copy)
_now = time.perf_counter_ns


def stamp(key: str) -> None:
    STAMPS.append((key, _now()))


# -- the measured functions (importable: cloudpickle sends them by reference) ------------------

def ours_reduce() -> tuple[float, list]:
    """Build an Accelerator (joins the group), reduce one tensor; rank 0's stamps with it."""
    stamp("fn<")
    import torch

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    stamp("rendezvous>")
    value = accelerator.reduce(torch.ones(1), "sum").item()
    stamp("fn>")
    return value, list(STAMPS)


def peer_reduce() -> float:
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    return accelerator.reduce(torch.ones(1), "sum").item()


def noop() -> None:
    return None


def stamped_noop() -> None:
    stamp("fn<")
    stamp("fn>")


def one_allreduce() -> float:
    import torch
    import torch.distributed as dist

    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    return tensor.item()


def stamped_allreduce() -> float:
    stamp("fn<")
    value = one_allreduce()
    stamp("fn>")
    return value


def worker_stamps() -> list:
    """A pool worker's stamps so far (then forgotten)."""
    taken = list(STAMPS)
    STAMPS.clear()
    return taken


# -- wrappers around the engine's functions -------------------------------------------------------

def _wrapped(original, key: str, clear: bool = False):
    def wrapper(*args, **kwargs):
        if clear:  # a worker's first stamp: forget the kernel's, inherited at the fork
            STAMPS.clear()
        STAMPS.append((key + "<", _now()))
        try:
            return original(*args, **kwargs)
        finally:
            STAMPS.append((key + ">", _now()))
    wrapper.__wrapped__ = original
    return wrapper


class Wrappers:
    """Stamp wrappers put on ``(owner, attribute, key[, clear])`` places (those that exist);
    ``remove`` restores them."""

    def __init__(self, places) -> None:
        self.saved = []
        for owner, attribute, key, *clear in places:
            if not hasattr(owner, attribute):  # an older revision's engine (--baseline)
                continue
            own = attribute in vars(owner)
            original = getattr(owner, attribute)
            self.saved.append((owner, attribute, vars(owner).get(attribute), own))
            setattr(owner, attribute, _wrapped(original, key, bool(clear)))

    def remove(self) -> None:
        for owner, attribute, original, own in reversed(self.saved):
            if own:
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)


def engine_places() -> list[tuple]:
    from notebook_accel.launch import launcher
    from notebook_accel.launch.backends import processes
    from notebook_accel.launch.backends.pool import PoolBackend
    from notebook_accel.launch.pools import pool
    from notebook_accel.launch.supervision.supervisor import Supervisor
    from notebook_accel.launch.worker import main as worker_main
    from notebook_accel.launch.worker import serve

    return [
        # the kernel: a one-off launch
        (launcher, "_launch", "launch"), (launcher, "plan_launch", "plan"),
        (launcher, "serialise_payload", "payload"), (launcher, "warn_missing_globals", "globals"),
        (launcher, "backend_for", "backend"), (processes.ProcessBackend, "check", "check"),
        (launcher, "launch_once", "launch_once"), (processes.ProcessBackend, "start", "start"),
        (Supervisor, "run", "supervise"),
        # the kernel: a pool run
        (pool.WorkerPool, "_ready", "ready"), (pool.WorkerPool, "_payload", "payload"),
        (pool, "launch_once", "launch_once"), (PoolBackend, "start", "start"),
        # the worker (forked workers inherit these)
        (processes, "worker_main", "worker", True), (worker_main, "setup", "setup"),
        (worker_main, "execute", "execute"),
        (processes, "serve_main", "worker", True), (serve, "_serve_run", "run"),
        (serve, "execute", "execute"),
    ]


# -- the tables' rows: (side, part, from stamp, to stamp) -----------------------------------------

ONE_OFF = [
    ("kernel", "request: options checked", "call<", "launch<"),
    ("kernel", "plan: options filled, hardware", "plan<", "plan>"),
    ("kernel", "payload: pickled", "payload<", "payload>"),
    ("kernel", "checks: globals, notes, backend", "globals<", "check>"),
    ("kernel", "start: pipes, fork x2", "start<", "start>"),
    ("kernel", "bookkeeping: relay, record, view", "start>", "supervise<"),
    ("worker", "fork -> rank 0 runs", "start<", "worker<"),
    ("worker", "setup: session, output, signals", "setup<", "setup>"),
    ("worker", "payload loaded -> first line", "execute<", "fn<"),
    ("worker", "Accelerator(): rendezvous", "fn<", "rendezvous>"),
    ("worker", "reduce", "rendezvous>", "fn>"),
    ("kernel", "result, exits reaped", "fn>", "supervise>"),
    ("kernel", "after: values loaded, closed", "supervise>", "call>"),
    ("total", "profiled total", "call<", "call>"),
]
POOL = [
    ("kernel", "cell: flags, names, job", "call<", "ready<"),
    ("kernel", "checks: callable, dead ranks", "ready<", "ready>"),
    ("kernel", "payload: pickled (+ cell sources)", "payload<", "payload>"),
    ("kernel", "launch_once -> send", "launch_once<", "start<"),
    ("kernel", "send: a Run to each rank", "start<", "start>"),
    ("kernel", "bookkeeping: relay, record, view", "start>", "supervise<"),
    ("worker", "Run sent -> rank 0 has it", "start<", "run<"),
    ("worker", "payload loaded -> first line", "execute<", "fn<"),
    ("worker", "function", "fn<", "fn>"),
    ("worker", "execute: load, bind, call, value", "execute<", "execute>"),
    ("worker", "RunDone: names, counts, sent", "execute>", "run>"),
    ("kernel", "RunDone -> supervisor done", "run>", "supervise>"),
    ("kernel", "after: value, group trusted", "supervise>", "launch_once>"),
    ("kernel", "after: cell names back", "launch_once>", "call>"),
    ("total", "profiled total", "call<", "call>"),
]


def _first(stamps: list[tuple[str, int]]) -> dict[str, int]:
    found: dict[str, int] = {}
    for key, ns in stamps:
        found.setdefault(key, ns)
    return found


def parts(rows, runs: list[dict[str, int]]) -> list[tuple[str, str, list[float]]]:
    """Each row's durations (seconds) over the runs that have both of its stamps."""
    out = []
    for side, name, start, end in rows:
        values = [(run[end] - run[start]) / 1e9 for run in runs if start in run and end in run]
        if values:
            out.append((side, name, values))
    return out


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def timed(function, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = _now()
        function()
        times.append((_now() - start) / 1e9)
    return times


# -- the scenarios -----------------------------------------------------------------------------

def one_off(launches: int) -> dict:
    """Ours plain, ours profiled and the peer, alternated."""
    from notebook_accel import notebook_launcher

    try:
        from accelerate import notebook_launcher as peer_launcher
    except ImportError:
        peer_launcher = None
        print("accelerate is not installed (pip install accelerate==1.15.0): no peer ratio",
              file=sys.stderr)

    def ours() -> list:
        value, stamps = notebook_launcher(ours_reduce, num_processes=2, output="none")
        assert value == 2.0, value
        return stamps

    def peer() -> None:
        from notebook_accel.launch.handoff.ports import free_port

        with contextlib.redirect_stdout(io.StringIO()):
            assert peer_launcher(peer_reduce, num_processes=2, use_port=str(free_port())) is None

    def profiled() -> dict[str, int]:
        wrappers = Wrappers(engine_places())
        STAMPS.clear()
        try:
            stamp("call<")
            worker = ours()
            stamp("call>")
        finally:
            wrappers.remove()
        return {**_first(STAMPS), **_first(worker)}

    ours(), profiled()  # warm: imports, the first fork's lazy imports
    if peer_launcher:
        peer()
    plain, peer_times, runs = [], [], []
    for _ in range(launches):
        plain += timed(ours, 1)
        runs.append(profiled())
        if peer_launcher:
            peer_times += timed(peer, 1)
    return {"plain": plain, "peer": peer_times, "parts": parts(ONE_OFF, runs)}


def _split(stamps: list[tuple[str, int]], marker: str) -> list[list[tuple[str, int]]]:
    runs: list[list[tuple[str, int]]] = []
    for key, ns in stamps:
        if key == marker:
            runs.append([])
        if runs:
            runs[-1].append((key, ns))
    return runs


def profile_calls(call, count: int, read_worker) -> list[dict[str, int]]:
    """``count`` stamped calls of ``call``, each merged with its run's stamps on rank 0."""
    kernel_runs = []
    read_worker()  # forget what came before
    for _ in range(count):
        STAMPS.clear()
        stamp("call<")
        call()
        stamp("call>")
        kernel_runs.append(_first(STAMPS))
    worker_runs = [_first(run) for run in _split(read_worker(), "run<")]
    worker_runs = [run for run in worker_runs if "run>" in run][:count]  # not read_worker's own
    return [{**k, **w} for k, w in zip(kernel_runs, worker_runs, strict=False)]


def pool_runs(runs: int) -> dict:
    from notebook_accel import WorkerPool

    results = {}
    plain_pool = WorkerPool(num_processes=2, output="none")
    wrappers = Wrappers(engine_places())  # the profiled pool's workers inherit them
    try:
        profiled_pool = WorkerPool(num_processes=2, output="none")
    finally:
        wrappers.remove()
    try:
        for name, plain_fn, stamped_fn in (("noop", noop, stamped_noop),
                                           ("all_reduce", one_allreduce, stamped_allreduce)):
            timed(functools.partial(plain_pool.run, plain_fn), 50)  # warm
            plain, profiled = [], []
            block = 50  # alternate plain and profiled blocks
            for _ in range(max(1, runs // block)):
                plain += timed(functools.partial(plain_pool.run, plain_fn), block)
                wrappers = Wrappers(engine_places())
                try:
                    profiled += profile_calls(functools.partial(profiled_pool.run, stamped_fn), block,
                                              functools.partial(profiled_pool.run, worker_stamps))
                finally:
                    wrappers.remove()
            results[name] = {"plain": plain, "parts": parts(POOL, profiled)}
    finally:
        plain_pool.close()
        profiled_pool.close()
    return results


def magic_cells(cells: int) -> dict | None:
    """``%%accelerate`` cells on the notebook's pool through the magic, in an in-process shell."""
    try:
        from IPython.core.interactiveshell import InteractiveShell
    except ImportError:
        print("IPython is not installed: no %%accelerate rows", file=sys.stderr)
        return None
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "notebook_accel")
    bodies = {"x = 1": "x = 1",
              "all_reduce": "import torch, torch.distributed as dist\n"
                            "t = torch.ones(1)\ndist.all_reduce(t)",
              LONG_CELL: "%%accelerate --no-pull\n" + long_cell()}

    def cell(body: str):
        line, _, text = body.removeprefix("%%accelerate").partition("\n") if body.startswith(
            "%%") else ("", "", body)
        return lambda: shell.run_cell_magic("accelerate", line.strip(), text)

    def worker() -> list:
        from magics import pool as notebook_pool

        return notebook_pool.current().run(worker_stamps)

    results: dict = {name: {} for name in bodies}
    with contextlib.redirect_stdout(io.StringIO()):
        for profiled in (False, True):
            wrappers = Wrappers(engine_places()) if profiled else None
            try:
                shell.run_line_magic("accelerate", "start -n 2")
            finally:
                if wrappers:
                    wrappers.remove()
            try:
                for name, body in bodies.items():
                    timed(cell(body), 30)  # warm
                    if not profiled:
                        results[name]["plain"] = timed(cell(body), cells)
                        continue
                    wrappers = Wrappers(engine_places())
                    try:
                        runs = profile_calls(cell(body), cells, worker)
                    finally:
                        wrappers.remove()
                    results[name]["parts"] = parts(POOL, runs)
            finally:
                shell.run_line_magic("accelerate", "stop")
        shell.run_line_magic("accelerate", "start -n 2")  # a long session: cells run before
        try:
            for number in range(LONG_SESSION):
                shell.run_cell(f"value_{number} = {number}", store_history=True)
            timed(cell("x = 1"), 30)
            results[f"x = 1, after {LONG_SESSION:,} cells"] = {"plain": timed(cell("x = 1"), cells)}
            shell.run_cell_magic("accelerate", "--no-pull", MANY_NAMES)
            timed(cell("x = 1"), 30)
            results["x = 1, 350 names on ranks"] = {"plain": timed(cell("x = 1"), cells)}
        finally:
            shell.run_line_magic("accelerate", "stop")
    return results


LONG_SESSION = 2000  # cells run before the last row's (a day's notebook)
LONG_CELL = "80 lines, --no-pull"
# a notebook an hour in: 350 names living on the ranks (data, 50 functions, modules), which
# every run's end reports to the kernel
MANY_NAMES = ("import math, os, json\nfor i in range(300):\n    globals()[f'v{i}'] = i\n"
              "for i in range(50):\n    exec(f'def f{i}(): return {i}')\n")


def long_cell(lines: int = 80) -> str:
    """A training cell's size: a function of ``lines`` lines defined, nothing run (``--no-pull``:
    what the row measures is the magic's own work on a long cell, run again)."""
    body = [f"    h{i} = max(h{i - 1} * w{i % 4} + b{i % 4}, 0) if i > 0 else x" for i in
            range(1, lines - 2)]
    return "def forward(x, w0, w1, w2, w3, b0, b1, b2, b3, i=1):\n    h0 = x\n" + "\n".join(
        body) + f"\n    return h{lines - 3}"


def pipe_floor(rounds: int = 3000) -> list[float]:
    """The machine's floor under a pool run: the kernel writes a byte to each of two forked
    Python processes, which wait in ``poll`` and write it back (no pickle, no threads)."""
    ends, children = [], []
    for _ in range(2):
        down, up = os.pipe(), os.pipe()
        pid = os.fork()
        if pid == 0:  # the child echoes until it is killed
            poller = select.poll()
            poller.register(down[0], select.POLLIN)
            while poller.poll():
                os.write(up[1], os.read(down[0], 1))
        ends.append((down[1], up[0]))
        children.append((pid, (*down, *up)))
    times = []
    for _ in range(rounds):
        start = _now()
        for down, _up in ends:
            os.write(down, b"x")
        for _down, up in ends:
            os.read(up, 1)
        times.append((_now() - start) / 1e9)
    for pid, fds in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        for fd in fds:
            os.close(fd)
    return times


def measure(options: argparse.Namespace) -> dict:
    """Every figure, as JSON-ready values (medians and p99s in seconds)."""
    figures: dict = {"cores": os.cpu_count()}
    figures["floor: 2 processes echo a byte"] = {"total": summary(pipe_floor())}
    launch = one_off(options.launches)
    pools = pool_runs(options.runs)
    cells = magic_cells(options.cells)

    def table(rows) -> list:
        return [[side, name, *summary(values)] for side, name, values in rows]

    figures["one-off launch"] = {"total": summary(launch["plain"]), "table": table(launch["parts"])}
    if launch["peer"]:
        figures["peer one-off launch"] = {"total": summary(launch["peer"])}
        figures["ratio"] = statistics.median(
            a / b for a, b in zip(launch["plain"], launch["peer"], strict=True))
    for name, result in pools.items():
        figures[f"pool.run({name})"] = {"total": summary(result["plain"]),
                                        "table": table(result["parts"])}
    for name, result in (cells or {}).items():
        figures[f"%%accelerate cell ({name})"] = {"total": summary(result["plain"]),
                                                  "table": table(result.get("parts", []))}
    return figures


GOALS = {"pool.run(noop)": 0.15e-3, "%%accelerate cell (x = 1)": 0.5e-3,
         "%%accelerate cell (all_reduce)": 0.6e-3}


def show(figures: dict, title: str) -> None:
    print(f"\n== {title} ({figures['cores']} cores); ms: median / p99")
    for scenario, value in figures.items():
        if not isinstance(value, dict):
            continue
        median, p99 = value["total"]
        goal = f"   (goal <= {GOALS[scenario] * 1e3:.2f} ms)" if scenario in GOALS else ""
        print(f"{scenario:46s} total {median * 1e3:9.3f} / {p99 * 1e3:9.3f}{goal}")
        for side, name, part_median, part_p99 in value.get("table", []):
            print(f"   {side:6s} {name:48s} {part_median * 1e3:9.3f} / {part_p99 * 1e3:9.3f}")
    if "ratio" in figures:
        print(f"one-off launch / peer's (alternated, median of ratios): {figures['ratio']:.2f}x "
              "(goal <= 0.6x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=15, help="one-off launches per contender")
    parser.add_argument("--runs", type=int, default=1000, help="pool runs per function")
    parser.add_argument("--cells", type=int, default=300, help="%%accelerate cells per body")
    parser.add_argument("--baseline", help="also measure this revision (alternated sides, "
                                           "each in its own process)")
    parser.add_argument("--sides", type=int, default=2, help="rounds of sides with --baseline")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    arguments = ["--measure", "--launches", str(options.launches), "--runs", str(options.runs),
                 "--cells", str(options.cells)]
    if options.measure:
        print("FIGURES", json.dumps(measure(options)), flush=True)
        return
    if not options.baseline:
        show(measure(options), "this checkout")
        return
    from revision_sides import ROOT, baseline_worktree, run_side

    with baseline_worktree(options.baseline) as base:
        sides: dict[str, list[dict]] = {"baseline": [], "this": []}
        for _ in range(options.sides):
            for side, directory in (("baseline", base), ("this", ROOT)):
                figures = run_side(__file__, directory, arguments, timeout=1800)
                if "error" in figures:
                    raise SystemExit(f"{side}: no figures\n{figures['error']}")
                sides[side].append(figures)
    for side, rounds in sides.items():
        show(rounds[-1], f"{side} ({options.baseline if side == 'baseline' else 'this checkout'}),"
                         " last round")
    print(f"\nthis / baseline {options.baseline}, medians, per round (sides alternated):")
    for scenario in sides["this"][0]:
        if not isinstance(sides["this"][0][scenario], dict):
            continue
        ratios = [f"{t[scenario]['total'][0] / b[scenario]['total'][0]:.2f}"
                  for b, t in zip(sides["baseline"], sides["this"], strict=True)
                  if scenario in b]
        print(f"  {scenario:46s} {' '.join(ratios)}")


if __name__ == "__main__":
    import launch_profile  # the measured functions from an importable module, not __main__

    launch_profile.main()
