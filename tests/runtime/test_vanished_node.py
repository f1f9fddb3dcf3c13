"""A vanished host: a node whose traffic is dropped while its processes stay alive.

Two network namespaces made here, joined by a veth pair: the kernel's (this test's main thread
enters it with ``setns``; node 0's hub runs in this process, as in ``test_node_hub.py``) and
node 1's, where node 1's real hub runs in a process of its own (``NodeHub`` without Ray, its
calls made over a pipe). A second into the job, the kernel's end of the veth goes down: no FIN,
no RST, every frame dropped both ways, every process alive. The job fails within 6 s naming
node 1 and its ranks, node 0's ranks are stopped, and node 1's hub, still running, kills its
own ranks when the kernel's beats stop coming.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import threading
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
from notebook_accel.launch.worker.hub.hub_link import SILENCE
from notebook_accel.launch.worker.hub.node_hub import NodeHub
from tests.runtime.test_node_hub import _Actor, _Ray, _Ref

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and veth pairs need root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip"),
    pytest.mark.skipif(not os.path.exists("/proc/thread-self/ns/net"), reason="needs Linux netns"),
]

KERNEL, HUB = "10.231.7.1", "10.231.7.2"
_CLONE_NEWNET = 0x40000000

# node 1's hub: NodeHub's calls arrive pickled on stdin and are answered on stdout
_HUB_PROCESS = """
import os, pickle, struct, sys
from notebook_accel.launch.worker.hub.node_hub import NodeHub
hub = NodeHub.__new__(NodeHub)  # no torch import: these ranks need none
while header := sys.stdin.buffer.read(4):
    method, args = pickle.loads(sys.stdin.buffer.read(struct.unpack("!I", header)[0]))
    answer = pickle.dumps(getattr(hub, method)(*args))
    sys.stdout.buffer.write(struct.pack("!I", len(answer)) + answer)
    sys.stdout.buffer.flush()
