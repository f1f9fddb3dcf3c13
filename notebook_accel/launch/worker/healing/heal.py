"""A warm pool's heal, run on every rank at once: survivors and the ranks that replace the dead.

Every rank leaves the group a dead peer broke and meets the others over a fresh store
(``runtime.state.rejoin_process_group``). The survivors fingerprint their names
(``replicas.fingerprint``: a hash per tensor, each survivor its own, in parallel); a name is
copied to the new ranks when every survivor holds it alike, from the lowest surviving rank,
rank to rank over the new group (never through the kernel). Random states travel the same
way when the survivors' are alike. Then every rank builds its DDP wrappers anew for the new
group, in one order, and :class:`HealReport` says what was copied, rebuilt and left behind.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from notebook_accel import contract
from notebook_accel.checkpoint import snapshot_peers, snapshots
from notebook_accel.launch.worker import namespace
from notebook_accel.launch.worker.healing import replicas

_RANDOM = "\0random states"  # the pack's key for them: never a Python name


class HealRefused(RuntimeError):
    """The survivors' rank-bound objects differ: healing would mix states."""


@dataclass(frozen=True)
class HealReport:
    """What one heal did, the same on every rank.

    Attributes:
        source: the surviving rank the new ranks copied from.
        restored: names holding state copied from it (plain values, tensors, models...; modules
            and imported code are copied too, unnamed).
        rebuilt: names holding rank-bound objects (an Accelerator, a prepared model, optimizer
            or loader) copied and built anew for the new group.
        differing: names the survivors hold with different values (each rank its own): the new
            ranks do not get them.
        uncopyable: name -> why it cannot be copied (a generator, an FSDP shard...).
        random_states: the survivors' random states were alike and were copied.
        wrappers: DDP wrappers built anew on each rank.
        survivors: how many ranks lived (with one, every name it holds counts as alike).
        seconds: the heal's phases on this rank (``meet``, ``fingerprints``, ``copy``,
            ``rebuild``), for ``benchmarks/heal.py``.
        peers: where sharded state was lost, what the peers' memory brought back of the newest
            snapshot, or why it could not (``snapshot_peers.heal``); "" otherwise.
    """

    source: int
    survivors: int
    restored: tuple[str, ...]
    rebuilt: tuple[str, ...]
    differing: tuple[str, ...]
    uncopyable: dict[str, str]
    random_states: bool
    wrappers: int
    seconds: dict[str, float] = field(default_factory=dict)
    peers: str = ""


def heal(port: int, fresh: tuple[int, ...]) -> HealReport:
    """Run on every rank of the pool: ``fresh`` are the ranks that just replaced dead ones, and
    ``port`` the store every rank meets at now."""
    os.environ[contract.MASTER_PORT] = str(port)
    rank, world = int(os.environ[contract.RANK]), int(os.environ[contract.WORLD_SIZE])
    from notebook_accel.runtime.state import rejoin_process_group

    clock = _Phases()
    replicas.new_heal()
    snapshots.leave_old_group()  # their writes in flight may wait for a dead rank forever
    rejoin_process_group(rank, world)
    clock.end("meet")
    place = replicas.own_place()
    new = rank in fresh
    survivors = [r for r in range(world) if r not in fresh]
    mine = {} if new else _fingerprints(place, compare=len(survivors) > 1)
    clock.end("fingerprints")
    every: list[Any] = [None] * world
    dist.all_gather_object(every, (rank, mine, namespace.copies(), namespace.imported()))
    source = survivors[0]
    alike, differing, uncopyable = _compare([every[r][1] for r in survivors])
    mixed = [name for name in differing if every[source][1][name][1]]
    if mixed:  # every rank sees the same and refuses alike
        raise HealRefused(f"the surviving ranks hold different {', '.join(mixed)} (they stopped "
                          "at different steps): no copy of them can be trusted")
    # one survivor tells nothing about whether its generators match the others' (Python's own
    # are seeded anew in every forked process): a new rank then starts from fresh ones
    random_alike = _RANDOM in alike and len(survivors) > 1
    names = [name for name in alike if name != _RANDOM]
    # the copy goes over a group of its own, so that the default group's collective count
    # stays the same on every rank (the pool compares them after each run)
    copying = dist.new_group([source, *fresh])
    if new:
        values, wrappers = _receive(source, place, copying)
        namespace.restore({n: v for n, v in values.items() if n != _RANDOM}, every[source][2])
        if random_alike:
            _set_random(values[_RANDOM])
        _adopt_states(values.values())
        copied = values
    else:
        chosen = {name: namespace.NAMESPACE[name] for name in names}
        if random_alike:
            chosen[_RANDOM] = _random_states()
        copied = chosen
        packed = replicas.pack(chosen, place, send=rank == source)
        wrappers = packed.ddps
        if rank == source:
            _send(packed, source, copying)
    dist.destroy_process_group(copying)
    _rejoin_snapshots(copied.values())
    clock.end("copy")
    counts: list[Any] = [None] * world
    dist.all_gather_object(counts, len(wrappers))
    if len(set(counts)) > 1:
        raise RuntimeError(f"the ranks hold different numbers of DDP models to rebuild ({counts}): "
                           "their copies do not match")
    built = replicas.rebuild_ddps(wrappers, place)
    clock.end("rebuild")
    shards_lost = any(replicas.lost_shards(why) for why in uncopyable.values())  # (alike on every rank)
    peers = snapshot_peers.heal(fresh) if shards_lost else ""
    clock.end("peers")
    rebuilt = tuple(n for n in names if every[source][1][n][1])
    code = set(every[source][3])  # modules and imported code: copied, not worth a word
    restored = tuple(n for n in names if n not in rebuilt and n not in code)
    return HealReport(source=source, survivors=len(survivors), restored=restored,
                      rebuilt=rebuilt, differing=differing, uncopyable=uncopyable,
                      random_states=random_alike, wrappers=built, seconds=clock.seconds, peers=peers)


