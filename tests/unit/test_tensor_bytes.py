"""Plain CPU tensors cross as their bytes, and come out as torch's own pickling gives them."""

from __future__ import annotations

import gc
import pickle
import warnings

import pytest
import torch

from notebook_accel.launch.handoff import tensor_bytes
from notebook_accel.launch.handoff.payload import dumps_result, load_payload, serialise_payload

PLAIN = {
    "matrix": lambda: torch.arange(12.0).reshape(3, 4),
    "transposed": lambda: torch.arange(12.0).reshape(3, 4).T,
    "a slice (offset)": lambda: torch.arange(12)[3:7],
    "bfloat16": lambda: torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
    "bool": lambda: torch.tensor([True, False, True]),
    "a scalar": lambda: torch.tensor(3.5, dtype=torch.float64),
    "expanded (stride 0)": lambda: torch.arange(6.0).unsqueeze(0).expand(2, 6),
    "int8": lambda: torch.tensor([-3, 0, 7], dtype=torch.int8),
}
TORCHS_WAY = {
    "a Parameter": lambda: torch.nn.Parameter(torch.ones(2)),
    "requires grad": lambda: torch.ones(2, requires_grad=True),
    "conjugated": lambda: torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj(),
    "sparse": lambda: torch.eye(3).to_sparse(),
    "empty storage": lambda: torch.zeros(0),
    "a Python attribute": lambda: _with_attribute(torch.ones(2)),
    "quantized": lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),
}


def _with_attribute(tensor: torch.Tensor) -> torch.Tensor:
    tensor.note = "kept"
    return tensor


def _same_as_torchs(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert (type(ours), ours.dtype, ours.layout, ours.shape, ours.requires_grad) == (
        type(theirs), theirs.dtype, theirs.layout, theirs.shape, theirs.requires_grad)
    if ours.layout is not torch.strided:
        assert torch.equal(ours.to_dense(), theirs.to_dense())
        return
    assert (ours.stride(), ours.storage_offset(), ours.untyped_storage().nbytes()) == (
        theirs.stride(), theirs.storage_offset(), theirs.untyped_storage().nbytes())
    if ours.is_quantized:
        assert torch.equal(ours.dequantize(), theirs.dequantize())
    else:
        assert torch.equal(ours.detach().resolve_conj(), theirs.detach().resolve_conj())
    assert getattr(ours, "note", None) == getattr(theirs, "note", None)


@pytest.mark.parametrize("name", PLAIN)
def test_a_plain_tensor_travels_as_its_bytes_and_arrives_as_torchs_pickle_gives_it(name):
    tensor = PLAIN[name]()
    assert tensor_bytes.reduce(tensor) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a buffer torch cannot write to would warn)
        ours = pickle.loads(dumps_result(tensor))
    _same_as_torchs(ours, pickle.loads(pickle.dumps(tensor)))
    if ours.is_contiguous():  # its own writable memory, not the sender's
        ours.zero_()
        assert torch.equal(tensor, PLAIN[name]())


@pytest.mark.parametrize("name", TORCHS_WAY)
def test_anything_else_takes_torchs_way(name):
    tensor = TORCHS_WAY[name]()
    assert tensor_bytes.reduce(tensor) is None
    _same_as_torchs(pickle.loads(dumps_result(tensor)), pickle.loads(pickle.dumps(tensor)))


def test_two_views_of_one_storage_arrive_as_two_copies_as_with_torch():
    base = torch.zeros(4)
    whole, view = pickle.loads(dumps_result([base, base.view(2, 2)]))
    whole[0] = 9
    assert view[0, 0] == 0  # torch's pickling does not keep them shared either
    theirs = pickle.loads(pickle.dumps([base, base.view(2, 2)]))
    theirs[0][0] = 9
    assert theirs[1][0, 0] == 0


def test_a_payload_argument_crosses_the_same_way():
    def add(a, b):
        return a + b

    function, args, _ = load_payload(serialise_payload(add, (torch.ones(3), torch.arange(3.0)), {}))
    assert torch.equal(function(*args), torch.tensor([1.0, 2.0, 3.0]))


def test_the_tensor_keeps_the_bytes_it_was_read_from_alive():
    blob = dumps_result(torch.arange(100_000, dtype=torch.float32))
    tensor = pickle.loads(blob)
    del blob
    gc.collect()
    filler = [bytearray(400_000) for _ in range(50)]  # memory freed under it would be reused here
    assert torch.equal(tensor, torch.arange(100_000, dtype=torch.float32))
    assert tensor.untyped_storage().nbytes() == 400_000 and all(not any(f[:8]) for f in filler)
