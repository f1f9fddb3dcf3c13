"""Where each piece of a model goes: ``infer_auto_device_map`` and the named strategies."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from notebook_accel._peer_paths import peer_logger
from notebook_accel.big_model.devices import DeviceKey, normalize_device
from notebook_accel.big_model.memory import (
    as_dtype,
    get_balanced_memory,
    get_max_memory,
    tensor_bytes,
)

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
logger = peer_logger(__name__)


def tied_parameter_groups(model: nn.Module) -> list[list[str]]:
    """Names that share one parameter object (tied weights), one list per shared parameter."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def main_device(devices: Iterable[DeviceKey]) -> DeviceKey:
    """The device offloaded pieces run on: the first GPU used, else the CPU."""
    gpus = [d for d in devices if isinstance(d, int)]
    return min(gpus) if gpus else "cpu"


def offload_tiers(devices: Iterable[DeviceKey]) -> set[DeviceKey]:
    """Tiers whose pieces are moved to the main device to run: disk, and the CPU when a GPU runs."""
    return {"disk"} if main_device(devices) == "cpu" else {"cpu", "disk"}


def _within(name: str, prefix: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


class _Plan:
    """One placement pass: walk the module tree in order, fill devices, split what does not fit."""

    def __init__(self, model, budgets, no_split, dtype, special_dtypes, offload_buffers, reserve, fallback=False):
        self.model, self.no_split, self.offload_buffers = model, no_split, offload_buffers
        self.fallback = fallback  # a GPU the walk would leave empty takes the first piece that fits it
        self.left_empty: list[DeviceKey] = []
        # a device with no budget takes nothing (and must not make pieces split trying it)
        self.devices = [d for d in budgets if d != "disk" and budgets[d] > 0] + ["disk"]
        self.budgets = {**budgets, "disk": float("inf")}
        self.main = main_device(self.devices)
        self.offloaded = offload_tiers(self.devices)
        self.reserve = reserve
        self.used = dict.fromkeys(self.devices, 0)
        self.assigned: dict[str, DeviceKey] = {}
        self.pointer = 0
        self.modules = dict(model.named_modules())
        # name -> (identity, bytes once loaded, is buffer), every name of a shared tensor listed
        self.tensors: dict[str, tuple[int, int, bool]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            dt = (special_dtypes or {}).get(name, dtype)
            self.tensors[name] = (id(param), tensor_bytes(param, dt), False)
        for name, buf in model.named_buffers(remove_duplicate=False):
            dt = (special_dtypes or {}).get(name, dtype)
            self.tensors[name] = (id(buf), tensor_bytes(buf, dt), True)
        self.partners: dict[int, list[str]] = {}
        for names in tied_parameter_groups(model):
            self.partners[self.tensors[names[0]][0]] = names

    def run(self) -> dict[str, DeviceKey]:
        queue: deque[tuple[str, nn.Module | None]] = deque([("", self.model)])
        while queue:
            name, module = queue.popleft()
            if self._covered(name):
                continue
            if module is not None and any(_within(k, name) and k != name for k in self.assigned):
                queue.extendleft(reversed(self._pieces(name, module)))
                continue
            units = [name, *self._tie_partners(name)]
            weights, buffers = self._bytes(units)
            for index in range(self.pointer, len(self.devices)):
                device = self.devices[index]
                stays_here = device not in self.offloaded or self.offload_buffers
                cost = weights + (buffers if stays_here else 0)
                room = self.budgets[device] - self.used[device] - self.reserve.get(device, 0)
                if cost <= room:
                    if self._fill_skipped(index, [(name, module), *queue]):
                        queue.appendleft((name, module))  # placed again, around what the GPU took
                        break
                    self._assign(units, device, cost, 0 if stays_here else buffers)
                    break
                if index == self.pointer and self._splittable(module):
                    queue.extendleft(reversed(self._pieces(name, module)))
                    break
        return self.assigned

    def _fill_skipped(self, index: int, remaining: list[tuple[str, nn.Module | None]]) -> bool:
        """Before a piece goes past empty GPUs: note them, or (``fallback``) give the first one the
        first piece, breadth-first among ``remaining``, that fits it; True when one was given."""
        for device in self.devices[self.pointer:index]:
            if not isinstance(device, int) or self.used[device] or device in self.left_empty:
                continue
            if self.fallback:
                room = self.budgets[device] - self.reserve.get(device, 0)
                queue = deque(remaining)
                while queue:
                    name, module = queue.popleft()
                    if self._covered(name):
                        continue
                    units = [name, *self._tie_partners(name)]
                    weights, buffers = self._bytes(units)
                    if weights + buffers <= room and not any(_within(k, name) for k in self.assigned):
                        self._assign(units, device, weights + buffers, 0)
                        return True
                    if module is not None and self._splittable(module):
                        queue.extend(self._pieces(name, module))
            self.left_empty.append(device)
        return False

    def _assign(self, units: list[str], device: DeviceKey, cost: int, main_cost: int) -> None:
        for unit in units:
            self.assigned[unit] = device
        self.used[device] += cost
        self.used[self.main] += main_cost
        if device != "disk":  # a full CPU budget still takes later pieces that fit (peer: #3041)
            self.pointer = self.devices.index(device)

    def _covered(self, name: str) -> bool:
        return any(_within(name, prefix) for prefix in self.assigned)

    def _splittable(self, module: nn.Module | None) -> bool:
        return (
            module is not None
            and type(module).__name__ not in self.no_split
            and next(module.children(), None) is not None
        )

    def _pieces(self, name: str, module: nn.Module) -> list[tuple[str, nn.Module | None]]:
        dot = f"{name}." if name else ""
        direct = [(dot + n, None) for n, _ in module.named_parameters(recurse=False)]
        direct += [(dot + n, None) for n, _ in module.named_buffers(recurse=False)]
        return direct + [(dot + n, child) for n, child in module.named_children()]

    def _tensor_names(self, unit: str) -> list[str]:
        return [n for n in self.tensors if _within(n, unit)]

    def _tie_partners(self, name: str) -> list[str]:
        """Units outside ``name`` that share a parameter with it: they must land on its device."""
        found: list[str] = []
        for tensor in self._tensor_names(name):
            for other in self.partners.get(self.tensors[tensor][0], ()):
                if _within(other, name):
                    continue
                unit = self._unit_of(other)
                if unit not in found and not self._covered(unit):
                    found.append(unit)
        return found

    def _unit_of(self, tensor: str) -> str:
        """The smallest piece holding ``tensor`` that is placed whole: its outermost no-split
        ancestor, else the module owning it directly."""
        parts = tensor.split(".")
        for end in range(1, len(parts)):
            prefix = ".".join(parts[:end])
            if type(self.modules[prefix]).__name__ in self.no_split:
                return prefix
        return ".".join(parts[:-1])

    def _bytes(self, units: list[str]) -> tuple[int, int]:
        """(weights, buffers) bytes of ``units`` together, each shared tensor once."""
        seen: dict[int, tuple[int, bool]] = {}
        for unit in units:
            for tensor in self._tensor_names(unit):
                identity, size, is_buffer = self.tensors[tensor]
                seen[identity] = (size, is_buffer)
        weights = sum(size for size, is_buffer in seen.values() if not is_buffer)
        return weights, sum(size for size, is_buffer in seen.values() if is_buffer)


def _ordered(model: nn.Module, assigned: Mapping[str, DeviceKey], clean: bool) -> dict[str, DeviceKey]:
    """The plan in module order; with ``clean``, a module whose pieces share one device is one entry."""

    def collect(name: str, module: nn.Module) -> list[tuple[str, DeviceKey]]:
        if name in assigned:
            return [(name, assigned[name])]
        dot = f"{name}." if name else ""
        entries = [
            (dot + n, assigned[dot + n])
            for n, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            if dot + n in assigned
        ]
        for child_name, child in module.named_children():
            entries += collect(dot + child_name, child)
        if clean and entries and len({device for _, device in entries}) == 1:
            return [(name, entries[0][1])]
        return entries

    return dict(collect("", model))


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype] | None = None,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, DeviceKey]:
    """Plan where each module of ``model`` goes: GPUs in order, then the CPU, then disk.

    A module that does not fit where the plan stands is split into its children, unless its class
    is in ``no_split_module_classes`` (e.g. a transformer block with a residual connection), then it
    goes to the next device. Pieces that fall to disk do not close the CPU: later pieces that fit in
    what is left of the CPU budget still go there. Tied parameters land on one device. When anything
    is offloaded, the device that runs offloaded pieces keeps room for the largest of them.

    Args:
        model: usually built under ``init_empty_weights`` (only shapes are read).
        max_memory: budget per device, e.g. ``{0: "10GiB", 1: "10GiB", "cpu": "30GiB"}``;
            default: what each device has free. GPU keys need no GPU here: the plan is arithmetic.
        no_split_module_classes: class names never split across devices.
        dtype: the dtype floating-point weights will be loaded in.
        special_dtypes: per-tensor dtypes overriding ``dtype``.
        clean_result: merge modules whose pieces all share a device into one entry.
        offload_buffers: offload buffers with their module (default: buffers of offloaded modules
            stay on the main device, and count there).
        fallback_allocation: a GPU that no piece fits in walking order (a large first block) takes
            the first piece, breadth-first among those left, that fits it (the peer's switch);
            without it such a GPU stays empty, with a warning naming it.

    Returns:
        ``{"embed": 0, "layers.0": 0, ..., "layers.30": "cpu", "head": "disk"}`` in module order.
    """
    budgets = get_max_memory(max_memory)
    no_split = set(no_split_module_classes or ())
    dtype = as_dtype(dtype)
    reserve: dict[DeviceKey, int] = {}
    for _ in range(8):  # the reserve only grows; a few rounds reach the fixed point
        plan = _Plan(model, budgets, no_split, dtype, special_dtypes, offload_buffers, reserve, fallback_allocation)
        assigned = plan.run()
        largest = max(
            (plan._bytes([unit])[0] for unit, dev in assigned.items() if dev in plan.offloaded),
            default=0,
        )
        if largest <= reserve.get(plan.main, 0):
            break
        reserve = {plan.main: largest}
    for device in plan.left_empty:
        logger.warning(f"device {device} gets no module of the model: insufficient memory ({budgets[device]} bytes) "
                       "for the next piece in order; fallback_allocation=True gives it the first piece that fits")
    return _ordered(model, assigned, clean_result)


