"""The cluster option without a cluster: where it comes from, what a cluster plan is, what is refused."""

from __future__ import annotations

import sys

import pytest

from notebook_accel.launch.launcher import plan_launch
from notebook_accel.launch.planning.request import LaunchRequest
from notebook_accel.launch.worker.hub.hub_link import HELLO, hello


def _plan(**explicit):
    return plan_launch(LaunchRequest.from_keywords("notebook_launcher", explicit), [])


def test_a_cluster_plan_is_not_bound_by_this_machine():
    plan = _plan(cluster="head:6379", num_nodes=4, num_processes=8, device="cuda")
    assert (plan.cluster, plan.world_size, plan.device_type) == ("head:6379", 32, "cuda")
    assert plan.global_rank(3) == 3 and not plan.hosts_rendezvous  # rank 0's node hosts it
    assert _plan(cluster="auto", num_nodes=2).num_processes == 1  # default: one rank per node
    assert _plan(cluster="auto").device_type == "cpu"


def test_the_cluster_comes_from_the_environment_and_the_config_file(monkeypatch, tmp_path):
    monkeypatch.setenv("NOTEBOOK_ACCEL_CLUSTER", "env-head:6379")
    assert _plan(num_nodes=2).cluster == "env-head:6379"
    assert _plan(num_nodes=2, cluster="arg:1").cluster == "arg:1"
    monkeypatch.delenv("NOTEBOOK_ACCEL_CLUSTER")
    config = tmp_path / "c.yaml"
    config.write_text("cluster: file-head:6379\nnum_machines: 2\n")
    monkeypatch.setenv("NOTEBOOK_ACCEL_CONFIG_FILE", str(config))
    plan = _plan()
    assert (plan.cluster, plan.num_nodes) == ("file-head:6379", 2)
    config.write_text("cluster: 5\n")
    with pytest.raises(ValueError, match=r"cluster=5 must be a Ray cluster address"):
        _plan()


@pytest.mark.parametrize(("explicit", "error", "match"), [
    ({"node_rank": 1, "num_nodes": 2}, ValueError, "one kernel drives every node"),
    ({"device": "xla"}, ValueError, "runs on 'cpu' or 'cuda'"),
    ({"cluster": ""}, ValueError, "cluster='' must be a Ray cluster address such as 'head:6379'"),
    ({"cluster": 6379}, ValueError, "cluster=6379 must be a Ray cluster address"),
])
def test_bad_cluster_options_are_refused_naming_the_value(explicit, error, match):
    with pytest.raises(error, match=match):
        _plan(**{"cluster": "head:6379", **explicit})


def test_without_ray_a_cluster_names_the_extra(monkeypatch):
    from notebook_accel.launch.cluster import placement

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'notebook_accel\[ray\]'"):
        placement.connect("head:6379")


def test_a_hubs_hello_carries_the_token_node_and_channel():
    token = bytes(range(32))
    assert HELLO.unpack(hello(token, 5, 3)) == (token, 5, 3)


def test_the_kernel_closes_a_connection_without_the_launchs_token_unread():
    import socket
    import time

    from notebook_accel.launch.cluster.channel_server import ChannelServer

    RUN_CHANNELS = ("alive", "stdout", "stderr")
    server = ChannelServer("127.0.0.1", world_size=1, channels=RUN_CHANNELS)
    intruder = socket.create_connection(server.address)
    intruder.sendall(hello(b"x" * 32, 0, 2))
    good = []
    for index in range(len(RUN_CHANNELS)):
        conn = socket.create_connection(server.address)
        conn.sendall(hello(server.token, 0, index))
        good.append(conn)
    channels: dict = {0: {}}
    try:
        channels = server.accept(time.monotonic() + 10, lambda: None)
        assert sorted(channels[0]) == sorted(RUN_CHANNELS)
        intruder.settimeout(5)
        assert intruder.recv(1) == b""  # closed by the kernel
    finally:
        server.close()
        for conn in [intruder, *good, *(c for c in channels[0].values())]:
            conn.close()


