"""A warm pool's heal, the kernel's side: a rank's death costs only that rank.

When some ranks of a pool die (the OOM killer, a segfault, ``os._exit``) while others live,
the pool starts new workers for the dead ranks alone (``PoolWorkers.replace``: the same rank
numbers, device and environment, a fresh rendezvous store; on a cluster
``ClusterPoolWorkers.replace``: each dead rank forked again by its node's hub, unless the node
itself was lost) and runs the heal on every rank
(``launch/worker/healing/heal.py``). The survivors, which the supervisor stopped at one cut (the stop
button's agreement, among the living), leave the broken group, meet the new ranks, copy them
every name they hold alike, rank to rank, and build their rank-bound objects anew for the new
group. The kernel starts processes and reads a report; it never holds a copy of the state.
:func:`heal_in_place` says in a few lines what was restored, rebuilt and lost.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from notebook_accel.launch.backends.base import PoolWorkerSet
from notebook_accel.launch.backends.pool import PoolBackend
from notebook_accel.launch.handoff.payload import serialise_payload
from notebook_accel.launch.launcher import launch_once
from notebook_accel.launch.planning.plan import LaunchPlan
from notebook_accel.launch.views.rank_ranges import ranks_text

if TYPE_CHECKING:
    from notebook_accel.launch.worker.healing.heal import HealReport

HEAL_TIMEOUT = 600.0  # seconds a heal may take before it is stopped and every rank replaced
_SHOWN = 12  # names listed per line before the rest is counted


def can_heal(plan: LaunchPlan, workers: PoolWorkerSet, dead: list[int]) -> str | None:
    """Why the pool cannot heal ``dead`` ranks in place (None: it can)."""
    if not plan.heal:
        return "heal=False"
    if len(dead) == len(workers.handles):
        return "every rank is gone"
    lost = sorted({h.node for h in workers.handles if h.rank in dead and h.describe_end() is not None})
    if lost:  # no hub is left there to fork its ranks again
        nodes = ", ".join(str(node) for node in lost)
        return f"node {nodes} was lost" if len(lost) == 1 else f"nodes {nodes} were lost"
    return None


@dataclass(frozen=True)
class Healed:
    """One heal: what it says, rank 0's report, and how long its parts took (seconds)."""

    text: str
    report: HealReport
    start: float  # the new ranks' processes started
    total: float


def heal_in_place(workers: PoolWorkerSet, plan: LaunchPlan, dead: tuple[int, ...],
                  dead_names: tuple[str, ...], same_cut: bool) -> Healed:
    """Replace the ``dead`` ranks alone and copy them what the survivors hold alike.

    Args:
        dead_names: the names that held state on the dead ranks (their last reports).
        same_cut: the survivors ended their run at the same collective.
    Returns:
        What was done (``text``: a few lines for the user).
    Raises:
        WorkerError: the heal failed on a rank (a rank died meanwhile, the survivors' prepared
            objects differ...): the caller replaces every rank.
        KeyboardInterrupt: interrupted meanwhile (the caller replaces every rank).
    """
    from notebook_accel.launch.worker.healing.heal import heal  # torch: never on %load_ext's path

    started = time.monotonic()
    port = workers.replace(dead)
    start = time.monotonic() - started
    # the heal's own run: silent, never remembered as the user's, stopped at once when the
    # stop button is pressed (it has no cut of the user's to wait for)
    quiet = dataclasses.replace(plan, output="none", hang_after=None, timeout=HEAL_TIMEOUT,
                                return_all=False, stop_wait=0.1)
    report: HealReport = launch_once(PoolBackend(workers), quiet,
                                     serialise_payload(heal, (port, dead), {}), remembered=False)
    total = time.monotonic() - started
    return Healed(describe(report, dead, dead_names, total, same_cut), report, start, total)


def describe(report: HealReport, dead: tuple[int, ...], dead_names: tuple[str, ...],
             seconds: float, same_cut: bool) -> str:
    """The heal in a few lines: who was replaced, then what was restored, rebuilt and lost."""
    who = ranks_text(dead)
    were = "was" if len(dead) == 1 else "were"
    cut = ("" if report.survivors == 1 else
           " (the other ranks had stopped together, at the same collective)" if same_cut else
           " (the other ranks had stopped at different points; only what they held alike was copied)")
    lines = [f"The pool healed: {who} {were} replaced in {seconds:.1f} s{cut}."]
    restored = list(report.restored) + (["random states"] if report.random_states else [])
    alone = (f" (the only rank left, so each name counts as the same on every rank: one that "
             f"held each rank's own part now holds rank {report.source}'s)"
             if report.survivors == 1 else "")
    if restored:
        lines.append(f"  restored from rank {report.source}{alone}: {_listed(restored)}")
    if report.rebuilt:
        lines.append(f"  rebuilt for the new group: {_listed(report.rebuilt)}")
    copied = set(report.restored) | set(report.rebuilt)
    own = [n for n in dict.fromkeys([*report.differing, *(n for n in dead_names if n not in copied
                                                            and n not in report.uncopyable)])]
    if own:
        lines.append(f"  lost with {who} (each rank held its own value): {_listed(own)}")
    if report.uncopyable:
        by_reason: dict[str, list[str]] = {}
        for name, reason in report.uncopyable.items():
            by_reason.setdefault(reason, []).append(name)
        why = [f"{_listed(names)} ({reason})" for reason, names in by_reason.items()]
        lines.append(f"  not copied to {who} (cannot be copied): {'; '.join(why)}")
    if report.peers:
        lines.append(report.peers)
    if not report.random_states:
        why = "rank {report.source}'s alone cannot say" if report.survivors == 1 else "the other ranks' differed"
        start = "starts" if len(dead) == 1 else "start"
        lines.append(f"  {who} {start} from fresh random states ({why.format(report=report)})")
    lines.append("Run the cell again to go on.")
    return "\n".join(lines)


def _listed(names: list[str] | tuple[str, ...]) -> str:
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more
