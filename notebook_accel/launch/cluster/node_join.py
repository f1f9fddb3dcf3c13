"""The static multi-node join (one kernel per node): every node's launch must come within a bound.

Before any worker starts, the main node's kernel waits until every other node's kernel has
announced itself in the rendezvous store, and those kernels wait until they reach it. Either
side gives up after ``JOIN_TIMEOUT`` seconds (or the launch's ``timeout``, if shorter), naming
who did not come, instead of leaving the workers in a silent 30-minute collective timeout.
"""

from __future__ import annotations

import time
from datetime import timedelta

from notebook_accel.launch.control.interrupts import check_interrupt
from notebook_accel.launch.planning.plan import LaunchPlan

JOIN_TIMEOUT = 300.0  # seconds every node's kernel has to join (each imports torch)
_KEY = "notebook_accel/joined/node{}"
_POLL_S = 0.1  # seconds between two looks at who has joined


def join_deadline(plan: LaunchPlan) -> float:
    """Seconds the nodes have to meet: ``JOIN_TIMEOUT``, or ``timeout`` when shorter."""
    return JOIN_TIMEOUT if plan.timeout is None else min(plan.timeout, JOIN_TIMEOUT)


def await_nodes(store, plan: LaunchPlan) -> None:
    """On the main node: wait until nodes 1..num_nodes-1 have announced themselves.

    Raises:
        TimeoutError: naming every node that did not join, and how to start it.
    """
    limit = join_deadline(plan)
    end = time.monotonic() + limit
    missing = list(range(1, plan.num_nodes))
    while missing:
        missing = [n for n in missing if not store.check([_KEY.format(n)])]
        if not missing:
            return
        if time.monotonic() >= end:
            nodes = ", ".join(str(n) for n in missing)
            raise TimeoutError(
                f"node{'s' if len(missing) > 1 else ''} {nodes} of {plan.num_nodes} did not join "
                f"within {limit:g} s; start the same launch there with "
                + " / ".join(f"node_rank={n}" for n in missing)
                + f" (master_addr={plan.master_addr!r}, use_port={plan.port})")
        check_interrupt("launch interrupted while waiting for the other nodes")
        time.sleep(_POLL_S)


def announce(plan: LaunchPlan) -> None:
    """On another node: reach the main node's store and say this node has come.

    Raises:
        TimeoutError: the main node's launch was not reachable in time.
    """
    import torch.distributed as dist

    limit = join_deadline(plan)
    end = time.monotonic() + limit
    while True:
        try:
            store = dist.TCPStore(plan.master_addr, plan.port, None, False, timedelta(seconds=1))
            break
        except (RuntimeError, TimeoutError):  # DistNetworkError / DistStoreError: not up yet
            if time.monotonic() >= end:
                raise TimeoutError(
                    f"node 0 of {plan.num_nodes} (master_addr={plan.master_addr!r}, use_port={plan.port}) "
                    f"could not be reached within {limit:g} s; start the same launch there with "
                    "node_rank=0") from None
            check_interrupt("launch interrupted while waiting for node 0")
            time.sleep(_POLL_S)
    store.set(_KEY.format(plan.node_rank), "1")
