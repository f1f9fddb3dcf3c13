"""A rank's names as bytes another rank can load: how a warm pool's heal copies a live replica.

One pickler serves twice. A value's *fingerprint* is its pickle with every tensor replaced by
a hash of its bytes: ranks holding equal values get equal fingerprints, so the heal copies
only what every surviving rank holds alike. A *pack* of values is their pickle with the
tensors beside it (the small ones' bytes in one buffer, the big ones as they are), sent rank to
rank (never through the kernel).

Objects that belong to one rank (``launch/handoff/rank_identity.py``) travel as what they are for the
receiving rank: the fields saying where a state or a sharded sampler stands become the
receiver's, this rank's device becomes the receiver's, the default process group becomes the
receiver's, and a DDP wrapper travels as its module and settings, to be built anew around it
(:func:`rebuild_ddps`: DDP's constructor is a collective, so every rank builds its wrappers in
the order the values met them). What holds one rank's part of the state (an FSDP shard, a
DeepSpeed engine, a device mesh) or another group raises :class:`NotCarried`.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from notebook_accel.launch.handoff.rank_identity import (
    PLACE_FIELDS,
    SHARDED,
    rank_bound_kind,
    rank_bound_types,
)

_DDP_EXTRAS = ("_is_accelerate_prepared",)  # what prepare adds to a wrapper, kept on the new one


class NotCarried(pickle.PicklingError):
    """A value holds what only its own rank can have (a shard, a group other than the default)."""


class ShardsNotCarried(NotCarried):
    """A value holds one rank's part of a sharded state (an FSDP shard, a DeepSpeed engine)."""


def lost_shards(why: str) -> bool:
    """Whether a name's reason for staying behind (the heal's ``uncopyable``) is a sharded state."""
    return why.startswith(f"{ShardsNotCarried.__name__}:")


@dataclass(frozen=True)
class Place:
    """Where a rank stands: what a carried object's place fields become on the receiver."""

    rank: int
    local_rank: int
    device: torch.device


def own_place() -> Place:
    """This process's place (the torchrun environment, its device kind's device)."""
    from notebook_accel.runtime.state import PartialState

    state = PartialState()
    return Place(state.process_index, state.local_process_index, state.device)


_BIG = 1 << 20  # bytes: a tensor this big travels on its own, straight into its new storage


@dataclass
class _Tensors:
    """The tensors a pickle met, by ``mode``: ``hash`` (a fingerprint: each one's bytes hashed),
    ``walk`` (nothing compared nor copied: a lone survivor's fingerprint, a pack that only
    learns the wrappers' order), or ``pack`` (a copy:
    small ones laid out in one buffer, big ones kept to be sent one by one, never copied)."""

    mode: str
    ids: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # id(tensor) -> its persistent id
    small: list[torch.Tensor] = field(default_factory=list)
    size: int = 0
    big: list[torch.Tensor] = field(default_factory=list)
    keep: list[torch.Tensor] = field(default_factory=list)  # the ids above stay valid meanwhile

    def add(self, tensor: torch.Tensor, place: Place) -> tuple[Any, ...]:
        known = self.ids.get(id(tensor))
        if known is not None:
            return known
        data = tensor.detach()
        if self.mode == "walk":
            where: Any = len(self.ids)
        elif self.mode == "hash":
            raw = data.cpu().contiguous().reshape(-1).view(torch.uint8)
            where = hashlib.blake2b(raw.numpy().data).hexdigest()
        elif data.numel() * data.element_size() >= _BIG:
            where = ("big", len(self.big))
            self.big.append(data.contiguous())
        else:
            raw = data.cpu().contiguous().reshape(-1).view(torch.uint8)
            where = ("small", self.size, raw.numel())
            self.small.append(raw)
            self.size += raw.numel()
        on_device = data.device == place.device and data.device.type != "cpu"
        pid = ("tensor", where, isinstance(tensor, torch.nn.Parameter), str(data.dtype),
               tuple(data.shape), tensor.requires_grad, on_device)
        self.ids[id(tensor)] = pid
        self.keep.append(tensor)
        return pid


