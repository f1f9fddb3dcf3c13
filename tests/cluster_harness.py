"""The cluster tests' network: as root, a private network namespace holding only ``lo``.

The test process's main thread enters it with ``unshare(CLONE_NEWNET)`` before the module's
cluster starts (``notebook_accel.launch.start_local_cluster``: head on 127.0.0.1, node B on
127.0.0.2) and returns with ``setns`` once it is stopped, so no traffic of the cluster, the
driver or the workers can leave. Without root (or ``ip``) the nodes bind their 127.0.0.x
addresses (Ray then gives the head this machine's address).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def private_network() -> Iterator[bool]:
    """Run the block in a fresh network namespace (root, with iproute2's ``ip``); yields whether
    it is one."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        yield False
        return
    libc = ctypes.CDLL(None, use_errno=True)
    old = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            yield False
            return
        try:
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
            yield True
        finally:
            libc.setns(old, CLONE_NEWNET)
    finally:
        os.close(old)