class _Phases:
    """Seconds per phase, each from the end of the last."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def end(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase], self._last = now - self._last, now


def _fingerprints(place: replicas.Place, compare: bool) -> dict[str, tuple[str | None, Any]]:
    """name -> (digest, holds a rank-bound object), or (None, why it cannot be copied)
    (``compare=False``: a lone survivor's, its tensors not hashed)."""
    tensors = replicas.hash_table(compare)
    found: dict[str, tuple[str | None, Any]] = {}
    for name in namespace.names():
        try:
            found[name] = replicas.fingerprint(namespace.NAMESPACE[name], place, tensors)
        except Exception as error:  # noqa: BLE001 - any value pickling refuses stays behind, said
            found[name] = (None, _why(error))
    try:
        found[_RANDOM] = replicas.fingerprint(_random_states(), place, tensors)
    except Exception as error:  # noqa: BLE001  pragma: no cover - plain types
        found[_RANDOM] = (None, _why(error))
    return found


def _why(error: Exception) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _compare(prints: list[dict[str, tuple[str | None, Any]]]) -> tuple[
        list[str], tuple[str, ...], dict[str, str]]:
    """Which names every survivor holds alike (sorted), which differ, which cannot be copied."""
    first, rest = prints[0], prints[1:]
    alike, differing, uncopyable = [], [], {}
    for name in sorted(first):
        digest, why = first[name]
        if digest is None:
            uncopyable[name] = why
        elif all(name in other and other[name][0] == digest for other in rest):
            alike.append(name)
        else:
            differing.append(name)
    return alike, tuple(n for n in differing if n != _RANDOM), {
        n: w for n, w in uncopyable.items() if n != _RANDOM}


def _random_states() -> dict[str, Any]:
    from notebook_accel.checkpoint.random_states import capture
    from notebook_accel.runtime.state import PartialState

    return capture(PartialState().device_kind)


def _set_random(states: dict[str, Any]) -> None:
    from notebook_accel.checkpoint.random_states import restore
    from notebook_accel.runtime.state import PartialState

    restore(states, PartialState().device_kind)


def _wire_device() -> torch.device:
    from notebook_accel.runtime.state import PartialState

    return PartialState().device_kind.collective_device()


def _send(packed: replicas.Packed, source: int, group: Any) -> None:
    """The source's side of the copy: sizes, the pickle, the small tensors' buffer, then each big
    tensor as it is (no copy on the CPU), in the order the new ranks receive them."""
    wire = _wire_device()
    sizes = torch.tensor([len(packed.meta), packed.small.numel()], dtype=torch.int64, device=wire)
    dist.broadcast(sizes, source, group=group)
    dist.broadcast(torch.frombuffer(bytearray(packed.meta), dtype=torch.uint8).to(wire), source,
                   group=group)
    if packed.small.numel():
        dist.broadcast(packed.small.to(wire), source, group=group)
    for tensor in packed.big:
        dist.broadcast(_bytes_of(tensor).to(wire), source, group=group)


def _receive(source: int, place: replicas.Place, group: Any) -> tuple[dict[str, Any], list[Any]]:
    """A new rank's side of the copy: the values, with every big tensor received straight into
    the storage it keeps; and the DDP wrappers still to build."""
    wire = _wire_device()
    sizes = torch.empty(2, dtype=torch.int64, device=wire)
    dist.broadcast(sizes, source, group=group)
    meta = torch.empty(int(sizes[0]), dtype=torch.uint8, device=wire)
    dist.broadcast(meta, source, group=group)
    small = torch.empty(int(sizes[1]), dtype=torch.uint8, device=wire)
    if small.numel():
        dist.broadcast(small, source, group=group)
    values, wrappers, big = replicas.unpack(meta.cpu().numpy().tobytes(), small.cpu(), place)
    for tensor in big:
        target = _bytes_of(tensor)
        landing = target if target.device == wire else torch.empty_like(target, device=wire)
        dist.broadcast(landing, source, group=group)
        if landing is not target:
            target.copy_(landing)
    return values, wrappers


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as bytes (a view: filling it fills the tensor)."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def _rejoin_snapshots(values: Any) -> None:
    """The copied Accelerators' snapshot schedules make their writer groups in the new group
    (every rank, in the names' order, which is the same on every rank)."""
    from notebook_accel.accelerator import Accelerator

    seen: set[int] = set()
    for value in values:
        if isinstance(value, Accelerator) and id(value) not in seen and value._snapshots is not None:
            seen.add(id(value))
            value._snapshots.rejoin()


def _adopt_states(values: Any) -> None:
    """Each copied Accelerator sets up what belongs to this process (``Accelerator._arrived``:
    the states ``AcceleratorState()`` answers with, its snapshot schedule's hooks)."""
    from notebook_accel.accelerator import Accelerator

    for value in values:
        if isinstance(value, Accelerator):
            value._arrived()
