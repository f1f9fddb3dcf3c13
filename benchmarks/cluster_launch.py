"""Multi-node from one kernel: cold and warm launch, a warm pool cell, crash-to-error time on a
2-node Ray cluster, beside Ray Train's ``TorchTrainer`` on the same cluster in the same run.

The cluster is ``start_local_cluster``'s: head on 127.0.0.1, node B on 127.0.0.2, as many CPUs
as ranks per node; 2 nodes x ``--per-node`` ranks (default 1). ``--client`` connects through the
head's Ray Client server instead (``cluster="ray://..."``: the workers' channels go through the
relay on the head node). While the pool is up it also counts the kernel's sockets and threads
and the cluster's memory (PSS of every process of both nodes, over the idle cluster's).

    python benchmarks/cluster_launch.py [--warm 10] [--cells 200] [--per-node 1] [--no-ray-train]
                                        [--client]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from notebook_accel import WorkerError, WorkerPool, notebook_launcher
from notebook_accel.launch import start_local_cluster
from notebook_accel.launch.cluster import placement


def rank() -> int:
    import os

    return int(os.environ["RANK"])


def one_allreduce() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    dist.destroy_process_group()
    return tensor.item()


def noop() -> None:
    return None


def crash_on_rank_1() -> None:
    import os
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo")
    if os.environ["RANK"] == str(int(os.environ["WORLD_SIZE"]) - 1):  # the last, on node B
        raise RuntimeError("crash")
    time.sleep(60)


def _timed(function, **options) -> float:
    started = time.perf_counter()
    notebook_launcher(function, output="none", **options)
    return time.perf_counter() - started


def ours(cluster, warm: int, cells: int, per_node: int = 1) -> dict[str, float]:
    import psutil

    address = cluster.address
    options = {"num_processes": per_node, "num_nodes": 2, "cluster": address}
    idle = cluster.memory()
    figures = {"cold launch (agents placed), trivial job": _timed(rank, **options)}
    figures["warm launch, trivial job (median)"] = statistics.median(
        _timed(rank, **options) for _ in range(warm))
    figures["warm launch, init + 1 all_reduce (median)"] = statistics.median(
        _timed(one_allreduce, **options) for _ in range(warm))
    crash = []
    for _ in range(3):
        try:
            notebook_launcher(crash_on_rank_1, output="none", **options)
        except WorkerError as error:
            crash.append(time.time() - error.failure.timestamp)
    figures["crash on node B -> WorkerError (median)"] = statistics.median(crash)
    placement.disconnect()  # the pool places its own agents (and Ray Train needs the CPUs)
    placement.connect(address)
    started = time.perf_counter()
    with WorkerPool(output="none", **options) as pool:
        figures["pool start (agents placed)"] = time.perf_counter() - started
        me = psutil.Process()
        figures["pool up: kernel sockets (count)"] = len(me.net_connections(kind="all"))
        figures["pool up: kernel threads (count)"] = me.num_threads()
        figures["pool up: the cluster's memory over idle (GiB)"] = (cluster.memory() - idle) / 2**30
        times = []
        for _ in range(cells):
            started = time.perf_counter()
            pool.run(noop)
            times.append(time.perf_counter() - started)
        figures["pool cell, no-op (median)"] = statistics.median(times)
    placement.disconnect()
    return figures


def ray_train(address: str) -> dict[str, float]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def train_loop() -> None:
        import torch
        import torch.distributed as dist

        tensor = torch.ones(1)
        dist.all_reduce(tensor)

    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        with tempfile.TemporaryDirectory() as storage:
            trainer = TorchTrainer(
                train_loop, scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                                         resources_per_worker={"CPU": 1}),
                run_config=RunConfig(storage_path=storage))
            started = time.perf_counter()
            trainer.fit()
            return {"Ray Train TorchTrainer.fit, 1 all_reduce": time.perf_counter() - started}
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--no-ray-train", action="store_true")
    parser.add_argument("--client", action="store_true", help="connect with a ray:// address")
    parser.add_argument("--per-node", type=int, default=1, help="ranks per node")
    args = parser.parse_args()
    with start_local_cluster(nodes=2, cpus_per_node=args.per_node, client=args.client) as cluster:
        print(f"cluster={cluster.address!r}, 2 nodes x {args.per_node} ranks")
        figures = ours(cluster, args.warm, args.cells, args.per_node)
        if not args.no_ray_train:
            figures.update(ray_train(cluster.address))
    for name, seconds in figures.items():
        if "(" in name and name.endswith(("(count)", "(GiB)")):
            print(f"{name:48s} {seconds:8.2f}")
            continue
        shown = f"{seconds * 1e3:8.1f} ms" if seconds < 1 else f"{seconds:8.2f} s "
        print(f"{name:48s} {shown}")


if __name__ == "__main__":
    main()
