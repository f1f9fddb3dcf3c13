"""The same training function without Ray: two torchrun "nodes" (c10d) and submitit's local executor.

``runtime_scripts/multi_node.py`` holds the function; both paths must give world size 2, both
ranks, and the same weights, all-reduced sum and gathered values on every rank.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from notebook_accel.launch.handoff.ports import free_port
from tests.runtime_support import run_torchrun

pytestmark = pytest.mark.slow  # two torch start-ups per test
SCRIPT = Path(__file__).parents[1] / "runtime_scripts" / "multi_node.py"


def _check_agree(results: list[dict]) -> None:
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert r["world"] == 2
        assert r["rank_sum"] == 1.0
        assert r["gathered"] == [0.0, 1.0]
        assert r["weights"] == results[0]["weights"]  # DDP kept the replicas equal


def test_two_torchrun_nodes_with_c10d_rendezvous():
    endpoint = f"127.0.0.1:{free_port()}"

    def node(rank: int) -> tuple[int | None, str]:
        return run_torchrun(
            ["--nnodes", "2", "--node-rank", str(rank), "--rdzv-backend", "c10d",
             "--rdzv-endpoint", endpoint, "--rdzv-id", "item8", "--rdzv-conf", "join_timeout=60",
             str(SCRIPT)],
            nproc=1, timeout=90, extra_env={"GLOO_SOCKET_IFNAME": "lo"})

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(node, (0, 1)))
    for code, output in runs:
        assert code == 0, output[-4000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for _, output in runs
               for line in output.splitlines() if "RESULT " in line]
    _check_agree(results)


def test_submitit_local_executor_two_tasks(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit", reason="submitit is not installed (the `slurm` extra)")
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import multi_node

    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # TorchDistributedEnvironment reads it
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", str(SCRIPT.parent))  # the tasks unpickle multi_node.train
    executor = submitit.LocalExecutor(folder=tmp_path / "jobs")
    executor.update_parameters(tasks_per_node=2, timeout_min=2)
    job = executor.submit(multi_node.train_in_submitit)
    try:
        results = job.results()
    finally:
        job.cancel(check=False)
    _check_agree(results)
