"""A snapshot's files written in small pieces with pauses between them, so that the background write
never holds a CPU core for long: training's threads get it back within a piece.

On a machine with few cores, training's intra-op threads use every one; a write that runs for
tens of milliseconds at a time (``safetensors``' ``save_file``, one ``write`` of a whole tensor, an
``fsync`` racing the writes) takes a core from one of them, and every parallel region of the step
waits for that thread: the step stalls several times longer than the write's CPU time. Written
piece by piece (``PIECE`` bytes, then ``PAUSE`` seconds asleep, the GIL released), the same bytes
cost the training about their copy into the page cache, spread over the steps.

The files are the same as the unpaced writers' (``safetensors``' layout, byte for byte; ``torch.save``
through a file object): ``load_state``, the peer's and ``resume()`` read them unchanged.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

PIECE = 1 << 20  # bytes written at a time
PAUSE = 0.001  # seconds asleep after each piece

# safetensors' dtype names, in the order of its ``Dtype`` (it writes the tensors by dtype, last first)
_ORDER = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64",
          "I64", "U64")
_DTYPES = {getattr(torch, name): code for name, code in (
    ("bool", "BOOL"), ("uint8", "U8"), ("int8", "I8"), ("float8_e5m2", "F8_E5M2"), ("float8_e4m3fn", "F8_E4M3"),
    ("int16", "I16"), ("uint16", "U16"), ("float16", "F16"), ("bfloat16", "BF16"), ("int32", "I32"),
    ("uint32", "U32"), ("float32", "F32"), ("float64", "F64"), ("int64", "I64"), ("uint64", "U64"),
) if hasattr(torch, name)}


class PacedFile:
    """A binary file opened for writing whose ``write`` goes out at most ``PIECE`` bytes at a time,
    pausing ``PAUSE`` seconds after each ``PIECE`` bytes (small writes, such as ``torch.save``'s
    headers, add up to a piece); ``close`` fsyncs it."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._written = 0
        self._since_pause = 0  # bytes written since the last pause

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            wrote = os.write(self._fd, view[done:done + PIECE - self._since_pause])
            done += wrote
            self._since_pause += wrote
            if self._since_pause >= PIECE:
                self._since_pause = 0
                time.sleep(PAUSE)
        self._written += len(view)
        return len(view)

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        """Nothing is buffered here (``torch.save`` calls it)."""

    def close(self) -> None:
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)

    def __enter__(self) -> PacedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def save_paced(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` into ``path``, paced, fsync'd."""
    with PacedFile(path) as f:
        torch.save(obj, f)


def save_safetensors_paced(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """``state`` as a safetensors file (the bytes ``safetensors.torch.save_file`` writes), paced, fsync'd.

    Raises:
        ValueError: a tensor that is not a contiguous CPU tensor of a dtype safetensors stores.
    """
    header, order = _safetensors_header(state, metadata)
    with PacedFile(path) as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for name in order:
            tensor = state[name]
            if tensor.numel():
                f.write(_bytes_of(tensor))


def _safetensors_header(state: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> tuple[bytes, list[str]]:
    """The header safetensors writes (tensors by dtype, in ``_ORDER`` from the last, then name; padded with
    spaces to 8 bytes) and the order of the tensors' bytes after it."""
    for name, tensor in state.items():
        if tensor.dtype not in _DTYPES or tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"tensor {name!r} ({tensor.dtype}, {tensor.device}, contiguous "
                             f"{tensor.is_contiguous()}) cannot be written as safetensors here: "
                             "a contiguous CPU tensor of a dtype safetensors stores is needed")
    order = sorted(state, key=lambda name: (-_ORDER.index(_DTYPES[state[name].dtype]), name))
    entries: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order:
        tensor = state[name]
        size = tensor.numel() * tensor.element_size()
        entries[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape),
                         "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(entries, separators=(",", ":")).encode()
    return header + b" " * (-len(header) % 8), order


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (little-endian, as on every host we run on)."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