def resolve_device_map(
    model: nn.Module,
    device_map: str | Mapping[str, DeviceKey | torch.device],
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    dtype: torch.dtype | str | None = None,
    offload_buffers: bool = False,
) -> dict[str, DeviceKey]:
    """A strategy name (``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"``), a single
    device, or an explicit ``{module name: device}`` dict -> an explicit plan.

    Raises:
        ValueError: for an unknown strategy or device, naming the valid ones.
    """
    if isinstance(device_map, Mapping):
        return {name: normalize_device(device) for name, device in device_map.items()}
    if isinstance(device_map, str) and device_map in STRATEGIES:
        if device_map == "sequential":
            budgets = get_max_memory(max_memory)
        else:
            budgets = get_balanced_memory(
                model, max_memory, no_split_module_classes, dtype,
                low_zero=device_map == "balanced_low_0",
            )
        return infer_auto_device_map(
            model, budgets, no_split_module_classes, dtype, offload_buffers=offload_buffers
        )
    try:
        return {"": normalize_device(device_map)}
    except ValueError:
        raise ValueError(
            f"device_map {device_map!r} is not one of {', '.join(map(repr, STRATEGIES))}, a device "
            "(0, 'cuda:1', 'cpu', 'disk') or a dict {module name: device}"
        ) from None
