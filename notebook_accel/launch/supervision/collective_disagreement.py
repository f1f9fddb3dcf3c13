"""A hang said as the ranks' disagreement at a numbered collective.

Given every rank's last collectives (its flight recorder, ``launch/worker/flight_recorder``)
and where each rank's main thread is, say in a few lines what the collectives disagree on,
for each group some rank waits in:

- different operations at the same number (``the ranks called different collectives at
  #412 (group default):``, then ``rank 0 waits in all_reduce #412 (float32[1024]; File
  ..., line 18, in train)`` and rank 1's line);
- the same operation with different tensors (shapes or dtypes);
- ranks that never reached the number, and where they are instead (from their stacks).

Ranks that say the same thing are one line (``ranks 0-1022``), most ranks first, so 1024
ranks take as many lines as there are different answers, and at most 8 of each kind (the
rest counted on one line: ``ranks 8-1023: 1016 other calls``). Pure functions: the hang watch, one-off launches'
dumps and a cluster's ranks all feed it alike.
"""

from __future__ import annotations

import linecache
from collections.abc import Mapping, Sequence

from notebook_accel.launch.supervision.stack_groups import is_users_file, users_part
from notebook_accel.launch.supervision.tracebacks import Frame, with_cell_labels
from notebook_accel.launch.views.rank_ranges import ranks_text
from notebook_accel.wire import Collective

DEFAULT_GROUP = "default"
_GROUPS_SAID = 3  # groups some rank waits in, said at most (the rest are counted)
_ANSWERS_SAID = 8  # lines per group, each for the ranks that answer alike (the rest counted)


def disagreement(recorders: Mapping[int, Sequence[Collective] | None],
                 stacks: Mapping[int, Sequence[Frame]] = {},  # noqa: B006 - read only
                 ended: Sequence[int] = ()) -> str | None:
    """The ranks' disagreement, a few lines (None: no rank waits in a recorded collective).

    Args:
        recorders: rank -> its last collectives, oldest first (None: the rank did not say).
        stacks: rank -> its main thread's frames (``(file, line, function)``, innermost last):
            where a rank that never reached a collective is instead.
        ended: ranks whose run is over (not asked): they never reach a default group's
            collective that the others wait in.
    """
    known = {rank: tuple(c) for rank, c in recorders.items() if c is not None}
    if not any(known.values()):
        return None
    said = []
    waited = _groups_waited_in(known)
    for group in waited[:_GROUPS_SAID]:
        said.append(_group_text(group, known, stacks,
                                [r for r in ended if r not in known] if group == DEFAULT_GROUP else []))
    if len(waited) > _GROUPS_SAID:
        said.append(f"(and {len(waited) - _GROUPS_SAID} more groups with a rank waiting)")
    return with_cell_labels("\n".join(said)) if said else None


def _groups_waited_in(known: Mapping[int, tuple[Collective, ...]]) -> list[str]:
    """The groups whose latest collective some rank still waits in, the default group first."""
    groups = {c.group for collectives in known.values() for c in collectives if not c.done
              and c is _last(collectives, c.group)}
    return sorted(groups, key=lambda g: (g != DEFAULT_GROUP, g))


def _last(collectives: Sequence[Collective], group: str) -> Collective | None:
    """The latest (highest numbered) collective of ``group`` among ``collectives``."""
    found = None
    for c in collectives:
        if c.group == group and (found is None or c.number >= found.number):
            found = c
    return found


