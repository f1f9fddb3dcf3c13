"""check_collectives' descriptor: what every rank must call alike, and how a call reads."""

from __future__ import annotations

import torch

from notebook_accel.runtime.collective_check import _call_text, _descriptor


def test_a_descriptor_holds_the_op_root_dtype_and_shape_in_a_fixed_size():
    a = _descriptor("all_reduce", torch.ones(4, 3), None)
    b = _descriptor("broadcast", torch.ones(10), 0)
    assert len(a) == len(b) == len(_descriptor("barrier", None, None))
    assert _call_text(tuple(a)) == "all_reduce(float32[4,3])"
    assert _call_text(tuple(b)) == "broadcast(float32[10], src=0)"
    assert _call_text(tuple(_descriptor("barrier", None, None))) == "barrier()"
    assert _descriptor("all_reduce", torch.ones(4, dtype=torch.bfloat16), None) != a


def test_more_dimensions_than_it_holds_are_said():
    row = _descriptor("all_reduce", torch.ones(*([1] * 9)), None)
    assert _call_text(tuple(row)) == "all_reduce(float32[1,1,1,1,1,1,1,1,...])"