@dataclass
class Packed:
    """Values ready to send: their pickle, the small tensors' bytes in one buffer, the big
    tensors themselves (in the order :func:`unpack` asks for them), and the DDP wrappers met."""

    meta: bytes
    small: torch.Tensor
    big: list[torch.Tensor]
    ddps: list[Any]


def _plain(tensor: torch.Tensor) -> bool:
    return (type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.layout == torch.strided
            and not tensor.is_meta and not tensor.is_quantized)


class _Pickler(cloudpickle.Pickler):
    def __init__(self, file: io.BytesIO, tensors: _Tensors, place: Place, ddps: list[Any]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors, self.place, self.ddps = tensors, place, ddps
        self.rank_bound = False  # the value held a rank-bound object: rebuilt, not only copied
        self._types = rank_bound_types()
        self._bound = tuple(cls for cls, _ in self._types)
        self._places = _place_rules()

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and _plain(obj):
            return self.tensors.add(obj, self.place)
        if type(obj) is torch.device and obj.type != "cpu" and obj == self.place.device:
            return ("own device",)
        return None

    def reducer_override(self, obj: Any) -> Any:
        if self._bound and isinstance(obj, self._bound):
            self.rank_bound = True
            return self._rank_bound(obj)
        return super().reducer_override(obj)

    def _rank_bound(self, obj: Any) -> Any:
        if isinstance(obj, DistributedDataParallel):
            self.ddps.append(obj)
            return _new_ddp, (), _ddp_state(obj), None, None, _fill_ddp
        if isinstance(obj, dist.ProcessGroup):
            if obj is not _default_group():
                raise NotCarried("a process group other than the default one (made for the old "
                                 "group's ranks)")
            return _default_group, ()
        kind = rank_bound_kind(obj, self._types)
        if kind in SHARDED:
            raise ShardsNotCarried(f"{kind}: each rank held its own part of it; " + _where_sharded_state_is())
        for cls, fields in self._places:
            if isinstance(obj, cls):
                state = {k: v for k, v in vars(obj).items() if k not in fields}
                return _blank, (type(obj),), (state, fields), None, None, _fill_place
        return super().reducer_override(obj)


def _where_sharded_state_is() -> str:
    """What brings a sharded state back: the newest snapshot, where one holds it."""
    from notebook_accel.checkpoint.snapshot_peers import held_step
    from notebook_accel.checkpoint.snapshots import newest_held

    in_memory = held_step()
    if in_memory is not None:
        return f"the peers' memory holds them (snapshot step {in_memory:,}; see below)"
    held = newest_held()
    if held is None:
        return "no snapshot holds them: prepare it again on every rank"
    return (f"the newest snapshot holds them (step {held.step:,}, {held.path.parent}): prepare it again on "
            "every rank, then accelerator.resume() goes on from that step")


def _place_rules() -> list[tuple[type, dict[str, str]]]:
    rules = []
    for module_name, attribute, fields in PLACE_FIELDS:
        cls = getattr(sys.modules.get(module_name), attribute, None)
        if isinstance(cls, type):
            rules.append((cls, fields))
    return rules


def _ddp_state(model: DistributedDataParallel) -> dict[str, Any]:
    """What a wrapper is built anew from: its module, constructor settings, bucket layout,
    communication hooks and what ``prepare`` added to it."""
    return {"module": model.module, "settings": _ddp_settings(model),
            "buckets": _bucket_layout(model), "hooks": list(model._comm_hooks),
            "extras": {k: v for k, v in vars(model).items() if k in _DDP_EXTRAS}}


def _ddp_settings(model: DistributedDataParallel) -> dict[str, Any]:
    """The constructor's arguments a wrapper was built with (its device ids are each rank's own)."""
    settings = {"dim": model.dim, "find_unused_parameters": model.find_unused_parameters,
                "gradient_as_bucket_view": model.gradient_as_bucket_view,
                "static_graph": model.static_graph,
                "bucket_cap_mb": model.bucket_bytes_cap / (1024 * 1024)}
    if hasattr(model, "forward_sync_buffers"):
        settings["forward_sync_buffers"] = model.forward_sync_buffers
    else:  # pragma: no cover - torch before forward_sync_buffers
        settings["broadcast_buffers"] = model.broadcast_buffers
    return settings


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # one heal's, per wrapper


def new_heal() -> None:
    """Forget what the last heal learnt about the wrappers (their layouts are rebuilt)."""
    _LAYOUTS.clear()


def _bucket_layout(model: DistributedDataParallel) -> list[list[int]]:
    """:func:`_read_layout`, once per wrapper and heal (reading it can allocate its buckets)."""
    if model not in _LAYOUTS:
        _LAYOUTS[model] = _read_layout(model)
    return _LAYOUTS[model]


def _read_layout(model: DistributedDataParallel) -> list[list[int]]:
    """Which parameters each of the wrapper's gradient buckets holds now (by their place in
    the reducer's list): after DDP's first iteration they follow the order gradients became
    ready, and a wrapper built anew must reduce with the same layout, or its sums round
    differently from the run it continues (and from ranks that kept theirs)."""
    params, sparse = model._build_params_for_reducer()
    ready = model._get_ddp_logging_data().get("prev_iteration_grad_ready_order_indices")
    order = [int(i) for i in str(ready).split(",")] if ready else []
    if sorted(order) == list(range(len(params))):  # a whole backward ran: the layout DDP
        # rebuilds (or rebuilt) from the order its gradients became ready
        config = getattr(model, "_bucket_config", None)
        limits = config.compute_bucket_size_limits(
            static_graph=model.static_graph, find_unused_parameters=model.find_unused_parameters,
        )[1] if config is not None else []
        if not limits:  # the reducer's own default: a small first bucket, then the cap
            first = getattr(config, "first_bucket_bytes_cap", dist._DEFAULT_FIRST_BUCKET_BYTES)
            limits = [first, model.bucket_bytes_cap]
        layout, _ = dist._compute_bucket_assignment_by_size(
            [params[i] for i in order], limits, [sparse[i] for i in order], order)
        return [list(bucket) for bucket in layout]
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for p in bucket.parameters()]
            for bucket in model.reducer._get_zeros_like_grad_buckets()]


