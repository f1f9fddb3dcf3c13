"""Device keys of a device map (``0``, ``1``, ``"cpu"``, ``"disk"``) and the seam to the hardware.

GPU memory and GPU placement go through one ``Devices`` object, so the planner and the dispatcher can
be exercised on a CPU-only machine with a fake set of GPUs (``use_devices``), and for real on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Union

import torch

DeviceKey = Union[int, str]  # noqa: UP007 - an alias used at runtime by isinstance checks
TIERS = ("cpu", "disk")


def normalize_device(device: DeviceKey | torch.device) -> DeviceKey:
    """``"cuda:1"`` / ``torch.device("cuda", 1)`` / ``1`` -> ``1``; ``"cpu"`` / ``"disk"`` as they are.

    Raises:
        ValueError: for anything else, naming the value and the accepted forms.
    """
    if isinstance(device, torch.device):
        device = str(device)
    if isinstance(device, bool):
        raise ValueError(f"device {device!r} is not a device; use a GPU index, 'cuda:N', 'cpu' or 'disk'")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"GPU index {device} is negative; use 0, 1, ...")
        return device
    if isinstance(device, str):
        if device in TIERS:
            return device
        if device == "cuda":
            return 0
        if device.startswith("cuda:") and device[5:].isdigit():
            return int(device[5:])
        if device.isdigit():
            return int(device)
    raise ValueError(f"device {device!r} is not one of: a GPU index (0, 1, ...), 'cuda:N', 'cpu', 'disk'")


def device_order(key: DeviceKey) -> tuple[int, int]:
    """Sort key: GPUs by index, then cpu, then disk."""
    if isinstance(key, int):
        return (0, key)
    return (1 + TIERS.index(key), 0)


class Devices:
    """The real hardware: CUDA GPUs through torch."""

    def gpu_count(self) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def gpu_free_memory(self, index: int) -> int:
        return torch.cuda.mem_get_info(index)[0]

    def torch_device(self, key: DeviceKey) -> torch.device:
        """Where tensors planned for ``key`` live (disk-planned tensors have no device of their own)."""
        if key == "disk":
            raise ValueError("'disk' is a storage tier, not a device tensors run on")
        return torch.device("cuda", key) if isinstance(key, int) else torch.device(key)


def check_gpus(device_map: Mapping[str, DeviceKey]) -> None:
    """Raise ``ValueError`` when ``device_map`` names a GPU this machine (or seam) lacks."""
    count = current_devices().gpu_count()
    missing = sorted({d for d in device_map.values() if isinstance(d, int) and d >= count})
    if missing:
        raise ValueError(
            f"device_map uses GPU(s) {missing} but this machine has {count} GPU(s); "
            "use 'cpu'/'disk' there, or plan with max_memory for the GPUs present"
        )


_current: list[Devices] = [Devices()]


def current_devices() -> Devices:
    """The ``Devices`` in use (the real hardware unless a test swapped it with ``use_devices``)."""
    return _current[-1]


@contextlib.contextmanager
def use_devices(devices: Devices) -> Iterator[Devices]:
    """Plan and place through ``devices`` inside the block (the test seam)."""
    _current.append(devices)
    try:
        yield devices
    finally:
        _current.pop()
