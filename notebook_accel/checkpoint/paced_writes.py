"""A snapshot's files written in small pieces with pauses between them, straight to the disk where
it allows, so that the background write takes as little CPU from training as it can.

On a machine with few cores, training's intra-op threads use every one; a write that runs for
tens of milliseconds at a time (``safetensors``' ``save_file``, one ``write`` of a whole tensor, an
``fsync`` racing the writes) takes a core from one of them, and every parallel region of the step
waits for that thread: the step stalls several times longer than the write's CPU time. Written
piece by piece (``PIECE`` bytes, then ``PAUSE`` seconds asleep, the GIL released), the cost is
spread over the steps. Each piece goes out with ``O_DIRECT`` from a page-aligned buffer: the
kernel neither copies it into the page cache nor writes it back later (96 MB here: the writing
thread 19-21 ms of CPU instead of 33-34, the machine 10-20 instead of 30-50;
``benchmarks/paced_write_cpu.py``), and the snapshot does not push the user's data out of the cache. A
file system that refuses ``O_DIRECT`` (some FUSE mounts, tmpfs before Linux 6.6) is written
through the page cache instead, the same bytes.

The files are the same as the unpaced writers' (``safetensors``' layout, byte for byte; ``torch.save``
through a file object): ``load_state``, the peer's and ``resume()`` read them unchanged.
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import time
from pathlib import Path
from typing import Any

import torch

PIECE = 1 << 20  # bytes written at a time
DIRECT = getattr(os, "O_DIRECT", 0)  # the flag (Linux; 0 elsewhere, or set to 0: through the page cache)
PAUSE = 0.001  # seconds asleep after each piece
BLOCK = 4096  # what O_DIRECT asks of a write's length and place (a multiple of every disk's block)

# safetensors' dtype names, in the order of its ``Dtype`` (it writes the tensors by dtype, last first)
_ORDER = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64",
          "I64", "U64")
_DTYPES = {getattr(torch, name): code for name, code in (
    ("bool", "BOOL"), ("uint8", "U8"), ("int8", "I8"), ("float8_e5m2", "F8_E5M2"), ("float8_e4m3fn", "F8_E4M3"),
    ("int16", "I16"), ("uint16", "U16"), ("float16", "F16"), ("bfloat16", "BF16"), ("int32", "I32"),
    ("uint32", "U32"), ("float32", "F32"), ("float64", "F64"), ("int64", "I64"), ("uint64", "U64"),
) if hasattr(torch, name)}


class PacedFile:
    """A binary file opened for writing whose bytes go out ``PIECE`` at a time, with a pause of
    ``PAUSE`` seconds after each piece, through a page-aligned buffer: with ``O_DIRECT`` where
    the file system takes it (``direct``), through the page cache otherwise; ``close`` writes
    the rest and fsyncs it."""

    def __init__(self, path: Path) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self.direct = bool(DIRECT) and PIECE % BLOCK == 0
        try:
            self._fd = os.open(path, flags | (DIRECT if self.direct else 0), 0o644)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self.direct = False  # the file system refuses O_DIRECT
            self._fd = os.open(path, flags, 0o644)
        self._buffer = mmap.mmap(-1, PIECE)  # page-aligned, as O_DIRECT asks
        self._piece = memoryview(self._buffer)
        self._filled = 0  # bytes of the piece in the buffer
        self._out = 0  # bytes in the file (of the pieces written)
        self._written = 0  # bytes given to ``write``

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            size = min(PIECE - self._filled, len(view) - done)
            self._piece[self._filled:self._filled + size] = view[done:done + size]
            self._filled += size
            done += size
            if self._filled == PIECE:
                self._write_piece(PIECE)
                time.sleep(PAUSE)
        self._written += len(view)
        return len(view)

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        """Nothing before ``close`` (``torch.save`` calls it): a piece goes out whole."""

    def close(self) -> None:
        try:
            if self._filled:  # the last piece: O_DIRECT writes whole blocks, cut off after
                self._write_piece(-(-self._filled // BLOCK) * BLOCK if self.direct else self._filled)
                os.ftruncate(self._fd, self._written)
            os.fsync(self._fd)
        finally:
            os.close(self._fd)  # (the buffer goes with this object: a failed write's traceback may still hold a view of it)

    def _write_piece(self, size: int) -> None:
        """Write the buffer's first ``size`` bytes (the piece; padded to whole blocks, if direct)."""
        try:
            self._write_all(self._piece[:size])
        except OSError as exc:
            if not self.direct or exc.errno != errno.EINVAL:
                raise
            # the file system took O_DIRECT at open but refuses the write: the page cache from here on
            self.direct = False
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~DIRECT)
            os.lseek(self._fd, self._out, os.SEEK_SET)
            self._write_all(self._piece[:self._filled])
        self._out += self._filled
        self._filled = 0

    def _write_all(self, data: memoryview) -> None:
        while len(data):
            data = data[os.write(self._fd, data):]

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
