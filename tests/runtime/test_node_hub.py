"""The cluster backend's node hubs and links without Ray: two hubs in this process (each forks its
ranks, as on its node), Ray's calls made directly, the kernel's side as it is (links taken apart
into each rank's channels, the shared supervisor). Every line and result arrives; a crash is
named; ends come after the last line with no wait; a lost link ends its ranks at once."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from notebook_accel import WorkerError
from notebook_accel.launch.backends import cluster
from notebook_accel.launch.backends.base import Backend
from notebook_accel.launch.cluster import placement
from notebook_accel.launch.handoff.payload import serialise_payload
from notebook_accel.launch.launcher import launch_once, plan_launch
from notebook_accel.launch.planning.request import LaunchRequest
from notebook_accel.launch.worker.hub.node_hub import NodeHub
from tests.cluster.checks import wait_until_seen_dead
from tests.runtime.test_pool import notebook


class _Ref:
    def __init__(self, value):
        self.value = value


class _Call:
    def __init__(self, method):
        self.remote = lambda *args: _Ref(method(*args))  # runs at once


class _Actor:
    def __init__(self, hub):
        self.hub = hub

    def __getattr__(self, name):
        return _Call(getattr(self.hub, name))


class _Ray:
    class util:  # noqa: N801 - ray.util
        @staticmethod
        def get_node_ip_address():
            return "127.0.0.1"

    class exceptions:  # noqa: N801 - ray.exceptions
        RayActorError = RuntimeError

    @staticmethod
    def get(ref, timeout=None):
        return [each.value for each in ref] if isinstance(ref, list) else ref.value

    @staticmethod
    def put(value):
        return value

    @staticmethod
    def wait(refs, num_returns=1, timeout=None):
        return refs, []


class _HubBackend(Backend):
    """The cluster backend's start, on hubs in this process."""

    def __init__(self, nodes: int) -> None:
        hub = NodeHub.__new__(NodeHub)  # no torch import: the ranks here need none
        self.placed = placement.Placement(None, [_Actor(hub)] * nodes, ["127.0.0.1"] * nodes,
                                          [os.getpid()] * nodes, [[] for _ in range(nodes)])
        self.groups: list[cluster.ClusterGroup] = []

    def start(self, plan, payload):
        links, handles = cluster._start(_Ray, plan, payload, self.placed)
        self.groups.append(cluster.ClusterGroup(plan, handles, links))
        return self.groups[-1]


def _launch(function, nodes=2, per_node=2, **options):
    request = LaunchRequest.from_keywords("notebook_launcher", {
        "num_processes": per_node, "num_nodes": nodes, "cluster": "in-process",
        "timeout": options.pop("timeout", None), "return_all": options.pop("return_all", True)})
    plan = plan_launch(request, [])
    backend = _HubBackend(nodes)
    return launch_once(backend, plan, serialise_payload(function, (), {})), backend


def _lines():
    import sys

    rank = os.environ["RANK"]
    for i in range(500):
        print(f"line {rank}:{i}", file=sys.stdout if i % 2 else sys.stderr)
    return int(rank), os.environ["NODE_RANK"], os.environ["LOCAL_RANK"]


def test_every_rank_returns_and_every_line_arrives_once_in_order(capsys):
    started = time.monotonic()
    values, backend = _launch(_lines)
    took = time.monotonic() - started
    assert values == [(0, "0", "0"), (1, "0", "1"), (2, "1", "0"), (3, "1", "1")]
    out, err = capsys.readouterr()
    for rank in range(4):
        node = rank // 2
        seen = [int(i) for i in re.findall(rf"^\[node {node} rank {rank}\] line {rank}:(\d+)$",
                                            out + err, re.MULTILINE)]
        assert sorted(seen) == list(range(500)), f"rank {rank}: {len(seen)} lines"
        odd = [int(i) for i in re.findall(rf"rank {rank}\] line {rank}:(\d+)$", out, re.MULTILINE)]
        assert odd == list(range(1, 500, 2))
    assert took < 10, took  # no end-grace wait per rank
    (group,) = backend.groups
    assert len(group.links.links) == 2  # one connection per node


