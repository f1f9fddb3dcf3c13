"""The job's rendezvous store, hosted by the kernel on a socket it binds itself.

torch's own ``env://`` rendezvous makes rank 0 start a TCPStore that listens on
every interface, on a port picked earlier (a race with other programs). Instead
the kernel binds the port on ``master_addr`` only (loopback for one machine),
hands the listening socket to a TCPStore server, and tells every worker to join
as a client (``TORCHELASTIC_USE_AGENT_STORE``, as torchrun's agent does).
"""

from __future__ import annotations

import socket
from datetime import timedelta


class Rendezvous:
    """A TCPStore server listening on ``host:port`` (port 0: any free port); ``store`` is its
    client view (the kernel reads the nodes' join keys through it).

    Raises:
        ValueError: the port is taken.
    """

    def __init__(self, host: str, port: int = 0) -> None:
        import torch.distributed as dist

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._socket.bind((host, port))
        except OSError as exc:
            self._socket.close()
            raise ValueError(
                f"port {port} on {host} is busy ({exc.strerror}); pass another use_port, "
                "or use_port=None to pick a free one"
            ) from None
        self._socket.listen(128)
        self.host, self.port = host, self._socket.getsockname()[1]
        self.fd = self._socket.fileno()  # forked workers close their copy
        try:
            self.store = dist.TCPStore(
                host, self.port, None, True, timedelta(minutes=30), wait_for_workers=False,
                master_listen_fd=self._socket.fileno(),
            )
        except BaseException:
            self._socket.close()
            raise
        self._socket.detach()  # the store owns the listening fd now and closes it

    def close(self) -> None:
        """Stop the server and release the port."""
        self.store = None
