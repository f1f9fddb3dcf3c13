"""The peer's rendezvous arguments (``rdzv_backend``, ``rdzv_endpoint``) as our meeting point.

Our workers always meet at a store the main node's kernel hosts (``rendezvous.py``) at
``master_addr:use_port``. ``"static"`` and ``"c10d"`` (torch elastic's store-based rendezvous, the
peer's elastic choice) both run that way: the job, its ranks and its restarts
(``max_restarts``) are the same on one machine; across machines the nodes meet at
``rdzv_endpoint`` (or ``master_addr:use_port``) and take their ``node_rank``, a fixed
membership, where torch elastic would number them as they arrive. ``"etcd"`` needs an
etcd server and is refused.
"""

from __future__ import annotations

from notebook_accel.launch.ports import parse_port

BACKENDS = ("static", "c10d")


def meeting_point(rdzv_backend: str, rdzv_endpoint: str, master_addr: str | None,
                  use_port: int | str | None) -> tuple[str | None, int | str | None]:
    """``(master_addr, use_port)`` for the launch, from ``rdzv_endpoint`` (``"host:port"``) when given.

    Raises:
        ValueError: a backend other than ``BACKENDS``, an endpoint that is no ``host:port``, or one
            that disagrees with ``master_addr`` / ``use_port``.
    """
    if rdzv_backend not in BACKENDS:
        raise ValueError(f"rdzv_backend={rdzv_backend!r} is not supported; choose one of {BACKENDS} "
                         "(both meet at a store this kernel hosts; etcd needs a server of its own)")
    if not rdzv_endpoint:
        return master_addr, use_port
    host, sep, port = rdzv_endpoint.rpartition(":")
    if not sep or not host:
        raise ValueError(f"rdzv_endpoint={rdzv_endpoint!r} is not 'host:port' (e.g. '10.0.0.1:29500')")
    host = host.strip("[]")  # an IPv6 address in brackets
    port_number = parse_port(port)
    if master_addr is not None and master_addr != host:
        raise ValueError(f"rdzv_endpoint={rdzv_endpoint!r} and master_addr={master_addr!r} disagree; give one")
    if use_port is not None and parse_port(use_port) != port_number:
        raise ValueError(f"rdzv_endpoint={rdzv_endpoint!r} and use_port={use_port!r} disagree; give one")
    return host, port_number
