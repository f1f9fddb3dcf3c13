"""Safetensors files read and written in place: headers, reads straight into tensor memory, and
zero-copy memory-mapped views.

The format is an 8-byte little-endian header length, a JSON header ``{name: {dtype, shape,
data_offsets}}`` and the raw tensor bytes. Reading it here (rather than through ``safe_open``) gives
the byte offsets, so a tensor can be read into its final memory with one ``preadv`` or mapped for
just as long as one layer runs.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
# Tensors of one module closer together than this are mapped as one span.
_MERGE_GAP = 1 << 20


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes lie in a safetensors file."""

    path: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: str | os.PathLike) -> dict[str, StoredTensor]:
    """Every tensor of a safetensors file, by name, without reading any tensor data.

    Raises:
        ValueError: the file is not a safetensors file, or uses a dtype torch lacks.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path} is not a safetensors file (shorter than its 8-byte header size)")
        (length,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path} is not a safetensors file ({error})") from None
    base = 8 + length
    found = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']!r}; supported: {sorted(DTYPES)}")
        start, end = info["data_offsets"]
        found[name] = StoredTensor(path, DTYPES[info["dtype"]], tuple(info["shape"]), base + start, base + end)
    return found


def _writable_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, as a writable buffer (no copy)."""
    nbytes = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def read_into(stored: StoredTensor, out: torch.Tensor, fd: int) -> None:
    """Read ``stored`` from the open file ``fd`` straight into the contiguous CPU tensor ``out``."""
    if out.numel() * out.element_size() != stored.nbytes:
        raise ValueError(f"{stored}: {stored.nbytes} bytes do not fill a {tuple(out.shape)} {out.dtype} tensor")
    view, done = _writable_bytes(out), 0
    while done < stored.nbytes:
        got = os.preadv(fd, [view[done:]], stored.start + done)
        if got == 0:
            raise ValueError(f"{stored.path} ends before tensor bytes {stored.start}..{stored.end}")
        done += got


def read_tensor(stored: StoredTensor, fd: int) -> torch.Tensor:
    """A fresh CPU tensor holding ``stored``."""
    out = torch.empty(stored.shape, dtype=stored.dtype)
    if out.numel():
        read_into(stored, out, fd)
    return out


def _spans(tensors: Iterable[tuple[str, StoredTensor]]) -> list[list[tuple[str, StoredTensor]]]:
    """Group tensors into runs of nearby bytes of one file, each run mapped once."""
    ordered = sorted(tensors, key=lambda item: (item[1].path, item[1].start))
    runs: list[list[tuple[str, StoredTensor]]] = []
    for name, stored in ordered:
        last = runs[-1][-1][1] if runs else None
        if last is not None and last.path == stored.path and stored.start - last.end <= _MERGE_GAP:
            runs[-1].append((name, stored))
        else:
            runs.append([(name, stored)])
    return runs


def map_tensors(tensors: Mapping[str, StoredTensor]) -> dict[str, torch.Tensor]:
    """Zero-copy CPU views of ``tensors``, read from the page cache through private mappings.

    The mappings live exactly as long as the returned tensors: once they are dropped the pages leave
    this process (they stay in the page cache), so streaming layers does not grow the RSS.
    """
    views: dict[str, torch.Tensor] = {}
    page = mmap.ALLOCATIONGRANULARITY
    for run in _spans(tensors.items()):
        path = run[0][1].path
        low = run[0][1].start // page * page
        high = max(stored.end for _, stored in run)
        if high == low:
            mapping = None
        else:
            with open(path, "rb") as f:
                # Private and writable, so torch gets a writable buffer; read faults map page-cache
                # pages (no copy), 16 at a time. Not MAP_POPULATE: on a writable private mapping it
                # copies every page; and MADV_POPULATE_READ measured slower here than the faults.
                mapping = mmap.mmap(
                    f.fileno(), high - low, flags=mmap.MAP_PRIVATE,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=low,
                )
        for name, stored in run:
            count = stored.nbytes // torch.empty((), dtype=stored.dtype).element_size()
            if count == 0:
                views[name] = torch.empty(stored.shape, dtype=stored.dtype)
                continue
            flat = torch.frombuffer(mapping, dtype=stored.dtype, count=count, offset=stored.start - low)
            views[name] = flat.view(stored.shape)
    return views


def prefetch(tensors: Iterable[StoredTensor]) -> None:
    """Ask the kernel to read ``tensors`` into the page cache in the background (a cold cache)."""
    for stored in tensors:
        fd = os.open(stored.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, stored.start, stored.nbytes, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor]) -> dict[str, StoredTensor]:
    """Write CPU ``tensors`` to a safetensors file, each straight from its memory (no copy of the
    whole dict), and return where each one landed."""
    path = os.fspath(path)
    contiguous = {name: t.detach().contiguous() for name, t in tensors.items()}
    header, offset = {}, 0
    for name, tensor in contiguous.items():
        if tensor.dtype not in NAMES:
            raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}; writable: {sorted(map(str, NAMES))}")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # data starts 8-byte aligned, as the format asks
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for tensor in contiguous.values():
            if tensor.numel():
                f.write(_writable_bytes(tensor))
    return read_header(path)
