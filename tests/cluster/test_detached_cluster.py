"""A detached pool on a real Ray cluster: its keeper is a detached Ray actor that outlives the
driver (a process killed with SIGKILL mid-run); another driver attaches by name and sees every
line of the run once, and its result; stopping it leaves no actor, hub or rank behind."""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from notebook_accel import WorkerPool
from notebook_accel.launch.detached import ray_client
from notebook_accel.launch.detached.ray_keeper import NAMESPACE

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the cluster's raylets live for the whole module

STEPS = 60


def _ours(cluster) -> list[psutil.Process]:
    """The cluster's processes that hold a keeper actor or a node hub (Ray's process names;
    a hub's ranks keep its command line, not its name)."""
    found = []
    for node in cluster.nodes:
        for proc in node.tree():
            try:
                name = proc.name()
            except psutil.Error:
                continue
            if name.startswith(("ray::RayKeeper", "ray::NodeHub")):
                found.append(proc)
    return found


def test_a_detached_pool_on_ray_outlives_its_driver_and_is_attached_by_name(cluster, capsys):
    started = time.monotonic()
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from notebook_accel import WorkerPool
        from tests.runtime.test_pool import notebook

        cells = notebook('''
            import time

            def numbered(steps, pause):
                import os
                for step in range(steps):
                    print(f"numbered {{step}}", flush=True)
                    time.sleep(pause)
                return ("done", steps, os.environ["RANK"])
        ''')
        pool = WorkerPool(detach=True, name="rayexp", num_processes=1, num_nodes=2,
                          cluster={cluster.address!r})
        pool.submit(cells["numbered"], {STEPS}, 0.05)
        print("submitted", flush=True)
        time.sleep(600)  # a kernel, busy, until it is killed
    """)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    bound = threading.Timer(120, driver.kill)  # a driver that never gets there: no hang
    bound.start()
    try:
        seen = []
        for line in driver.stdout:  # (its own notes, then ours)
            seen.append(line)
            if line.startswith("submitted"):
                break
        else:
            pytest.fail("the driver did not start the pool:\n" + "".join(seen))
        time.sleep(1.0)  # mid-run
    finally:
        bound.cancel()
        driver.send_signal(signal.SIGKILL)  # the driver (a kernel) dies
        driver.wait()
    capsys.readouterr()

    # another driver (this process) attaches by name: every line once, then the result
    (info,) = [i for i in ray_client.cluster_pools(cluster.address) if i["name"] == "rayexp"]
    assert (info["ranks"], info["alive"], info["device"]) == (2, 2, "cpu"), info
    assert info["state"].startswith("running a background run of numbered"), info
    pool = WorkerPool.attach("rayexp", cluster=cluster.address)
    assert pool.plan.world_size == 2 and pool.plan.num_nodes == 2
    handle = pool.background
    assert handle is not None and handle.watch() == ("done", STEPS, "0")
    out = capsys.readouterr().out
    for node in (0, 1):
        counts = [out.count(f"[node {node} rank {node}] numbered {i}\n") for i in range(STEPS)]
        assert counts == [1] * STEPS, (node, counts, out)
    assert "numbered 0" in handle.logs(1) and f"numbered {STEPS - 1}" in handle.logs(1)

    # the same surface: a run shown now, its value; the names stay on the keeper's workers
    assert pool.run(_rank_and_node) == (0, "0")
    ranks = pool.status()
    assert [r.alive for r in ranks] == [True, True]
    pids = [r.pid for r in ranks] + [info["pid"]]
    assert len(_ours(cluster)) == 3  # the keeper actor and a hub per node

    # %accelerate pools lists it (this process is connected to the cluster)
    from magics.pool import pools

    pools(None)
    listed = capsys.readouterr().out
    assert re.search(rf"rayexp: 2/2 ranks on cpu, idle for .*, keeper actor pid {info['pid']} "
                     rf"on {re.escape(info['node'])} \(Ray cluster {re.escape(cluster.address)}\)",
                     listed), listed

    from magics.pool import stop  # %accelerate stop rayexp (the cluster: the one connected)

    stop(argparse.Namespace(target="rayexp", cluster=None))
    assert "detached pool 'rayexp' stopped" in capsys.readouterr().out
    pool.leave()  # (its connection stops touching the keeper: nothing of this test goes on)
    import ray

    assert not [a for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == NAMESPACE]
    deadline = time.monotonic() + 15
    while (_ours(cluster) or any(psutil.pid_exists(p) for p in pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _ours(cluster) and not [p for p in pids if psutil.pid_exists(p)]
    with pytest.raises(ValueError, match="no detached pool named 'rayexp' is up on the Ray cluster"):
        WorkerPool.attach("rayexp", cluster=cluster.address)
    print(f"took {time.monotonic() - started:.1f} s", file=sys.stderr)


def _rank_and_node():
    import os

    return int(os.environ["RANK"]), os.environ["NODE_RANK"]


def test_a_detached_pool_on_ray_with_no_kernel_ends_itself_after_idle_timeout(cluster):
    pool = WorkerPool(detach=True, name="rayidle", num_processes=1, num_nodes=2,
                      cluster=cluster.address, idle_timeout=2.0)
    pids = [r.pid for r in pool.status()]
    assert len(_ours(cluster)) == 3
    pool.leave()  # no kernel attached from now on
    left = time.monotonic()
    while ray_client.keeper_actor("rayidle", cluster.address) is not None:
        assert time.monotonic() - left < 15, "the idle keeper actor did not end itself"
        time.sleep(0.2)
    assert time.monotonic() - left >= 2.0
    deadline = time.monotonic() + 15
    while (_ours(cluster) or any(psutil.pid_exists(p) for p in pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _ours(cluster) and not [p for p in pids if psutil.pid_exists(p)]