"""


class _ProcessActor:
    """A hub in a process of its own (in its node's namespace), called as a Ray actor."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def __getattr__(self, name):
        actor = self

        class _Method:
            @staticmethod
            def remote(*args):
                return _Ref(actor.call(name, args))

        return _Method

    def call(self, name: str, args: tuple):
        request = pickle.dumps((name, args))
        self.proc.stdin.write(struct.pack("!I", len(request)) + request)
        self.proc.stdin.flush()
        (size,) = struct.unpack("!I", self.proc.stdout.read(4))
        return pickle.loads(self.proc.stdout.read(size))


class _KernelRay(_Ray):
    class util:  # noqa: N801 - ray.util
        @staticmethod
        def get_node_ip_address():
            return KERNEL  # the kernel's side of the veth: both hubs link back to it


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def _namespaces():
    """The kernel's namespace and node 1's, joined by a veth pair; removed on the way out."""
    tag = f"{os.getpid() % 100000}"
    kernel, hub = f"na-kernel-{tag}", f"na-node1-{tag}"
    _ip("netns", "add", kernel)
    try:
        _ip("netns", "add", hub)
        try:
            _ip("-n", kernel, "link", "add", "vk", "type", "veth", "peer", "name", "vh", "netns", hub)
            _ip("-n", kernel, "addr", "add", f"{KERNEL}/24", "dev", "vk")
            _ip("-n", hub, "addr", "add", f"{HUB}/24", "dev", "vh")
            for ns, dev in ((kernel, "lo"), (kernel, "vk"), (hub, "lo"), (hub, "vh")):
                _ip("-n", ns, "link", "set", dev, "up")
            yield kernel, hub
        finally:
            _ip("netns", "del", hub)
    finally:
        _ip("netns", "del", kernel)


@contextlib.contextmanager
def _inside(namespace: str):
    """This thread (and the threads and processes it starts) in ``namespace`` meanwhile."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    there = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(there, _CLONE_NEWNET) != 0:
            pytest.skip(f"setns: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            assert libc.setns(home, _CLONE_NEWNET) == 0
    finally:
        os.close(home)
        os.close(there)


class _SplitBackend(Backend):
    """The cluster backend's start; node 0's hub in this process, node 1's in ``remote``."""

    def __init__(self, remote: _ProcessActor) -> None:
        local = _Actor(NodeHub.__new__(NodeHub))
        self.placed = placement.Placement(None, [local, remote], [KERNEL, HUB],
                                          [os.getpid(), remote.proc.pid], [[], []])
        self.groups: list[cluster.ClusterGroup] = []

    def start(self, plan, payload):
        links, handles = cluster._start(_KernelRay, plan, payload, self.placed)
        self.groups.append(cluster.ClusterGroup(plan, handles, links))
        return self.groups[-1]


def _sleep():
    import time

    print(f"pid={os.getpid()}", flush=True)
    time.sleep(60)


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def test_a_node_whose_traffic_is_dropped_fails_the_job_within_6s_and_ends_its_ranks(
        capsys, monkeypatch):
    dropped: list[float] = []

    with _namespaces() as (kernel, node1):
        hub = subprocess.Popen(["ip", "netns", "exec", node1, sys.executable, "-c", _HUB_PROCESS],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        try:
            original = cluster.NodeLinks.__init__

            def drop_later(self, links, ranks):
                original(self, links, ranks)

                def drop():
                    _ip("-n", kernel, "link", "set", "vk", "down")  # no FIN, no RST: silence
                    dropped.append(time.monotonic())

                threading.Timer(1.0, drop).start()

            monkeypatch.setattr(cluster.NodeLinks, "__init__", drop_later)
            request = LaunchRequest.from_keywords("notebook_launcher", {
                "num_processes": 2, "num_nodes": 2, "cluster": "in-process", "timeout": 30})
            backend = _SplitBackend(_ProcessActor(hub))
            with _inside(kernel), pytest.raises(WorkerError) as caught:
                launch_once(backend, plan_launch(request, []), serialise_payload(_sleep, (), {}))
            failed = time.monotonic()

            assert dropped, "the job ended before node 1's traffic was dropped"
            took = failed - dropped[0]
            text = str(caught.value)
            assert re.match(r"rank [23] on node 1 \(10\.231\.7\.2\) ended without an exit status: "
                            r"its node or its Ray worker was lost \(its node went silent", text), text
            assert re.search(r"^  rank [23]: ended without an exit status: .* went silent", text,
                             re.MULTILINE), text  # the node's other rank, named too
            assert took < 6.0, f"lost node -> WorkerError took {took:.2f} s"
            sys.__stdout__.write(f"\nlost node -> WorkerError {took:.2f} s\n{text}\n")

            (group,) = backend.groups
            node0 = [h.pid for h in group.handles if h.node == 0]
            node1_ranks = [h.pid for h in group.handles if h.node == 1]
            printed = {int(p) for p in re.findall(r"pid=(\d+)", capsys.readouterr().out)}
            assert set(node0) <= printed, "node 0's ranks never ran"
            assert set(node1_ranks) <= printed, "node 1's ranks never ran before the drop"
            time.sleep(0.3)
            assert not [pid for pid in node0 if _alive(pid)], "node 0's ranks outlived the job"

            # node 1's hub is alive and, hearing no beat for SILENCE s, kills its own ranks
            deadline = dropped[0] + SILENCE + 3.0
            while [pid for pid in node1_ranks if _alive(pid)] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not [pid for pid in node1_ranks if _alive(pid)], \
                "node 1's hub left its ranks running with its link silent"
            sys.__stdout__.write(f"node 1's ranks ended {time.monotonic() - dropped[0]:.2f} s "
                                 "after the drop, by their hub\n")
            assert hub.poll() is None, "node 1's hub process died instead of outliving the drop"
        finally:
            hub.kill()
            hub.wait(10)