class _FlakyRay:
    """A ``ray`` whose Ray Client connections fail with the given errors before one succeeds."""

    def __init__(self, failures):
        self.failures, self.calls, self.connected = list(failures), 0, False

    def is_initialized(self):
        return self.connected

    def init(self, **_):
        self.calls += 1
        if self.failures:
            raise ConnectionError(self.failures.pop(0))
        self.connected = True


@pytest.mark.parametrize("death", [
    "Starting Ray client server failed. See ray_client_server_23000.err for detailed logs.",
    "Initialization failure from server:\n... psutil.ZombieProcess: PID still exists but it's a "
    "zombie (pid=5498)",
])
def test_a_ray_client_server_that_dies_as_it_starts_is_asked_for_again(monkeypatch, death):
    from notebook_accel.launch.cluster import placement

    flaky = _FlakyRay([death])
    monkeypatch.setitem(sys.modules, "ray", flaky)
    monkeypatch.setattr(placement, "_connected", [])
    assert placement.connect("ray://127.0.0.1:10001") is flaky
    assert flaky.calls == 2


def test_a_ray_client_address_that_refuses_is_not_retried(monkeypatch):
    from notebook_accel.launch.cluster import placement

    flaky = _FlakyRay(["Failed to connect to 127.0.0.1:10001"])
    monkeypatch.setitem(sys.modules, "ray", flaky)
    monkeypatch.setattr(placement, "_connected", [])
    with pytest.raises(ConnectionError, match=r"no Ray cluster answers there \(Failed to connect"):
        placement.connect("ray://127.0.0.1:10001")
    assert flaky.calls == 1


def test_node_link_frames_reassemble_in_order_whatever_the_reads_cut():
    from notebook_accel.launch.worker.hub.hub_link import Frame, FrameParser, frame

    sent = [(Frame.STDOUT, 3, b"hello\n"), (Frame.CONTROL, 3, b"x" * 70000),
            (Frame.END, 3, b"\0\0\0\0"), (Frame.BEAT, 0, b"")]
    stream = b"".join(frame(*f) for f in sent)
    for cut in (1, 7, 9, 4096):
        parser, got = FrameParser(), []
        for start in range(0, len(stream), cut):
            got += parser.feed(stream[start:start + cut])
        assert got == sent


def test_a_silent_link_ends_its_ranks_without_an_exit_status_and_beats_go_out():
    """A hub that stops speaking (no FIN) is lost after SILENCE seconds; the kernel beats."""
    import socket
    import time

    from notebook_accel.launch.cluster import node_links
    from notebook_accel.launch.worker.hub.hub_link import SILENCE, Frame, FrameParser, frame

    kernel_end, hub_end = socket.socketpair()
    links = node_links.NodeLinks({0: kernel_end}, {0: [0, 1]})
    try:
        hub_end.sendall(frame(Frame.STDOUT, 1, b"last words\n") + frame(Frame.END, 0, b"\0\0\0\0"))
        assert links.ends[0].ended.wait(2) and links.ends[0].exitcode == 0
        started = time.monotonic()
        assert links.ends[1].ended.wait(SILENCE + 2)
        took = time.monotonic() - started
        assert SILENCE - 0.5 < took < SILENCE + 1.5, took
        assert links.ends[1].exitcode is None and "went silent" in links.ends[1].lost
        assert links.take_bytes(1, Frame.STDOUT) == b"last words\n"
        assert links.take_bytes(1, Frame.STDOUT) == b""  # its end
        # a run on rank 0 alone leaves rank 1's news for the next run's take
        assert all(rank == 0 for rank, _ in links.take({0}))
        assert (1, "exit") in links.take({0, 1}) and not links.take({0, 1})
        hub_end.settimeout(1)
        beats = FrameParser().feed(hub_end.recv(4096))
        assert beats and all(kind is Frame.BEAT for kind, _, _ in beats)
    finally:
        links.close()
        hub_end.close()


