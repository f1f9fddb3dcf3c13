"""A snapshot's paced writes: the same files as the unpaced writers', written a piece at a time."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from notebook_accel.checkpoint import paced_writes
from notebook_accel.checkpoint.paced_writes import save_paced, save_safetensors_paced

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16,
          torch.uint32, torch.uint64]


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    state = {f"t_{str(dtype).split('.')[-1]}": (torch.randn(3, 5) * 9).to(dtype) for dtype in DTYPES}
    state |= {"a.weight": torch.randn(64, 33), "scalar": torch.tensor(7), "empty": torch.zeros(0, 4),
              "b.bias": torch.randn(33).to(torch.bfloat16)}
    return state


def test_a_paced_safetensors_file_is_byte_for_byte_safetensors_own(tmp_path, monkeypatch):
    monkeypatch.setattr(paced_writes, "PIECE", 100)  # tensors cut across pieces
    state = _state()
    save_file(state, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    save_safetensors_paced(state, tmp_path / "ours.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    back = load_file(str(tmp_path / "ours.safetensors"))
    assert all(torch.equal(back[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)) for k, v in state.items())


def test_a_paced_torch_file_loads_back_equal_and_goes_out_in_pieces_with_pauses(tmp_path, monkeypatch):
    pauses = []
    monkeypatch.setattr(paced_writes, "PIECE", 4096)
    monkeypatch.setattr(paced_writes.time, "sleep", pauses.append)
    state = {"state": {0: {"exp_avg": torch.randn(10_000), "step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]}
    save_paced(state, tmp_path / "optimizer.bin")
    back = torch.load(tmp_path / "optimizer.bin", weights_only=True)
    assert torch.equal(back["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    assert back["param_groups"] == state["param_groups"]
    assert len(pauses) >= 40_000 // 4096  # the 40 kB tensor alone is ten pieces, each followed by a pause
    assert set(pauses) == {paced_writes.PAUSE}


def test_a_tensor_safetensors_cannot_hold_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="'w'.*contiguous"):
        save_safetensors_paced({"w": torch.randn(4, 3).t()}, tmp_path / "x.safetensors")
