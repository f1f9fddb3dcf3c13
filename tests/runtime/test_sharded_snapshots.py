"""Snapshots of sharded state (issue 45): FSDP2 and DeepSpeed ZeRO-2 on 2 processes (gloo, CPU).

A run stopped after its step-10 snapshot and resumed from it ends with an uninterrupted run's
weights, bit for bit; a warm pool's heal that loses FSDP shards names the snapshot that holds
them, and the objects prepared again resume from it; an FSDP2 snapshot resumes on 1 process (resharded by
``torch.distributed.checkpoint``, the loader skipping what both processes had seen); a ZeRO one
refuses to, naming the world sizes.
"""

from __future__ import annotations

import importlib.util

import pytest

from notebook_accel import WorkerError, WorkerPool, notebook_launcher
from notebook_accel.checkpoint import snapshot_dir
from tests.runtime.test_pool import notebook

pytestmark = pytest.mark.slow
TOTAL, EVERY = 20, 5


def train(directory: str, strategy: str, stop: int) -> dict:
    """Train to step ``stop`` (from the newest snapshot in ``directory``), snapshots every EVERY."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import (
        Accelerator,
        DeepSpeedPlugin,
        FullyShardedDataParallelPlugin,
        set_seed,
    )

    set_seed(0)
    plugin = ({"fsdp_plugin": FullyShardedDataParallelPlugin()} if strategy == "fsdp"
              else {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=2)})
    acc = Accelerator(cpu=True, **plugin)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(128, 8, generator=g), torch.randn(128, 1, generator=g)),
                        batch_size=4, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    acc.snapshot_every(steps=EVERY, dir=directory, keep=3)
    step = start = acc.resume()
    seen, weights = [], None
    while step < stop:
        for x, y in loader:
            seen.append(x[0, 0].item())
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            step += 1
            if step == TOTAL:
                weights = {k: v.clone() for k, v in (acc.get_state_dict(model) or {}).items()}
            if step == stop:
                break
    acc.wait_for_snapshots()
    return {"start": start, "seen": seen, "weights": weights}


def _two(directory, strategy, stop):
    return notebook_launcher(train, (str(directory), strategy, stop), num_processes=2, output="none")


STRATEGIES = ["fsdp", pytest.param("zero2", marks=pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"))]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_sharded_snapshot_resumes_bit_for_bit(tmp_path, strategy):
    reference = _two(tmp_path / "ref", strategy, TOTAL + 1)
    first = _two(tmp_path / "run", strategy, TOTAL // 2)
    assert [s.step for s in snapshot_dir.listing(tmp_path / "run") if s.complete] == [5, 10]
    resumed = _two(tmp_path / "run", strategy, TOTAL)
    assert first["start"] == 0 and resumed["start"] == TOTAL // 2
    assert resumed["seen"] == reference["seen"][TOTAL // 2:TOTAL]  # the loader skipped what was seen
    assert reference["weights"].keys() == resumed["weights"].keys()
    assert all(reference["weights"][k].equal(resumed["weights"][k]) for k in reference["weights"])
    if strategy == "fsdp":  # on 1 process: resharded, and the batches both processes had seen skipped
        alone = notebook_launcher(train, (str(tmp_path / "run"), strategy, TOTAL + 2), num_processes=1,
                                  output="none")
        assert alone["start"] == TOTAL
        assert alone["seen"][0] == reference["seen"][TOTAL]  # rank 0's next batch is the 1-process one's
    else:
        with pytest.raises(Exception, match="taken with 2 processes, this run has 1"):
            notebook_launcher(train, (str(tmp_path / "run"), strategy, TOTAL + 2), num_processes=1, output="none")


POOL_CELLS = notebook("""
import os, time

def setup(directory):
    global acc, model, opt, step
    import torch
    from notebook_accel import Accelerator, FullyShardedDataParallelPlugin
    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    acc.snapshot_every(steps=5, dir=directory)
    step = acc.resume()
    return step

def train(until):
    global step
    import torch
    while step < until:
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        acc.backward(model(x).pow(2).mean())
        opt.step()
        step += 1
    acc.wait_for_snapshots()
    return {k: v.clone() for k, v in (acc.get_state_dict(model) or {}).items()}

def die_on(ranks):
    import torch.distributed as dist
    if dist.get_rank() in ranks:
        os._exit(3)
    time.sleep(30)
