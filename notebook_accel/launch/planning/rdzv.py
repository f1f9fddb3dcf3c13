"""The peer's rendezvous arguments (``rdzv_backend``, ``rdzv_endpoint``) as our meeting point.

Our workers always meet at a store the main node's kernel hosts (``rendezvous.py``) at
``master_addr:use_port``. ``"static"`` and ``"c10d"`` (torch elastic's store-based rendezvous, the
peer's elastic choice) both run that way: the job, its ranks and its restarts
(``max_restarts``) are the same on one machine; across machines the nodes meet at
``rdzv_endpoint`` (or ``master_addr:use_port``) and take their ``node_rank``, a fixed
membership, where torch elastic would number them as they arrive. ``"etcd"`` needs an
etcd server and is refused (``contract.RDZV_BACKENDS``).
"""

from __future__ import annotations

from notebook_accel.contract import OPTIONS


def meeting_point(rdzv_endpoint: str, master_addr: str | None,
                  use_port: int | None) -> tuple[str | None, int | None]:
    """``(master_addr, use_port)`` for the launch, from ``rdzv_endpoint`` (``"host:port"``) when given
    (``rdzv_backend``, ``"static"`` or ``"c10d"``, is checked by its row: both meet the same way).

    Raises:
        ValueError: an endpoint that is no ``host:port``, or one that disagrees with
            ``master_addr`` / ``use_port``.
    """
    if not rdzv_endpoint:
        return master_addr, use_port
    host, sep, port = rdzv_endpoint.rpartition(":")
    if not sep or not host:
        raise ValueError(f"rdzv_endpoint={rdzv_endpoint!r} is not 'host:port' (e.g. '10.0.0.1:29500')")
    host = host.strip("[]")  # an IPv6 address in brackets
    port_number = OPTIONS["use_port"].check(port, f"rdzv_endpoint={rdzv_endpoint!r}", "port")
    if master_addr is not None and master_addr != host:
        raise ValueError(f"rdzv_endpoint={rdzv_endpoint!r} and master_addr={master_addr!r} disagree; give one")
    if use_port is not None and use_port != port_number:
        raise ValueError(f"rdzv_endpoint={rdzv_endpoint!r} and use_port={use_port!r} disagree; give one")
    return host, port_number
