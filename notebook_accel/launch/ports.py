"""Rendezvous ports: a free one per launch, or the user's, checked before any worker starts."""

from __future__ import annotations

import socket


def _bind(host: str, port: int) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, port))
        return sock.getsockname()[1]


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listens on right now."""
    return _bind(host, 0)


def parse_port(value: int | str) -> int:
    """Accept ``29500`` or ``"29500"``; raise ValueError naming anything else."""
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"use_port={value!r} is not a port number (1-65535)") from None
    if isinstance(value, bool) or not 1 <= port <= 65535:
        raise ValueError(f"use_port={value!r} is not a port number (1-65535)")
    return port
