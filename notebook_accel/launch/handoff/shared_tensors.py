"""Big CPU tensors reach local workers through shared memory, not one pickled copy each.

While a payload is pickled, each CPU tensor of at least ``SHARE_BYTES`` has its storage
copied once into an anonymous memory file of the kernel (``memfd_create``); the pickle
holds only where to find it. A worker maps that file copy-on-write
(``/proc/<kernel pid>/fd/<n>``, ``MAP_PRIVATE``): every worker reads the same pages, and
a worker that writes to its tensor gets private copies of the pages it writes, so each
still has a value of its own, as with a pickled copy. Nothing is left behind: the files
have no name, and the kernel closes them when the call ends (the workers' mappings keep
what they still use).

Linux only, for workers on this machine; elsewhere tensors are pickled as usual.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
from typing import Any

SHARE_BYTES = 8 << 20  # smaller tensors are cheaper to pickle than to map


class SharedTensors:
    """The memory files of one call's payload; :meth:`close` when the call has ended."""

    def __init__(self) -> None:
        self._files: dict[int, tuple[int, int]] = {}  # storage address -> (fd, bytes)

    def reduce(self, tensor: Any) -> tuple | None:
        """A pickle reduction of ``tensor`` through shared memory, or None to pickle it as usual."""
        torch = sys.modules.get("torch")
        if (torch is None or type(tensor) is not torch.Tensor or tensor.device.type != "cpu"
                or tensor.layout is not torch.strided or tensor.is_quantized
                or not hasattr(os, "memfd_create")):
            return None
        storage = tensor.untyped_storage()
        size = storage.nbytes()
        if size < SHARE_BYTES:
            return None
        key = storage.data_ptr()
        if key not in self._files:  # views of one storage share one file
            self._files[key] = (_copy_to_memory_file(torch, storage, size), size)
        fd, _ = self._files[key]
        return attach_tensor, (os.getpid(), fd, size, tensor.dtype, tuple(tensor.shape),
                               tuple(tensor.stride()), tensor.storage_offset(),
                               tensor.requires_grad)

    def close(self) -> None:
        """Close the files (workers keep the pages they mapped)."""
        for fd, _ in self._files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files.clear()

    def __enter__(self) -> SharedTensors:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _copy_to_memory_file(torch: Any, storage: Any, size: int) -> int:
    fd = os.memfd_create("notebook-accel-tensor", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as memory:
            target = torch.frombuffer(memory, dtype=torch.uint8)
            target.copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
            del target
    except BaseException:
        os.close(fd)
        raise
    return fd


def attach_tensor(pid: int, fd: int, size: int, dtype: Any, shape: tuple, stride: tuple,
                  offset: int, requires_grad: bool) -> Any:
    """In a worker: the tensor, mapped copy-on-write from the kernel's memory file."""
    import torch

    with open(f"/proc/{pid}/fd/{fd}", "rb") as file:
        memory = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY)
    storage = torch.frombuffer(memory, dtype=torch.uint8).untyped_storage()  # keeps it mapped
    tensor = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
    return tensor.requires_grad_(requires_grad)
