"""The flight recorder read as ours: torch's dump -> Collectives, the last N per group."""

from __future__ import annotations

import json

import torch.distributed.distributed_c10d as c10d

from notebook_accel.launch.worker import flight_recorder
from notebook_accel.launch.worker.flight_recorder import (
    DUMP_MARK,
    from_dump,
    group_name,
    read_dump_line,
    switch_on,
    tensor_text,
)
from notebook_accel.runtime import collective_check
from notebook_accel.wire import Collective

_TORCH = c10d.__file__


def _entry(number, group=("0", "default_pg"), op="gloo:all_reduce", sizes=((1024,),),
           dtypes=("Float",), line=18, retired=True, at=0, p2p=False, frames=None):
    return {"collective_seq_id": number, "process_group": group, "profiling_name": op,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": list(dtypes),
            "time_created_ns": 1_700_000_000_000_000_000 + at * 1000, "retired": retired,
            "state": "scheduled", "time_discovered_completed_ns": None, "is_p2p": p2p,
            "frames": frames if frames is not None else [
                {"name": "all_reduce", "filename": _TORCH, "line": 3245},
                {"name": "train", "filename": "/tmp/ipykernel_1/3.py", "line": line},
                {"name": "<module>", "filename": "/tmp/ipykernel_1/4.py", "line": 2}]}


def test_an_entry_reads_as_op_group_number_tensors_and_the_users_line():
    (collective,) = from_dump({"entries": [_entry(412, retired=False)]})
    assert collective == Collective(412, "default", "all_reduce", ("float32[1024]",),
                                    ("/tmp/ipykernel_1/3.py", 18, "train"), 1.7e9, None, False)


def test_the_ring_keeps_the_last_n_per_group_oldest_first():
    entries = [_entry(n, at=2 * n) for n in range(1, 301)]
    entries += [_entry(n, group=("1", "undefined"), op="gloo:broadcast", at=2 * n + 1)
                for n in range(1, 6)]
    kept = from_dump({"entries": entries}, last=256)
    default = [c.number for c in kept if c.group == "default"]
    assert default == list(range(45, 301))  # the last 256, oldest first
    assert [c.number for c in kept if c.group == "1"] == [1, 2, 3, 4, 5]  # not crowded out
    assert [c.started for c in kept] == sorted(c.started for c in kept)
    assert from_dump({"entries": entries}, last=0) == ()


def test_point_to_point_and_the_checks_own_exchanges_are_left_out():
    check = [{"name": "all_gather", "filename": _TORCH, "line": 1},
             {"name": "_agree", "filename": collective_check.__file__, "line": 9},
             {"name": "train", "filename": "/tmp/ipykernel_1/3.py", "line": 18}]
    kept = from_dump({"entries": [_entry(1), _entry(2, p2p=True, op="gloo:send"),
                                  _entry(3, op="gloo:all_gather", frames=check)]})
    assert [c.number for c in kept] == [1]
    waiting = from_dump({"entries": [_entry(4, op="gloo:all_gather", frames=check, retired=False)]})
    assert [(c.op, c.where[1]) for c in waiting] == [("all_gather (check_collectives)", 18)]


def test_names_of_groups_and_tensors():
    assert group_name(("0", "default_pg")) == "default"
    assert group_name(("3", "undefined")) == "3"
    assert group_name(("3", "tensor_parallel")) == "tensor_parallel"
    assert tensor_text("BFloat16", [2, 3]) == "bfloat16[2,3]"
    assert tensor_text("Long", []) == "int64[]"


def test_a_dump_with_no_users_frame_says_none():
    frames = [{"name": "all_reduce", "filename": _TORCH, "line": 3245}]
    (collective,) = from_dump({"entries": [_entry(1, frames=frames)]})
    assert collective.where is None


def test_a_one_off_workers_line_round_trips():
    collectives = from_dump({"entries": [_entry(1), _entry(2, retired=False)]})
    line = DUMP_MARK + json.dumps([list(c) for c in collectives])
    assert read_dump_line(line) == collectives
    assert read_dump_line("[rank 0] hello") is None
    assert read_dump_line(DUMP_MARK + "{not json") is None


def test_switched_on_unless_the_user_chose_a_size():
    assert switch_on({}) == {"TORCH_FR_BUFFER_SIZE": str(flight_recorder.RING)}
    assert switch_on({"TORCH_FR_BUFFER_SIZE": "0"}) == {}


def test_a_group_pushed_out_of_the_ring_keeps_its_latest_number():
    """torch counts every group's collectives beside the ring (``pg_status``): a quiet group
    whose entries a busy one pushed out is one entry, its number, marked out of the ring."""
    dump = {"entries": [_entry(n, at=n) for n in range(3000, 3003)],
            "pg_status": {"0": {"last_enqueued_collective": 3002, "last_completed_collective": 3002},
                          "1": {"last_enqueued_collective": 7, "last_completed_collective": 7},
                          "2": {"last_enqueued_collective": -1, "last_completed_collective": -1}},
            "group_descriptions": {"0": "default_pg", "1": "quiet"}}
    read = from_dump(dump, last=2)
    assert read[0] == Collective(7, "quiet", flight_recorder.OUT_OF_RING, (), None, 0.0, None, True)
    assert [(c.group, c.number) for c in read[1:]] == [("default", 3001), ("default", 3002)]


def test_an_idle_ranks_read_waits_for_torch_to_mark_its_ended_collectives(monkeypatch):
    """torch marks a collective ended on the backend's thread, after the rank's wait returned:
    between runs an entry still ``scheduled`` is read again until marked; during a run (the
    hang watch) it is read once, and one that never ends is given up after SETTLE_S."""
    reads = iter([{"entries": [_entry(1), _entry(2, retired=False)]}] * 3
                 + [{"entries": [_entry(1), _entry(2)]}])
    monkeypatch.setattr(flight_recorder, "_dump", lambda where: next(reads))
    assert [c.done for c in flight_recorder.recent(settle=True)] == [True, True]
    reads = iter([{"entries": [_entry(2, retired=False)]}, {"entries": [_entry(2)]}])
    assert [c.done for c in flight_recorder.recent()] == [False]  # in a run: read as it is
    monkeypatch.setattr(flight_recorder, "SETTLE_S", 0.05)
    monkeypatch.setattr(flight_recorder, "_dump", lambda where: {"entries": [_entry(2, retired=False)]})
    assert [c.done for c in flight_recorder.recent(settle=True)] == [False]