def _build_ddp(module: torch.nn.Module, settings: dict[str, Any], layout: list[list[int]],
               place: Place) -> DistributedDataParallel:
    """A DDP wrapper around ``module`` for the current default group, its gradient buckets laid
    out as ``layout`` (DDP's constructor asks torch for a layout by size, then reverses it: it
    gets this one instead)."""
    device_ids = [place.local_rank] if place.device.type == "cuda" else None
    assign = dist._compute_bucket_assignment_by_size
    caps = [int(settings["bucket_cap_mb"] * 1024 * 1024)] * len(layout)

    def given(*args: Any, **kwargs: Any) -> tuple[list[list[int]], list[int]]:
        return list(reversed(layout)), list(reversed(caps))

    dist._compute_bucket_assignment_by_size = given
    try:
        return DistributedDataParallel(module, device_ids=device_ids, init_sync=False, **settings)
    finally:
        dist._compute_bucket_assignment_by_size = assign


# -- the receiving side: what the reductions above call ------------------------------------

_PLACE: list[Place] = []  # the receiver's place while a pack is loaded
_PENDING: list[tuple[DistributedDataParallel, dict[str, Any]]] = []  # wrappers to build


def _default_group() -> Any:
    return dist.distributed_c10d._get_default_group()


def _blank(cls: type) -> Any:
    return cls.__new__(cls)


def _fill_place(obj: Any, state: tuple[dict[str, Any], dict[str, str]]) -> None:
    values, fields = state
    vars(obj).update(values)
    place = _PLACE[-1]
    for name, what in fields.items():
        setattr(obj, name, getattr(place, what))


def _new_ddp() -> DistributedDataParallel:
    model = DistributedDataParallel.__new__(DistributedDataParallel)
    _PENDING.append((model, {}))
    return model


def _fill_ddp(model: DistributedDataParallel, state: dict[str, Any]) -> None:
    for slot, (pending, _) in enumerate(_PENDING):
        if pending is model:
            _PENDING[slot] = (model, state)


# -- the three uses ----------------------------------------------------------------------------

