"""Two-process regression tests for issue 12 (real gloo collectives under torchrun)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime_support import torchrun

pytestmark = pytest.mark.slow  # one torchrun launch for the module: ~7 s alone, ~20 s on a busy machine

SCRIPT = Path(__file__).parents[1] / "runtime_scripts" / "compat_checks.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return torchrun(SCRIPT, tmp_path_factory.mktemp("compat"), "compat")


def test_two_processes_with_the_users_generator_train_the_one_process_model(ranks):
    for rank in ranks:
        assert rank["one_process_order"] < 1e-6


def test_save_state_into_a_directory_per_rank_is_complete_on_every_rank(ranks):
    want = ["accelerator.pt", "model.safetensors", "random_states_0.pkl"]
    assert ranks[0]["unshared_files"] == want
    assert ranks[1]["unshared_files"] == ["accelerator.pt", "model.safetensors", "random_states_1.pkl"]
    for rank in ranks:
        assert rank["unshared_leftovers"] == []  # no .tmp, .old or lock files left
        assert rank["shared_files"] == ["accelerator.pt", "model.safetensors", "random_states_0.pkl",
                                        "random_states_1.pkl"]


def test_max_min_reductions_and_split_of_a_dataset(ranks):
    for rank in ranks:
        assert rank["max"] == [3.0, 4.0] and rank["min"] == [1.0, 2.0]
        assert rank["split"] == [0, 1, 2, 3, 4, 4]
        assert rank["gather"] == [0, 1]


def test_dispatch_batches_sends_every_rank_its_slice(ranks):
    for rank in ranks:
        for split in (False, True):
            values, length, batches = rank[f"dispatch_split{split}"]
            assert values == list(range(22))  # nothing lost, padding dropped by gather_for_metrics
            assert length == batches == 6


def test_rng_sync_trigger_sync_in_backward_and_debug_mode(ranks):
    for rank in ranks:
        assert rank["rng_synced"] is True
        assert rank["trigger_sync"][0] is True
        assert "reduce: the processes passed tensors of different shapes" in rank["debug_mode"]
    assert ranks[0]["trigger_sync"][1] != ranks[1]["trigger_sync"][1]  # the first backward did not sync