def test_a_rank_sigkilled_as_its_node_is_lost_died_with_it():
    """A node's loss kills its ranks, and its hub may report a rank's SIGKILL just before its
    link ends: that rank is lost with its node (its exit status kept), where a rank that failed
    otherwise, or a SIGKILL before the launch closed the links, is not."""
    import signal
    import socket

    from notebook_accel.launch.backends.cluster import HubHandle
    from notebook_accel.launch.cluster import node_links
    from notebook_accel.launch.worker.hub.hub_link import EXIT, Frame, frame

    def ended(exits: dict[int, int], then_lost: bool) -> dict[int, node_links.RankChannels]:
        kernel_end, hub_end = socket.socketpair()
        links = node_links.NodeLinks({0: kernel_end}, {0: [0, 1, 2]})
        try:
            hub_end.sendall(b"".join(frame(Frame.END, rank, EXIT.pack(code)) for rank, code in exits.items()))
            assert all(links.ends[rank].ended.wait(2) for rank in exits)
            if then_lost:
                hub_end.close()
                assert links.ends[2].ended.wait(2)
        finally:
            links.close()
            hub_end.close()
        return links.ends

    ends = ended({0: -signal.SIGKILL, 1: 1}, then_lost=True)
    why = ends[2].lost  # (the link's end read, or a beat that found it broken first)
    assert why in ("its node's link ended", "its link to the kernel broke"), why
    assert (ends[0].exitcode, ends[0].lost) == (-signal.SIGKILL, why)
    assert (ends[1].exitcode, ends[1].lost) == (1, None)
    assert ends[2].exitcode is None
    handle = object.__new__(HubHandle)
    handle._ends = ends[0]
    assert handle.describe_end() == f"was killed by SIGKILL: its node or its Ray worker was lost ({why})"
    handle._ends = ends[2]
    assert handle.describe_end().startswith("ended without an exit status: its node")
    handle._ends = ends[1]
    assert handle.describe_end() is None
    ends = ended({0: -signal.SIGKILL}, then_lost=False)  # then the launch closed its links
    assert ends[0].lost is None and ends[2].lost == "the launch ended"


def test_a_stop_goes_once_per_node_listing_its_ranks():
    """signal_all: one SIGNAL frame per node (every rank of it: none listed), read back by the
    hub as the live ranks it is for; the terminate carries the hub's 2 s grace."""
    import signal
    import socket
    import struct

    from notebook_accel.launch.backends.signal_all import signal_all
    from notebook_accel.launch.cluster import node_links
    from notebook_accel.launch.worker.hub import hub_pump
    from notebook_accel.launch.worker.hub.hub_link import EVERY_RANK, SIGNAL, Frame, FrameParser

    pairs = {node: socket.socketpair() for node in (0, 1)}
    links = node_links.NodeLinks({n: k for n, (k, _) in pairs.items()}, {0: [0, 1, 2], 1: [3, 4, 5]})

    class Handle:
        def __init__(self, rank):
            self.rank, self.together = rank, links

    try:
        signal_all([Handle(r) for r in (0, 1, 2, 4)], "terminate")
        frames = {}
        for node, (_, hub) in pairs.items():
            hub.settimeout(2)
            got = [f for f in FrameParser().feed(hub.recv(4096)) if f[0] is Frame.SIGNAL]
            assert len(got) == 1
            frames[node] = got[0]
        (_, rank0, body0), (_, rank1, body1) = frames[0], frames[1]
        assert rank0 == rank1 == EVERY_RANK
        assert SIGNAL.unpack_from(body0) == (signal.SIGTERM, 1, 2.0)
        assert body0[SIGNAL.size:] == b"" and body1[SIGNAL.size:] == struct.pack("!I", 4)
        assert hub_pump._targets(EVERY_RANK, body0, {0, 2}) == {0, 2}
        assert hub_pump._targets(EVERY_RANK, body1, {3, 4, 5}) == {4}
        assert hub_pump._targets(5, body1, {3, 4, 5}) == {5}
    finally:
        links.close()
        for _, hub in pairs.values():
            hub.close()