def fingerprint(value: Any, place: Place, tensors: _Tensors) -> tuple[str, bool]:
    """A digest equal on every rank that holds an equal ``value``, and whether it holds a
    rank-bound object (rebuilt for the new group rather than only copied).

    Args:
        tensors: :func:`hash_table`'s, shared by the calls of one heal (each tensor hashed once).
    Raises:
        NotCarried, and whatever pickling ``value`` raises: it cannot be copied.
    """
    sink = io.BytesIO()
    pickler = _Pickler(sink, tensors, place, [])
    pickler.dump(value)
    return hashlib.blake2b(sink.getvalue()).hexdigest(), pickler.rank_bound


def hash_table(compare: bool = True) -> _Tensors:
    """The tensor hashes one heal's fingerprints share (``compare=False``: a lone survivor's,
    which has nothing to compare with, hashes nothing)."""
    return _Tensors(mode="hash" if compare else "walk")


def pack(values: dict[str, Any], place: Place, send: bool = True) -> Packed:
    """``values`` ready to send to a new rank, and the DDP wrappers they hold in the order they
    were met (every survivor packs to learn that order, as :func:`rebuild_ddps` needs it;
    ``send=False``: only that, for a survivor that sends nothing, its tensors left alone)."""
    tensors, ddps, sink = _Tensors(mode="pack" if send else "walk"), [], io.BytesIO()
    _Pickler(sink, tensors, place, ddps).dump(values)
    small = torch.cat(tensors.small) if tensors.small else torch.empty(0, dtype=torch.uint8)
    return Packed(sink.getvalue(), small, tensors.big, ddps)


def unpack(meta: bytes, small: torch.Tensor, place: Place) -> tuple[dict[str, Any], list[Any],
                                                                     list[torch.Tensor]]:
    """What :func:`pack` made, for this rank (``place``): the values, the DDP wrappers still to
    build (:func:`rebuild_ddps`) in the order the packing rank met them, and the big tensors,
    allocated where they belong, whose bytes are still to be received into them (in order)."""
    loaded: dict[Any, torch.Tensor] = {}
    big: dict[int, torch.Tensor] = {}

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            if pid == ("own device",):
                return place.device
            _, where, is_param, dtype, shape, requires_grad, on_device = pid
            tensor = loaded.get(where)
            if tensor is None:
                kind = getattr(torch, dtype[6:])
                device = place.device if on_device else torch.device("cpu")
                if where[0] == "big":
                    data = big[where[1]] = torch.empty(shape, dtype=kind, device=device)
                else:
                    offset, size = where[1:]
                    data = small[offset:offset + size].clone().view(kind).reshape(shape).to(device)
                tensor = (torch.nn.Parameter(data, requires_grad=requires_grad) if is_param
                          else data.requires_grad_(requires_grad))
                loaded[where] = tensor
            return tensor

    _PLACE.append(place)
    _PENDING.clear()
    try:
        values = Unpickler(io.BytesIO(meta)).load()
        return values, list(_PENDING), [big[index] for index in sorted(big)]
    finally:
        _PLACE.pop()
        _PENDING.clear()


def rebuild_ddps(wrappers: list[Any], place: Place) -> int:
    """Build every DDP wrapper anew for the current default group, in place (the objects keep
    their identity, so the user's names and the Accelerator's lists hold the new ones), in the
    order given: a survivor's own wrappers as :func:`pack` met them, a new rank's pending ones
    as :func:`unpack` returned them. The interrupted step's gradients are dropped. Returns how
    many were built."""
    for item in wrappers:
        # a new rank's: (placeholder, carried state); a survivor's: its own wrapper
        model, state = item if isinstance(item, tuple) else (item, _ddp_state(item))
        module, hooks, extras = state["module"], state["hooks"], state["extras"]
        for parameter in module.parameters():
            parameter.grad = None
        built = _build_ddp(module, state["settings"], state["buckets"], place)
        vars(model).clear()  # a survivor's old reducer goes here, with the old group's last hold
        vars(model).update(vars(built), **extras)
        for hook, hook_state in hooks:
            if getattr(hook_state, "process_group", None) is not None:
                hook_state.process_group = _default_group()
            model.register_comm_hook(hook_state, hook)
    return len(wrappers)
