"""Simulated cluster nodes for ``kernel_hub_scale.py --mode cluster``: the real hub code without Ray.

Host processes (one per node, or a few each playing several nodes) run, for each node, one link to the kernel's
``ChannelServer`` (its hello, as ``NodeHub.start`` sends it), its ranks forked as child processes
on private pipes (stdout, stderr, control, events; each rank leads its own session, as a real
worker does), and the real ``HubPump`` on its own thread. A rank speaks the real wire without
torch: ``epoch K done`` and a 580-byte line of its own once a second, a progress event twice a
second, then its result or failure; SIGUSR1 writes a stack to its stderr (faulthandler's
format). In the ``pool`` scenario each rank is a warm pool's worker instead: it serves the runs
that its hub hands it from the node's one ``RUN`` frame, as ``serve.py`` does. The kernel's side is the real one: ``NodeLinks`` over the accepted links, the cluster
backend's ``HubHandle`` per rank, then the shared supervisor.

The last node runs alone in its own host, so that the lost-node run can freeze it (SIGSTOP on
its host and its ranks: no FIN, no word on its link).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

STACK = ("Thread 0x00007f0000000001 (most recent call first):\n"
         '  File "/tmp/train.py", line 12 in wait_forever\n'
         '  File "/tmp/train.py", line 20 in job\n')
PER_NODE = 8


def _rank(rank: int, fds: dict[str, int], scenario: str, world: int, go: int) -> None:
    """One rank's life (in its own process): from the start time its host hands out on ``go``;
    never returns."""
    import pickle

    from notebook_accel.wire import FailureRecord, Progress, Result, encode, send

    (start,) = struct.unpack("d", os.read(go, 8))
    os.setsid()
    signal.signal(signal.SIGUSR1, lambda *_: os.write(fds["stderr"], STACK.encode()))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    step, half = 0, 0
    while True:
        now = time.time()
        if now >= start + step and (scenario in ("success", "failure", "lost") or step <= 1):
            os.write(fds["stdout"], f"epoch {step} done\nrank {rank} metrics {'x' * 560}\n".encode())
            step += 1
            if scenario == "success" and step > 4:
                send(fds["control"], Result(pickle.dumps(rank) if rank == 0 else None))
                os._exit(0)
            if scenario == "failure" and step == 3:
                primary = rank == world // 2
                if not primary:
                    time.sleep(0.05)  # the peers' collectives break a moment later
                headline = ("RuntimeError: boom" if primary
                            else f"DistBackendError: connection reset by rank {world // 2}")
                send(fds["control"], FailureRecord(
                    rank=rank, pid=os.getpid(), exitcode=1, exc_type=headline.split(":")[0],
                    headline=headline, secondary=not primary, timestamp=time.time(),
                    traceback=("Traceback (most recent call last):\n  File \"/tmp/train.py\", "
                               f"line 20, in job\n    step()\n{headline}\n")))
                os._exit(1)
        if step and (scenario != "hang" or step <= 1) and now >= start + half / 2:
            half = int((now - start) * 2) + 1
            try:
                os.write(fds["events"], encode(Progress({"id": 1, "n": step, "total": 5,
                                                         "desc": "train"})))
            except BlockingIOError:
                pass
        talking = scenario != "hang" or step <= 1
        due = min(start + step, start + half / 2) if talking else time.time() + 0.5
        time.sleep(max(0.0, due - time.time()) + 0.001)


def _serve(rank: int, fds: dict[str, int], commands: int, go: int) -> None:
    """A warm pool's rank (``pool``): each ``Run`` on its commands pipe is a cell that prints a
    line and answers as ``serve.py`` does (its result, a value if asked, then ``RunDone``); leaves when
    the pipe closes. Never returns."""
    import pickle

    from notebook_accel.wire import Result, Run, RunDone, receive, send

    os.read(go, 8)
    os.setsid()
    cells = 0
    while (message := receive(commands)) is not None:
        if type(message) is Run:
            cells += 1
            os.write(fds["stdout"], f"cell {cells} done ({len(message.payload)} bytes)\n".encode())
            send(fds["control"], Result(pickle.dumps(rank) if message.send_result else None))
            send(fds["control"], RunDone(collectives=None, broke_group=False))
    os._exit(0)


def host_main(address: tuple[str, int], token: bytes, nodes: list[int], scenario: str,
              world: int) -> None:
    """One host: fork its nodes' ranks, say so, and at the kernel's word (the start time, on
    stdin) link each node and pump it on its own thread."""
    from notebook_accel.launch.worker.hub.hub_link import OUTPUTS, hello
    from notebook_accel.launch.worker.hub.hub_pump import HubPump
    from notebook_accel.launch.worker.hub.rank_fork import ForkedRank

    go_r, go_w = os.pipe()
    forked: dict[int, list] = {}
    for node in nodes:
        forked[node] = []
        for rank in range(node * PER_NODE, (node + 1) * PER_NODE):
            pipes = [os.pipe() for _ in OUTPUTS]
            commands = os.pipe() if scenario == "pool" else None
            pid = os.fork()
            if pid == 0:
                try:
                    mine = {w for _, w in pipes} | {go_r} | ({commands[0]} if commands else set())
                    for name in os.listdir("/proc/self/fd"):
                        if int(name) > 2 and int(name) not in mine:
                            try:
                                os.close(int(name))
                            except OSError:
                                pass
                    fds = dict(zip(("stdout", "stderr", "control", "events"),
                                   (w for _, w in pipes), strict=True))
                    if commands:
                        _serve(rank, fds, commands[0], go_r)
                    _rank(rank, fds, scenario, world, go_r)
                finally:
                    os._exit(1)
            for read_end, write_end in pipes:
                os.close(write_end)
                os.set_blocking(read_end, False)
            if commands:
                os.close(commands[0])
            forked[node].append(ForkedRank(rank, pid, dict(zip(OUTPUTS, (r for r, _ in pipes),
                                                               strict=True)),
                                           commands[1] if commands else None))
    os.close(go_r)
    print("forked", flush=True)
    start = float(sys.stdin.readline())
    os.write(go_w, struct.pack("d", start) * len(nodes) * PER_NODE)
    links = {}
    for node in nodes:
        link = socket.create_connection(address, timeout=30)
        link.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.sendall(hello(token, node))
        links[node] = link
    pumps = []
    for node in nodes:
        alive_r, alive_w = os.pipe()
        os.close(alive_r)
        pump = HubPump(links[node], forked[node], alive_w)
        pumps.append(threading.Thread(target=pump.run, daemon=True))
        pumps[-1].start()
    for thread in pumps:
        thread.join()


def start_hosts(address: tuple[str, int], token: bytes, world: int, scenario: str,
                hosts: int) -> list[subprocess.Popen]:
    """Host processes for ``world`` ranks on nodes of ``PER_NODE`` (the last node alone), once
    each has forked its ranks."""
    nodes = world // PER_NODE
    groups = [list(range(i, nodes - 1, hosts)) for i in range(hosts)] + [[nodes - 1]]
    procs = [subprocess.Popen([sys.executable, __file__, f"{address[0]}:{address[1]}",
                               token.hex(), ",".join(map(str, group)), scenario, str(world)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for group in groups if group]
    for proc in procs:
        assert proc.stdout.readline().strip() == "forked"
    return procs


def freeze(host: subprocess.Popen) -> None:
    """Stop a host and its ranks (SIGSTOP): no FIN, no word on its links."""
    import psutil

    proc = psutil.Process(host.pid)
    for each in [proc, *proc.children(recursive=True)]:
        try:
            each.send_signal(signal.SIGSTOP)
        except psutil.Error:
            pass


def end_hosts(hosts: list[subprocess.Popen]) -> None:
    """Stop what is left of the hosts and their ranks."""
    import psutil

    for host in hosts:
        try:
            family = [psutil.Process(host.pid), *psutil.Process(host.pid).children(recursive=True)]
        except psutil.Error:
            family = []
        for each in family:
            try:
                each.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        host.wait()


def link_up(world: int, scenario: str, hosts: int):
    """The kernel's side: the hosts fork their ranks; at the word, accept every node's link
    (timed), then the real ``NodeLinks`` and a ``HubHandle`` per rank. Returns (handles, links,
    host processes, seconds to connect every node, the ranks' start time)."""
    from notebook_accel.launch.backends.cluster import HubHandle
    from notebook_accel.launch.cluster.channel_server import ChannelServer
    from notebook_accel.launch.cluster.node_links import NodeLinks

    nodes = world // PER_NODE
    server = ChannelServer("127.0.0.1", nodes)
    procs = start_hosts(server.address, server.token, world, scenario, hosts)
    began = time.perf_counter()
    start = time.time() + 1.0 + world / 512  # the ranks' first line
    for proc in procs:
        proc.stdin.write(f"{start!r}\n")
        proc.stdin.flush()
    accepted = server.accept(time.monotonic() + 120, lambda: None)
    took = time.perf_counter() - began
    server.close()
    ranks = {node: list(range(node * PER_NODE, (node + 1) * PER_NODE)) for node in range(nodes)}
    links = NodeLinks({node: got["link"] for node, got in accepted.items()}, ranks)
    handles = [HubHandle(rank, rank // PER_NODE, "127.0.0.1", links, 0, persistent=scenario == "pool")
               for rank in range(world)]
    return handles, links, procs, took, start


if __name__ == "__main__":
    host, port = sys.argv[1].rsplit(":", 1)
    host_main((host, int(port)), bytes.fromhex(sys.argv[2]), [int(n) for n in sys.argv[3].split(",")],
              sys.argv[4], int(sys.argv[5]))