def _crash_on_rank_3():
    import time

    if os.environ["RANK"] == "3":
        time.sleep(0.3)
        raise RuntimeError("boom on node 1")
    print(f"pid={os.getpid()}", flush=True)
    time.sleep(60)


def test_a_crash_is_named_within_a_second_and_nothing_is_left(capsys):
    with pytest.raises(WorkerError) as caught:
        _launch(_crash_on_rank_3)
    took = time.time() - caught.value.failure.timestamp
    assert str(caught.value).startswith("rank 3 on node 1 (127.0.0.1) failed: RuntimeError: boom")
    assert "raise RuntimeError" in caught.value.remote_traceback
    assert took < 1.5, took
    pids = [int(p) for p in re.findall(r"pid=(\d+)", capsys.readouterr().out)]
    assert len(pids) == 3
    time.sleep(0.2)
    assert not [pid for pid in pids if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def _ignore_sigterm_then_wait():
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ["RANK"] == "0":
        time.sleep(0.5)
        raise ValueError("stop the others")
    time.sleep(60)


def test_the_hub_kills_a_rank_that_ignores_sigterm_after_2s_on_its_own_clock():
    started = time.monotonic()
    with pytest.raises(WorkerError, match="ValueError: stop the others"):
        _launch(_ignore_sigterm_then_wait)
    assert time.monotonic() - started < 0.5 + 2.0 + 1.5


def _sleep():
    import time

    print(f"pid={os.getpid()}", flush=True)
    time.sleep(60)


def test_a_link_that_ends_ends_its_nodes_ranks_naming_the_node(capsys, monkeypatch):
    """The kernel's end of node 1's link breaks (as when its host is gone): its ranks end
    without an exit status, named; the job fails within a second; no rank is left."""
    import threading

    original = cluster.NodeLinks.__init__

    def broken_later(self, links, ranks):
        original(self, links, ranks)
        # SHUT_RDWR: node 1's link ends, between two beats (a beat sent on the shut link at the
        # same moment would find it broken first: another cause, said otherwise)
        threading.Timer(1.5, links[1].shutdown, (2,)).start()

    monkeypatch.setattr(cluster.NodeLinks, "__init__", broken_later)
    started = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        _launch(_sleep)
    took = time.monotonic() - started
    assert re.match(r"rank [23] on node 1 \(127\.0\.0\.1\) ended without an exit status: its node "
                    r"or its Ray worker was lost \(its node's link ended\)", str(caught.value)), \
        str(caught.value)
    assert took < 4.0, took
    pids = [int(p) for p in re.findall(r"pid=(\d+)", capsys.readouterr().out)]
    time.sleep(0.3)
    assert not [pid for pid in pids if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def test_a_stop_signal_goes_through_the_link(capsys):
    import threading

    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _launch(_sleep)
    assert time.monotonic() - started < 1.5 + 2.0


def test_a_kept_hub_that_stays_silent_is_replaced_within_seconds(monkeypatch):
    """A hub placed by an earlier launch that does not link back (frozen) holds the next launch
    for LINK_TIMEOUT seconds, not the 60 s a fresh placement may take: it is placed afresh."""

    class Frozen(NodeHub):
        def start(self, specs, payload, kernel, token, node):
            return [0] * len(specs), 1  # never links back

    def hubs(hub):
        return placement.Placement(None, [_Actor(hub)] * 2, ["127.0.0.1"] * 2,
                                   [os.getpid()] * 2, [[] for _ in range(2)])

    placements = [hubs(Frozen.__new__(Frozen)), hubs(NodeHub.__new__(NodeHub))]
    discarded = []
    monkeypatch.setattr(placement, "ray_module", lambda: _Ray)
    monkeypatch.setattr(placement, "is_placed", lambda plan: not discarded)
    monkeypatch.setattr(placement, "placement_for", lambda plan: placements[len(discarded)])
    monkeypatch.setattr(placement, "discard", discarded.append)
    plan = plan_launch(LaunchRequest.from_keywords("notebook_launcher", {
        "num_processes": 1, "num_nodes": 2, "cluster": "in-process", "output": "all",
        "return_all": True}), [])
    started = time.monotonic()
    links, handles = cluster.start_ranks(plan, serialise_payload(_sleep, (), {}))
    took = time.monotonic() - started
    try:
        assert len(discarded) == 1 and len(handles) == 2
        assert cluster.LINK_TIMEOUT <= took < cluster.LINK_TIMEOUT + 3, took
    finally:
        cluster.ClusterGroup(plan, handles, links).close()


def test_the_kernel_waits_on_one_descriptor_for_every_rank(monkeypatch):
    """2 nodes x 8 ranks: the supervisor waits on the launch's one inbox, not on descriptors
    per rank (the hubs here share this process, so its own count of descriptors would include
    theirs: benchmarks/kernel_hub_scale.py --modes cluster counts the kernel's alone)."""
    from notebook_accel.launch.supervision.supervisor import Supervisor

    watched = []
    register = Supervisor._register

    def counted(self):
        register(self)
        watched.append(len(self.channels.selector) + len(self.channels.event_selector))

    monkeypatch.setattr(Supervisor, "_register", counted)
    values, backend = _launch(_lines, per_node=8)
    assert len(values) == 16 and watched == [1]


def test_a_hub_that_dies_before_linking_fails_the_launch_without_waiting_for_the_link_timeout():
    """Node 1's hub dies before it links back: the launch is not held for the link timeout; the
    hubs are asked through Ray once the links are ``CHECK_AFTER`` late, and its death raises."""

    class Died:
        @property
        def value(self):
            raise RuntimeError("The actor died unexpectedly (node 1's hub)")

    class DeadHub:
        class start:  # noqa: N801 - the actor method
            @staticmethod
            def remote(*args):
                return Died()

    placed = placement.Placement(None, [_Actor(NodeHub.__new__(NodeHub)), DeadHub()],
                                 ["127.0.0.1"] * 2, [os.getpid()] * 2, [[], []])
    plan = plan_launch(LaunchRequest.from_keywords("notebook_launcher", {
        "num_processes": 1, "num_nodes": 2, "cluster": "in-process", "output": "none"}), [])
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="node 1's hub"):
        cluster._start(_Ray, plan, serialise_payload(_sleep, (), {}), placed)
    assert time.monotonic() - started < cluster.LINK_TIMEOUT / 2  # about CHECK_AFTER; slack for a loaded runner


def _hold_memory():
    block = bytearray(64 << 20)  # 64 MB, touched
    time.sleep(2.5)
    return len(block)


def test_each_ranks_memory_reaches_the_view_from_its_hub():
    """A hub measures its ranks' resident memory once a second and sends it on the link: the
    live view's rows (and the record) show a cluster rank's memory as a local launch's."""
    from notebook_accel.launch import last_launch

    values, _ = _launch(_hold_memory)
    assert values == [64 << 20] * 4
    measured = [status.rss for status in last_launch().ranks.values()]
    assert all(rss is not None and 64 << 20 < rss < 4 << 30 for rss in measured), measured




CELLS = notebook("""
    import os

    def remember():
        global kept, mine
        kept = {"lr": 0.1, "step": 7}  # alike on every rank
        mine = int(os.environ["RANK"]) * 10  # each rank its own

    def look():
        import torch
        import torch.distributed as dist
        total = torch.ones(1)
        dist.all_reduce(total)
        return os.getpid(), kept, globals().get("mine"), total.item()
""")


def _hubs_in_this_process(monkeypatch, nodes: int) -> None:
    """A cluster pool's placement: ``nodes`` hubs in this process (Ray's calls made directly)."""
    hub = NodeHub.__new__(NodeHub)
    placed = placement.Placement(None, [_Actor(hub)] * nodes, ["127.0.0.1"] * nodes,
                                 [os.getpid()] * nodes, [[] for _ in range(nodes)])
    monkeypatch.setattr(placement, "ray_module", lambda: _Ray)
    monkeypatch.setattr(placement, "is_placed", lambda plan: True)
    monkeypatch.setattr(placement, "placement_for", lambda plan: placed)
    monkeypatch.setattr(placement, "discard", lambda plan: None)


@pytest.mark.parametrize("victim", [2, 0])
def test_a_dead_pool_rank_is_forked_again_by_its_hub_and_healed(monkeypatch, capfd, victim):
    """A pool on 2 nodes x 2 ranks (hubs in this process): a SIGKILLed rank is forked again by
    its node's hub (a new pid, the same rank) and the pool heals in place at the next run
    (rank 0 dead: the new rank 0 hosts the fresh store); what the ranks held alike is restored
    on it, what each held its own is said lost, the others are the same processes and the
    group is whole."""
    from notebook_accel.launch.pools.pool import WorkerPool

    _hubs_in_this_process(monkeypatch, 2)
    with WorkerPool(num_processes=2, num_nodes=2, cluster="in-process", output="none",
                    return_all=True) as pool:
        pool.run(CELLS["remember"])
        pids = [info.pid for info in pool.status()]
        os.kill(pids[victim], signal.SIGKILL)
        wait_until_seen_dead(pool, victim)
        looks = pool.run(CELLS["look"])
        said = capfd.readouterr().err  # a script's information: stderr
        assert f"rank {victim} was killed by SIGKILL while idle. The pool healed: rank {victim} " \
               "was replaced" in said, said
        assert "kept" in said.split("restored from rank")[1].splitlines()[0], said
        assert f"lost with rank {victim} (each rank held its own value): mine" in said, said
        assert [look[3] for look in looks] == [4.0] * 4
        assert [look[1] for look in looks] == [{"lr": 0.1, "step": 7}] * 4
        assert [look[2] for look in looks] == [None if r == victim else r * 10 for r in range(4)]
        assert [look[0] == pids[r] for r, look in enumerate(looks)] == [r != victim for r in range(4)]
        assert pool.status()[victim].pid == looks[victim][0]


def test_a_pool_whose_node_is_lost_replaces_every_rank_saying_so(monkeypatch, capfd):
    """Node 1's link ends while the pool is idle (its host gone): no hub is left to fork its
    ranks again, so the pool does not heal but replaces every worker, saying the node was lost."""
    from notebook_accel.launch.pools.pool import WorkerPool

    _hubs_in_this_process(monkeypatch, 2)
    made = []
    original = cluster.NodeLinks.__init__

    def kept(self, links, ranks):
        original(self, links, ranks)
        made.append(links)

    monkeypatch.setattr(cluster.NodeLinks, "__init__", kept)
    with WorkerPool(num_processes=2, num_nodes=2, cluster="in-process", output="none",
                    return_all=True) as pool:
        pids = [info.pid for info in pool.status()]
        made[0][1].shutdown(2)  # SHUT_RDWR: node 1's link ends
        wait_until_seen_dead(pool, 2)
        wait_until_seen_dead(pool, 3)
        assert not pool.heals
        capfd.readouterr()
        pool.run(CELLS["remember"])
        assert [look[3] for look in pool.run(CELLS["look"])] == [4.0] * 4
        said = capfd.readouterr().err
        assert ("the pool's workers were replaced (rank 2 ended without an exit status: its node "
                "or its Ray worker was lost (its node's link ended), rank 3 ") in said, said
        assert not {info.pid for info in pool.status()} & set(pids)
