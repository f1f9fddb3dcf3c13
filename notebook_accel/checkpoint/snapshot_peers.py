"""Snapshots kept in the peers' memory, for a warm pool's heal (``snapshot_every(in_peers=True)``, the
launch option ``snapshot_in_peers``).

At each snapshot, in the background job that writes it, every rank keeps its part (the host copy
already made: its shards as plain tensors, its random states; rank 0's also the shared files and the
snapshot's metadata), serialised once, and sends a copy to its neighbour, rank ``(r + 1) % world``,
over the snapshot's own gloo group. Each rank then holds two parts: its own and rank
``(r - 1) % world``'s, so the memory cost per rank is its part plus its neighbour's, about twice
its host copy (``held_bytes``).

When a heal replaces ranks whose sharded state is lost (``heal``, run on every rank): every rank
whose part of the newest whole snapshot is not its own gets it from its neighbour's memory, and
every rank gets rank 0's shared files; nothing is read from disk. The sharded objects themselves
(FSDP modules, their device meshes) were bound to the group the heal replaced, so they are prepared
again on every rank, and ``resume()`` then loads this snapshot from memory (``take_restored``):
the step, the loaders' positions, the random states, as from disk. Two neighbouring ranks lost
together lose a part (the one the later rank held): then the snapshot on disk is named instead.
The parts travel between this run's own processes only, so they are read back with pickle.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from notebook_accel.checkpoint import state_parts
from notebook_accel.checkpoint.training_state import StateFile


@dataclass
class Part:
    """One rank's part of one snapshot, as held in memory.

    Attributes:
        step: the snapshot's optimizer step.
        directory: the snapshot directory it belongs to (what ``resume()`` is asked for).
        rank: whose part it is.
        blob: the serialised part (``files``: name -> (content, safetensors); ``shards``: a sharded
            part's name -> this rank's own shards; ``meta``: rank 0's snapshot metadata).
    """

    step: int
    directory: str
    rank: int
    blob: bytes = field(repr=False)

    def content(self) -> dict[str, Any]:
        return torch.load(io.BytesIO(self.blob), map_location="cpu", weights_only=False)


@dataclass
class Restored:
    """What a heal brought back for ``resume()``: this rank's files and shards, rank 0's shared files
    and the snapshot's metadata."""

    step: int
    directory: str
    files: list[StateFile]
    shards: dict[str, Any]
    meta: dict[str, Any]


_own: Part | None = None
_neighbour: Part | None = None  # rank (r - 1) % world's
_restored: Restored | None = None


def keep(parts: list[state_parts.Part], meta: dict[str, Any], step: int, directory: str, group: Any) -> None:
    """Keep this rank's ``parts`` of the snapshot of ``step`` and swap a copy with the neighbours
    (every rank, in the snapshot's background job; ``group``: the snapshot's gloo group)."""
    global _own, _neighbour
    rank, world = dist.get_rank(), dist.get_world_size()
    content = {"files": {p.name: (p.obj, p.safetensors) for p in parts if isinstance(p, StateFile)},
               "shards": {p.name: state_parts.own_shards(p.state) for p in parts
                          if isinstance(p, state_parts.ShardedState)},
               "meta": {**meta, "saved_at": time.time()} if meta else {}}
    buffer = io.BytesIO()
    torch.save(content, buffer)
    own = Part(step, directory, rank, buffer.getvalue())
    received = _swap(own.blob, (rank + 1) % world, (rank - 1) % world, group)
    _own, _neighbour = own, Part(step, directory, (rank - 1) % world, received)


def held_bytes() -> tuple[int, int]:
    """The bytes this rank holds: its own part, its neighbour's."""
    return (len(_own.blob) if _own else 0, len(_neighbour.blob) if _neighbour else 0)


def held_step() -> int | None:
    """The step of this rank's own part in memory (None: none held)."""
    return _own.step if _own else None


def heal(fresh: tuple[int, ...]) -> str:
    """Bring back the newest snapshot whole from the peers' memory (every rank of a heal calls it, over
    the new default group; ``fresh``: the ranks that replaced dead ones). Returns the line the heal
    says (the same on every rank), or ``""`` where no rank holds any part."""
    global _own, _neighbour, _restored
    rank, world = dist.get_rank(), dist.get_world_size()
    survivor = rank not in fresh
    mine = (_own.step if _own and survivor else None, _neighbour.step if _neighbour and survivor else None,
            _own.directory if _own and survivor else None)
    every: list[Any] = [None] * world
    dist.all_gather_object(every, mine)
    if all(own is None and held is None for own, held, _ in every):
        return ""
    directory = next(d for _, _, d in every if d is not None)
    step, sources = _whole_step(every, world)
    if step is None:
        lost = _lost_pairs(every, world)
        return (f"  not in the peers' memory: {lost}, so one rank's part of the snapshot is gone with them; "
                "accelerator.resume() reads the newest snapshot from disk")
    group = dist.new_group(backend="gloo")
    try:
        for needing in range(world):  # the same order on every rank: each pair sends once
            holder = sources[needing]
            if holder == needing:
                continue
            if rank == holder:
                assert _neighbour is not None
                dist.send_object_list([_neighbour.blob], needing, group=group)
            elif rank == needing:
                received = [None]
                dist.recv_object_list(received, holder, group=group)
                _own = Part(step, directory, rank, received[0])
        assert _own is not None and _own.step == step
        content = _own.content()
        shared = [_shared_blob(content) if rank == 0 else None]
        dist.broadcast_object_list(shared, 0, group=group)
    finally:
        dist.destroy_process_group(group)
    if rank not in fresh and _neighbour is not None and _neighbour.step != step:
        _neighbour = None  # (a newer part than the snapshot brought back: never used)
    if rank in fresh:
        _neighbour = None  # rank (r - 1)'s part is not held here until the next snapshot
    common = torch.load(io.BytesIO(shared[0]), weights_only=False)
    files = {**common["files"], **content["files"]}
    _restored = Restored(step, directory, [StateFile(n, obj, safe) for n, (obj, safe) in files.items()],
                         content["shards"], common["meta"])
    moved = [f"rank {needing}'s from rank {sources[needing]}'s" for needing in range(world)
             if sources[needing] != needing]
    return (f"  restored from the peers' memory (nothing read from disk): snapshot step {step:,} "
            f"({'; '.join(moved)}); prepare the sharded objects again on every rank, then "
            f"accelerator.resume() goes on from step {step:,} (every rank, the loaders too)")


def take_restored(directory: str) -> Restored | None:
    """The snapshot a heal brought back for ``directory`` (None: none); it is handed over once."""
    global _restored
    found = _restored if _restored is not None and _restored.directory == directory else None
    if found is not None:
        _restored = None
    return found


def _whole_step(every: list[Any], world: int) -> tuple[int | None, dict[int, int]]:
    """The newest step every rank's part is held at, and who holds each part then (itself first)."""
    steps = sorted({s for own, held, _ in every for s in (own, held) if s is not None}, reverse=True)
    for step in steps:
        sources = {}
        for r in range(world):
            holder = (r + 1) % world
            if every[r][0] == step:
                sources[r] = r
            elif every[holder][1] == step:
                sources[r] = holder
        if len(sources) == world:
            return step, sources
    return None, {}


def _lost_pairs(every: list[Any], world: int) -> str:
    gone = [r for r in range(world) if every[r][0] is None]
    pairs = [(r, (r + 1) % world) for r in gone if (r + 1) % world in gone]
    if pairs:
        return "; ".join(f"ranks {a} and {b} were lost together (rank {b} held rank {a}'s part)" for a, b in pairs)
    return "the ranks hold parts of different snapshots"


def _shared_blob(content: dict[str, Any]) -> bytes:
    """Rank 0's files every rank reads (its shards and random states left out) and the metadata."""
    from notebook_accel.checkpoint import layout

    files = {n: f for n, f in content["files"].items() if n != layout.rng_file(0)}
    buffer = io.BytesIO()
    torch.save({"files": files, "meta": content["meta"]}, buffer)
    return buffer.getvalue()


def _swap(blob: bytes, to: int, source: int, group: Any) -> bytes:
    """Send ``blob`` to rank ``to`` while receiving rank ``source``'s (sizes first)."""
    size = torch.tensor([len(blob)], dtype=torch.int64)
    other = torch.empty(1, dtype=torch.int64)
    sent = dist.isend(size, to, group=group)
    dist.recv(other, source, group=group)
    sent.wait()
    data = torch.empty(int(other.item()), dtype=torch.uint8)
    sent = dist.isend(_as_tensor(blob), to, group=group)
    dist.recv(data, source, group=group)
    sent.wait()
    return data.numpy().tobytes()


def _as_tensor(blob: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
