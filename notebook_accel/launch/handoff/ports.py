"""Rendezvous ports: a free one per launch (the user's is checked by its option's row)."""

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