def _group_text(group: str, known: Mapping[int, tuple[Collective, ...]],
                stacks: Mapping[int, Sequence[Frame]], ended: Sequence[int]) -> str:
    """The verdict on ``group`` (its latest number), then one line per answer."""
    latest = {rank: _last(collectives, group) for rank, collectives in known.items()}
    if group != DEFAULT_GROUP:  # a sub-group's members: the ranks that ever used it
        latest = {rank: c for rank, c in latest.items() if c is not None}
    number = max(c.number for c in latest.values() if c is not None)
    at = {rank: c for rank, c in latest.items() if c is not None and c.number == number}
    behind = sorted(rank for rank in latest if rank not in at)
    kinds: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for rank, c in sorted(at.items()):
        kinds.setdefault((c.op, c.tensors), []).append(rank)
    lines = [_verdict(kinds, [*behind, *ended], number, group)]
    ordered = sorted(kinds.items(), key=lambda kind: (-len(kind[1]), kind[1][0]))
    for (op, tensors), ranks in ordered[:_ANSWERS_SAID]:
        c = at[ranks[0]]
        details = [", ".join(tensors) or "no tensor"]
        where = c.where or (None if c.done else _users_innermost(stacks.get(ranks[0], ())))
        if where is not None:
            details.append(_where(where))
        lines.append(f"  {ranks_text(ranks)} {_verb(ranks, at)} {op} #{number} ({'; '.join(details)})")
    lines += _counted([ranks for _, ranks in ordered[_ANSWERS_SAID:]], "other calls")
    places = sorted(_places(behind, stacks).items(), key=lambda place: (-len(place[1]), place[1][0]))
    for where, ranks in places[:_ANSWERS_SAID]:
        short = {number - (latest[r].number if latest[r] is not None else 0) for r in ranks}
        count = f"{min(short)}-{max(short)}" if len(short) > 1 else str(short.pop())
        lines.append(f"  {ranks_text(ranks)} never reached it: "
                     f"{'they are' if len(ranks) > 1 else 'it is'} {where}, "
                     f"{count} collective{'' if count == '1' else 's'} short")
    lines += _counted([ranks for _, ranks in places[_ANSWERS_SAID:]],
                      "other places, short of it (their stacks are below)")
    if ended:
        lines.append(f"  {ranks_text(ended)} never reached it: "
                     f"{'their runs' if len(ended) > 1 else 'its run'} ended")
    return "\n".join(lines)


def _counted(groups: Sequence[Sequence[int]], what: str) -> list[str]:
    """One line for the answers past :data:`_ANSWERS_SAID` (none: no line)."""
    if not groups:
        return []
    return [f"  {ranks_text([rank for ranks in groups for rank in ranks])}: {len(groups)} {what}"]


def _verb(ranks: Sequence[int], at: Mapping[int, Collective]) -> str:
    if any(not at[rank].done for rank in ranks):
        return "waits in" if len(ranks) == 1 else "wait in"
    return "called"


def _verdict(kinds: Mapping[tuple[str, tuple[str, ...]], list[int]], behind: Sequence[int],
             number: int, group: str) -> str:
    ops = sorted({op for op, _ in kinds})
    if len(ops) > 1:
        return f"the ranks called different collectives at #{number} (group {group}):"
    if len(kinds) > 1:
        return f"the ranks passed different shapes or dtypes to {ops[0]} #{number} (group {group}):"
    if behind:
        return f"not every rank reached {ops[0]} #{number} (group {group}):"
    return f"every rank of group {group} is in {ops[0]} #{number}, alike:"


def _places(ranks: Sequence[int], stacks: Mapping[int, Sequence[Frame]]) -> dict[str, list[int]]:
    """Where each of ``ranks`` is (its innermost frame of the user's code), ranks alike together."""
    places: dict[str, list[int]] = {}
    for rank in ranks:
        frame = _users_innermost(stacks.get(rank, ()))
        place = _where(frame, source=True) if frame else "elsewhere (no stack)"
        places.setdefault(place, []).append(rank)
    return places


def _users_innermost(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the user's own code in a stack (a recorder read without its
    frames, a one-off launch's, says where a waiting rank is by its stack)."""
    users = [frame for frame in users_part(frames) if is_users_file(frame[0])]
    return users[-1] if users else None


def _where(frame: Sequence, source: bool = False) -> str:
    """``File "x.py", line 18, in train`` (a cell's file becomes ``Cell In[4]`` later), with
    the line's source when asked."""
    filename, line, name = frame
    text = f'File "{filename}", line {line}, in {name}'
    code = linecache.getline(filename, line).strip() if source else ""
    return f"at {text} ({code})" if code else (f"at {text}" if source else text)
