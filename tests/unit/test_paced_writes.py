"""A snapshot's paced writes: the same files as the unpaced writers', written a piece at a time."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from notebook_accel.checkpoint import paced_writes
from notebook_accel.checkpoint.paced_writes import PacedFile, save_paced, save_safetensors_paced

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


def _takes_direct(folder: Path) -> bool:
    try:
        os.close(os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("size", [1, 4095, 4096, 8192, 3 * 8192 + 5])
def test_a_file_written_straight_to_the_disk_has_exactly_the_bytes_written(tmp_path, monkeypatch, size):
    """O_DIRECT writes whole blocks from the aligned buffer; the last piece is padded, then cut off."""
    if not _takes_direct(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    monkeypatch.setattr(paced_writes, "PIECE", 8192)
    data = os.urandom(size)
    with PacedFile(tmp_path / "f") as f:
        assert f.direct
        f.write(data[:3])  # small writes add up to a piece
        f.write(memoryview(data)[3:])
        assert f.direct and f.tell() == size
    assert (tmp_path / "f").read_bytes() == data


def test_a_safetensors_file_straight_to_the_disk_is_byte_for_byte_safetensors_own(tmp_path, monkeypatch):
    if not _takes_direct(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    monkeypatch.setattr(paced_writes, "PIECE", 8192)
    state = _state() | {"big": torch.randn(10_000)}
    save_file(state, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    save_safetensors_paced(state, tmp_path / "ours.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()


def test_a_file_system_that_refuses_o_direct_at_open_is_written_through_the_page_cache(tmp_path, monkeypatch):
    """Some file systems (FUSE mounts such as Google Drive, tmpfs before Linux 6.6) refuse the flag
    at open: the same bytes, the other way."""
    real_open = os.open

    def open_(path, flags, mode=0o777):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(paced_writes, "PIECE", 8192)
    monkeypatch.setattr(paced_writes.os, "open", open_)
    data = os.urandom(3 * 8192 + 5)
    with PacedFile(tmp_path / "f") as f:
        assert not f.direct
        f.write(data)
    assert (tmp_path / "f").read_bytes() == data


def test_a_write_refused_after_the_open_goes_on_through_the_page_cache_without_a_byte_lost(tmp_path, monkeypatch):
    if not _takes_direct(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    monkeypatch.setattr(paced_writes, "PIECE", 8192)
    real_write, refused = os.write, []

    def write(fd, data):
        if paced_writes.fcntl.fcntl(fd, paced_writes.fcntl.F_GETFL) & os.O_DIRECT and len(refused) < 1 \
                and os.lseek(fd, 0, os.SEEK_CUR) == 8192:  # the second piece
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(paced_writes.os, "write", write)
    data = os.urandom(5 * 8192 + 7)
    with PacedFile(tmp_path / "f") as f:
        f.write(data)
        assert refused and not f.direct
    assert (tmp_path / "f").read_bytes() == data


def test_another_error_of_a_write_is_raised(tmp_path, monkeypatch):
    def write(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(paced_writes, "PIECE", 8192)
    monkeypatch.setattr(paced_writes.os, "write", write)
    with pytest.raises(OSError, match="No space"), PacedFile(tmp_path / "f") as f:
        f.write(b"x" * 9000)