def test_a_ranks_memory_goes_to_the_kernel_only_when_it_moved():
    """A hub looks at its ranks' memory once a second and sends a figure only when it moved by
    more than 1%: a steady job's figures cost the link and the kernel nothing. The kernel takes
    a figure in as news of its rank (the supervisor shows it at once, samples nothing)."""
    import os
    import socket
    import time

    from notebook_accel.launch.cluster import node_links
    from notebook_accel.launch.worker.hub import hub_pump
    from notebook_accel.launch.worker.hub.hub_link import Frame, FrameParser

    class Process:
        rss = 100 << 20

        def memory_info(self):
            return self

    hub_end, kernel_end = socket.socketpair()
    alive_r, alive_w = os.pipe()
    pump = hub_pump.HubPump(hub_end, [], alive_w)
    pump.live, pump.processes[7] = {7}, Process()
    links = node_links.NodeLinks({0: kernel_end}, {0: [7]})
    try:
        sent = []
        for rss in (100 << 20, (100 << 20) + (512 << 10), 102 << 20):  # +0.5%: not news
            Process.rss = rss
            pump._measure()
            sent += [(kind, rank, body) for kind, rank, body in FrameParser().feed(bytes(pump.outbox))]
            hub_end.sendall(pump.outbox)
            pump.outbox.clear()
        assert [(kind, rank) for kind, rank, _ in sent] == [(Frame.MEMORY, 7)] * 2
        deadline = time.monotonic() + 2
        while links.ends[7].rss != 102 << 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert links.ends[7].rss == 102 << 20
        assert links.take({7}) == [(7, "memory")]  # the two figures: one piece of news
    finally:
        links.close()
        hub_end.close()
        for fd in (alive_r, alive_w):
            os.close(fd)


def test_the_kernel_takes_a_nodes_news_a_few_at_a_time_the_oldest_first():
    """A wakeup asks the links for a few pieces of news (a thousand ranks may all have some):
    the oldest come first, the rest stay news and the inbox stays readable until the last is
    taken; news of ranks outside the run is kept for a later run."""
    import selectors
    import socket
    import time

    from notebook_accel.launch.cluster import node_links
    from notebook_accel.launch.worker.hub.hub_link import Frame, frame

    kernel_end, hub_end = socket.socketpair()
    links = node_links.NodeLinks({0: kernel_end}, {0: list(range(100))})
    readable = selectors.DefaultSelector()
    readable.register(links.fileno(), selectors.EVENT_READ)
    try:
        hub_end.sendall(b"".join(frame(Frame.STDOUT, rank, b"line\n") for rank in range(100)))
        deadline = time.monotonic() + 2
        while len(links._news) < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        taken = []
        for _ in range(3):
            assert readable.select(0)
            taken += links.take(range(90), most=30)
        assert taken == [(rank, "stdout") for rank in range(90)]
        assert readable.select(0) and not links.take(range(90), most=30)  # 90-99: not this run's
        assert not readable.select(0)
        assert links.take(range(100)) == [(rank, "stdout") for rank in range(90, 100)]
    finally:
        readable.close()
        links.close()
        hub_end.close()


def test_a_pool_runs_payload_goes_to_each_node_as_it_is_whatever_the_socket_takes():
    """A RUN frame is written as its parts (the payload's own bytes, not a copy per node), in
    as many writes as the socket takes; the hub reads back the payload and its rank sets."""
    import socket
    import threading

    from notebook_accel.launch.cluster import node_links
    from notebook_accel.launch.worker.hub.hub_link import Frame, FrameParser, read_run

    kernel_end, hub_end = socket.socketpair()
    kernel_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # many partial writes
    links = node_links.NodeLinks({3: kernel_end}, {3: [24, 25, 26]})
    payload = bytes(range(256)) * 2000
    got, parser = [], FrameParser()

    def hub() -> None:
        hub_end.settimeout(5)
        while not any(kind is Frame.RUN for kind, _, _ in got):
            got.extend(parser.feed(hub_end.recv(1 << 16)))

    reader = threading.Thread(target=hub)
    reader.start()
    try:
        links.run(payload, with_result={0, 25}, chosen={25, 26, 40})
        reader.join(10)
        runs = [(rank, body) for kind, rank, body in got if kind is Frame.RUN]
        assert [rank for rank, _ in runs] == [3]
        assert read_run(runs[0][1]) == (payload, {25}, {25, 26})
    finally:
        links.close()
        hub_end.close()
