"""Memory, time and bytes written when loading and running a model bigger than its CPU budget.

Each measurement runs in a fresh process (tests/big_model_probe.py). Anonymous RSS (memory the
process holds) and file-backed RSS (mapped checkpoint pages, page cache the kernel can reclaim) are
measured apart; "total" is their sum. The fast test uses a small model; the slow one is the 3 GiB
proof of the issue (24 blocks, 6 shards, a 1 GiB CPU budget, warm page cache).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.big_model_support import probe, write_net_checkpoint

GiB, MiB = 1 << 30, 1 << 20


def block_bytes(width: int) -> int:
    return (8 * width * width + 7 * width) * 4


def outputs_equal(out_dir, a: str, b: str, b_dir=None) -> bool:
    b_dir = b_dir or out_dir
    return torch.equal(torch.load(out_dir / f"output-{a}.pt"), torch.load(b_dir / f"output-{b}.pt"))


def test_small_model_streams_from_the_checkpoint(tmp_path):
    width, blocks = 256, 24
    checkpoint = write_net_checkpoint(tmp_path / "ckpt", width, blocks)
    size = blocks * block_bytes(width)
    budget = size // 3
    ours = probe("ours", checkpoint, width, blocks, budget, tmp_path)
    eager = probe("eager", checkpoint, width, blocks, budget, tmp_path)
    assert outputs_equal(tmp_path, "ours", "eager")
    assert ours["offload_bytes"] == 0 and ours["on_disk"] >= 12
    # small sizes: allow 16 MiB for the interpreter's own allocations besides the 10%
    assert ours["peak_anon_delta"] <= (budget + block_bytes(width)) * 1.1 + 16 * MiB, ours
    assert ours["peak_total_delta"] < eager["peak_total_delta"], (ours, eager)


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory):
    """The issue's 3 GiB fp32 model: 24 blocks of width 2048, 6 safetensors shards."""
    folder = tmp_path_factory.mktemp("big") / "ckpt"
    yield write_net_checkpoint(folder, 2048, 24)
    shutil.rmtree(folder.parent)


@pytest.fixture(scope="module")
def big_eager(big_checkpoint):
    """The eagerly loaded 3 GiB model's figures, and the folder holding its output."""
    out = big_checkpoint.parent / "eager"
    return probe("eager", big_checkpoint, 2048, 24, GiB, out), out


@pytest.mark.slow
def test_3gib_model_on_a_1gib_cpu_budget(big_checkpoint, big_eager, tmp_path):
    width, blocks = 2048, 24
    size, layer = blocks * block_bytes(width), block_bytes(width)
    assert size >= 3 * GiB
    ours = probe("ours", big_checkpoint, width, blocks, GiB, tmp_path)
    eager, eager_dir = big_eager
    print("ours", ours, "\neager", eager)
    assert outputs_equal(tmp_path, "ours", "eager", eager_dir)
    assert ours["offload_bytes"] == 0
    assert ours["peak_anon_delta"] <= (GiB + layer) * 1.1, ours
    assert ours["peak_total_delta"] <= 0.45 * size, ours
    # a wall-clock figure: on a busy machine take the better of two loads (the cost of the code)
    load_s = ours["load_s"]
    if load_s > 1.5:
        load_s = min(load_s, probe("ours", big_checkpoint, width, blocks, GiB, tmp_path / "again")["load_s"])
    assert load_s <= 1.5, ours
    # forward speed: both models in one process, forwards in turn (machine load hits both alike)
    turns = probe("alternate:eager,ours", big_checkpoint, width, blocks, GiB, tmp_path)
    print("alternating forwards", turns)
    assert turns["ours"]["median_ratio"] <= 1.5, turns


@pytest.mark.slow
def test_disk_offload_holds_about_one_layer(big_checkpoint, big_eager, tmp_path):
    width, blocks = 2048, 24
    try:
        off = probe("disk_offload", big_checkpoint, width, blocks, GiB, tmp_path)
    finally:
        shutil.rmtree(tmp_path / "offload-disk_offload", ignore_errors=True)  # 3 GiB written there
    print("disk_offload", off)
    assert outputs_equal(tmp_path, "disk_offload", "eager", big_eager[1])
    limit = block_bytes(width) * 1.1
    assert off["anon_after_load_delta"] <= limit, off
    assert off["forward_peak_anon_delta"] <= limit, off