""")


def test_a_heal_points_to_the_snapshot_that_holds_the_lost_shards_and_resume_goes_on_from_it(tmp_path):
    with WorkerPool(num_processes=2, output="none") as pool:
        assert pool.run(POOL_CELLS["setup"], str(tmp_path / "ref")) == 0
        reference = pool.run(POOL_CELLS["train"], 20)
    with WorkerPool(num_processes=2, output="none") as pool:
        pool.run(POOL_CELLS["setup"], str(tmp_path / "run"))
        pool.run(POOL_CELLS["train"], 12)
        with pytest.raises(WorkerError) as info:
            pool.run(POOL_CELLS["die_on"], (1,))
        said = info.value.recovery
        assert "The pool healed" in said and f"the newest snapshot holds them (step 10, {tmp_path / 'run'})" in said
        assert pool.run(POOL_CELLS["setup"], str(tmp_path / "run")) == 10  # prepared again, resumed
        healed = pool.run(POOL_CELLS["train"], 20)
    assert healed.keys() == reference.keys() and all(healed[k].equal(reference[k]) for k in reference)


PEER_CELLS = notebook("""
def setup(directory):
    global acc, model, opt, loader, step
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from notebook_accel import Accelerator, FullyShardedDataParallelPlugin, set_seed
    set_seed(0)
    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    # (every dimension divisible by 2 and 3: even shards on either world size)
    model = torch.nn.Sequential(torch.nn.Linear(4, 48), torch.nn.ReLU(), torch.nn.Linear(48, 6))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(96, 4, generator=g), torch.randn(96, 6, generator=g)),
                        batch_size=4, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    acc.snapshot_every(steps=5, dir=directory, in_peers=True)
    step = acc.resume()
    return step

def train(until):
    global step
    import torch
    while step < until:
        for x, y in loader:
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            step += 1
            if step == until:
                break
    acc.wait_for_snapshots()
    acc.get_state_dict(model)  # the full weights gathered: every rank issues the same collectives
    return [p.to_local().clone() for p in model.parameters()]  # each rank's own shards

def held():
    from notebook_accel.checkpoint import snapshot_peers
    own = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    return snapshot_peers.held_bytes(), own
""")


@pytest.mark.parametrize("world, killed", [(2, (1,)), (3, (1, 2))], ids=["2-ranks-one-lost", "3-ranks-neighbours-lost"])
def test_a_heal_brings_lost_shards_back_from_the_peers_memory_without_disk(tmp_path, capfd, world, killed):
    """FSDP2, snapshots kept in the peers' memory: ranks SIGKILLed after the step-10 snapshot. One
    rank lost: its part comes back from the next rank's memory (the snapshot folder deleted first:
    nothing on disk to read), resume() goes on from step 10 (the loader too) and the weights at
    step 20 equal an uninterrupted run's. Two neighbours lost together: said, and resume() reads
    the disk. Each rank holds its own part and its neighbour's."""
    import os
    import shutil
    import signal
    import time

    with WorkerPool(num_processes=world, output="none", return_all=True) as pool:
        assert pool.run(PEER_CELLS["setup"], str(tmp_path / "ref")) == [0] * world
        reference = pool.run(PEER_CELLS["train"], 20)
    with WorkerPool(num_processes=world, output="none", return_all=True) as pool:
        pool.run(PEER_CELLS["setup"], str(tmp_path / "run"))
        pool.run(PEER_CELLS["train"], 12)
        held = pool.run(PEER_CELLS["held"])
        for rank, ((own, neighbours), params) in enumerate(held):
            # its own part (its shards of the weights and of AdamW's two moments, its random states;
            # rank 0's also the shared files) and rank (r - 1)'s
            assert neighbours == held[(rank - 1) % world][0][0]
            assert 3 * params <= own < 3 * params + 64 * 1024
        assert [s.step for s in snapshot_dir.listing(tmp_path / "run") if s.complete] == [5, 10]
        from_peers = len(killed) == 1
        if from_peers:
            shutil.rmtree(tmp_path / "run")  # nothing on disk to read from
        capfd.readouterr()
        for rank in killed:
            os.kill(pool.status()[rank].pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(pool.status()[rank].alive for rank in killed) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.run(PEER_CELLS["setup"], str(tmp_path / "run")) == [10] * world  # prepared again, resumed
        said = capfd.readouterr()
        said = said.out + said.err
        assert "The pool healed" in said, said
        if from_peers:
            assert ("restored from the peers' memory (nothing read from disk): snapshot step 10 "
                    "(rank 1's from rank 0's)") in said, said
        else:
            assert ("not in the peers' memory: ranks 1 and 2 were lost together (rank 2 held rank 1's part), "
                    "so one rank's part of the snapshot is gone with them; accelerator.resume() reads the "
                    "newest snapshot from disk") in said, said
        healed = pool.run(PEER_CELLS["train"], 20)
    assert all(a.equal(b) for mine, theirs in zip(healed, reference, strict=True)
               for a, b in zip(mine, theirs, strict=True))
