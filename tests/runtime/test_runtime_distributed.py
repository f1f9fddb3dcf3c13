"""The Accelerator runtime on 2 processes with real gloo collectives, started by ``torchrun``.

Two launches of ``runtime_scripts/ddp_checks.py``: ``train`` (equivalence with a
1-process reference, accumulation/no_sync, gather_for_metrics, collectives, mixed
precision, and an uninterrupted run writing checkpoints) and ``resume`` (fresh
processes that load those checkpoints and must land bit for bit on the
uninterrupted weights). Running unchanged under torchrun is itself the point.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime_support import torchrun

SCRIPT = Path(__file__).parents[1] / "runtime_scripts" / "ddp_checks.py"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp("ddp")
    train = torchrun(SCRIPT, out, "train")
    resume = torchrun(SCRIPT, out, "resume")  # fresh processes
    return {"train": train, "resume": resume}


@pytest.mark.parametrize("case", ["plain", "accumulate", "split_batches"])
def test_two_processes_match_one_process_with_same_global_batch(runs, case):
    for rank in runs["train"]:
        assert rank[f"equiv_{case}"] < 1e-5
        assert rank[f"ranks_agree_{case}"] == 0.0


def test_same_loop_under_the_peer_gives_the_same_results(runs):
    for rank in runs["train"]:
        parity = rank["peer_parity"]
        if parity is None:
            pytest.skip("accelerate (the peer) is not installed")
        assert parity["weights"] == 0.0 and parity["lrs_equal"] and parity["eval_equal"]
        assert parity["eval"] == list(range(21))


def test_accumulate_skips_all_reduce_until_sync_step(runs):
    r0 = runs["train"][0]
    assert r0["no_sync_syncs"] == [False, True, False, True]
    spread = r0["no_sync_spreads"]
    assert spread[0] > 1e-3 and spread[2] > 1e-3  # local, un-reduced gradients differ
    assert spread[1] == 0.0 and spread[3] == 0.0  # synced gradients are identical
    assert r0["no_sync_syncs_each_batch"] == [False, True, False, True]
    assert r0["no_sync_spreads_each_batch"] == [0.0] * 4  # sync_each_batch: all-reduced every micro-step


def test_join_uneven_inputs_trains_on_loaders_of_different_lengths(runs):
    r0, r1 = runs["train"]
    assert (r0["join_steps"], r1["join_steps"]) == (4, 3)
    assert r0["join_ranks_agree"] == 0.0 and r1["join_ranks_agree"] == 0.0


def test_gather_for_metrics_returns_exactly_the_uneven_eval_set(runs):
    for rank in runs["train"]:
        assert rank["metrics_even"] == list(range(101))
        assert rank["metrics_even_objects"] == list(range(101))
        assert rank["metrics_split"] == list(range(101))
        assert rank["metrics_uneven"] == list(range(101))
        assert rank["metrics_iterable"] == list(range(101))


def test_collectives_and_process_control(runs):
    r0, r1 = runs["train"]
    for r in (r0, r1):
        assert r["reduce_sum"] == 3.0 and r["reduce_mean"] == 1.5
        assert r["broadcast"] == [1, 1]
        assert r["gather_nested"] == {"r": [0, 1], "v": [0, 0, 1, 1]}
        assert r["gather_object"] == [{"rank": 0}, {"rank": 1}]
        assert r["order"] == ["0", "1"]
        assert r["trigger"] is True
    assert r0["pad"] == [[1.0, 1.0], [-1.0, -1.0]] and r1["pad"] == [[1.0, 1.0], [1.0, 1.0]]
    assert r0["pad_first"] == [[0, 5]] and r1["pad_first"] == [[5, 5]]
    assert (r0["split"], r1["split"]) == ([0, 1, 2], [3, 4])
    assert (r0["split_padded"], r1["split_padded"]) == ([0, 1, 2], [3, 4, 4])
    assert (r0["on_main"], r1["on_main"]) == ("ran", None)
    assert r0["state"] == [0, 2, "MULTI_CPU", "cpu"] and r1["state"] == [1, 2, "MULTI_CPU", "cpu"]


@pytest.mark.parametrize("mp", ["bf16", "fp16"])
def test_mixed_precision_trains_under_ddp_on_cpu(runs, mp):
    for rank in runs["train"]:
        res = rank[f"mp_{mp}"]
        assert res["dtypes"] == ["torch.float32"]  # outputs converted back to fp32
        assert res["scaler"] is (mp == "fp16")
        assert all(loss == loss and loss < 1e3 for loss in res["losses"])  # finite


def test_resume_after_epoch_in_fresh_launch_is_bit_exact(runs):
    for rank in runs["resume"]:
        assert rank["resume_epoch_diff"] == 0.0


def test_resume_mid_epoch_with_skip_first_batches_is_bit_exact(runs):
    for rank in runs["resume"]:
        assert rank["ckpt_mid_resume_step"] == 5
        assert rank["resume_mid_diff"] == 0.0
