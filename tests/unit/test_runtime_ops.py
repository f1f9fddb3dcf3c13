"""Collectives on nested structures in one plain process (the 2-process versions: test_runtime_distributed)."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from notebook_accel.runtime import ops

Pair = namedtuple("Pair", "a b")


class Moves:
    def __init__(self) -> None:
        self.device = None

    def to(self, device, non_blocking=False):
        self.device = device
        return self


def test_send_to_device_keeps_structure():
    thing = Moves()
    data = {"x": [torch.ones(1), (torch.zeros(2), "label")], "p": Pair(torch.ones(1), 3), "m": thing}
    out = ops.send_to_device(data, torch.device("cpu"))
    assert isinstance(out["p"], Pair) and out["p"].b == 3
    assert isinstance(out["x"][1], tuple) and out["x"][1][1] == "label"
    assert thing.device == torch.device("cpu")


def test_single_process_collectives_are_identities():
    assert ops.gather(torch.tensor(3.0)).tolist() == [3.0]  # 0-dim becomes 1-dim, as in the peer
    assert ops.gather({"a": torch.ones(2)})["a"].tolist() == [1.0, 1.0]
    assert ops.gather_object([1, 2]) == [1, 2] and ops.gather_object("x") == ["x"]
    assert ops.reduce(torch.tensor(2.0), "mean", scale=3.0).item() == 6.0
    t = torch.ones(2)
    assert ops.broadcast(t) is t and ops.pad_across_processes(t) is t
    assert ops.broadcast_object_list([1]) == [1]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="'median'.*'sum', 'mean', 'max', 'min', 'none'"):
        ops.reduce(torch.ones(1), "median")
    with pytest.raises(TypeError, match=r"Unsupported types \(<class 'str'>\) passed to"):
        ops.gather({"a": "text"})
    assert not ops.is_tensor_structure([torch.ones(1), "x"]) and ops.is_tensor_structure((torch.ones(1),))


def test_object_collectives_on_an_xla_group_go_through_torch_xla(monkeypatch):
    from notebook_accel.runtime import xla

    monkeypatch.setattr(ops, "world_size", lambda: 2)
    monkeypatch.setattr(ops, "group_kind", lambda: xla.XlaDevice())
    monkeypatch.setattr(xla, "gather_object", lambda obj, tag="": [obj, obj])
    monkeypatch.setattr(xla, "broadcast_object_list", lambda objects, src: objects + ["from core"])
    assert ops.gather_object([1]) == [1, 1] and ops.gather_object("x") == ["x", "x"]
    assert ops.broadcast_object_list([0]) == [0, "from core"]


def test_concatenate_joins_lists_of_strings_and_keeps_a_single_batch():
    from notebook_accel.utils import concatenate

    assert concatenate([["a", "b"], ["c"]]) == ["a", "b", "c"]
    assert concatenate([["a", "b"]]) == ["a", "b"]
    joined = concatenate([{"x": torch.ones(1), "text": ["p"]}, {"x": torch.zeros(1), "text": ["q", "r"]}])
    assert joined["text"] == ["p", "q", "r"] and torch.equal(joined["x"], torch.tensor([1.0, 0.0]))
    with pytest.raises(TypeError, match="cannot concatenate"):
        concatenate([object(), object()])
