"""Which snapshot the peers' memory can bring back whole after a heal (``snapshot_peers``): each rank
holds its own part and rank (r - 1)'s; a part is lost only with both its rank and the next."""

from __future__ import annotations

import torch

from notebook_accel.checkpoint import snapshot_peers, state_parts


def _held(*ranks):
    """(own step, neighbour's step, directory) per rank; None: a rank that died."""
    return [(None, None, None) if r is None else (r[0], r[1], "/run") for r in ranks]


def test_a_lost_rank_is_brought_back_from_the_next_ranks_memory():
    step, sources = snapshot_peers._whole_step(_held((10, 10), None, (10, 10)), 3)
    assert step == 10 and sources == {0: 0, 1: 2, 2: 2}


def test_a_death_during_the_swap_leaves_no_whole_snapshot():
    # rank 1 died in step 15's swap: rank 2 holds only its step-10 part, and ranks 0 and 2 their own
    # step-15 parts (each keeps the newest only): no step is whole, and that is said
    every = _held((15, 15), None, (15, 10))
    assert snapshot_peers._whole_step(every, 3) == (None, {})
    assert snapshot_peers._lost_pairs(every, 3) == "the ranks hold parts of different snapshots"


def test_two_neighbours_lost_together_fall_back_to_the_disk_and_say_why():
    every = _held((10, 10), None, None)
    assert snapshot_peers._whole_step(every, 3) == (None, {})
    assert snapshot_peers._lost_pairs(every, 3) == "ranks 1 and 2 were lost together (rank 2 held rank 1's part)"


def test_own_shards_round_trip_through_a_live_layout():
    held = {"w": torch.arange(4.0), "step": torch.tensor(3.0), "groups": [{"lr": 0.1}]}
    live = {"w": torch.zeros(4), "step": torch.tensor(0.0), "groups": [{"lr": 0.5}]}
    back = state_parts.fill_own_shards(live, state_parts.own_shards(held))
    assert back["w"].equal(held["w"]) and back["step"].item() == 3.0 and back["groups"] == [{"lr": 0.1}]


def test_in_peers_is_checked_and_alone_keeps_nothing(tmp_path):
    import pytest

    from notebook_accel import Accelerator

    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match=r"snapshot_every\(in_peers='yes'\): must be True or False"):
        accelerator.snapshot_every(steps=1, dir=tmp_path, in_peers="yes")
    accelerator.snapshot_every(steps=1, dir=tmp_path, in_peers=True)
    assert not accelerator._snapshots.in_peers and accelerator._snapshots.group is None  # no peer alone
