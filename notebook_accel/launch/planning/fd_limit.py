"""Room for a launch's file descriptors: the kernel's soft open-file limit, raised when needed.

Every local rank costs the kernel about a dozen descriptors while it starts (four pipes, both
ends, until every rank has started; a sentinel; a pool's commands pipe); on a cluster a node
costs about that (its link), its ranks none. A soft limit of 1024 (common) ends a launch of ~100 ranks with ``EMFILE``; the hard
limit is usually far higher, and raising the soft one up to it needs no privilege.
"""

from __future__ import annotations

import os

FDS_PER_RANK = 12  # descriptors the kernel holds per rank (its channels, pipes and sentinel)
_MARGIN = 256  # for what else the kernel opens meanwhile (sockets, files, the forkserver)


def open_fds() -> int:
    """How many file descriptors this process has open now."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc (macOS): assume a busy kernel
        return 256


def ensure_fd_room(ranks: int) -> None:
    """Raise the soft ``RLIMIT_NOFILE`` (never above the hard limit, never lowering it) so that
    ``ranks`` more ranks (or a cluster's nodes) fit beside what is open now. Where the limit cannot be raised, the
    launch goes on and an ``OSError`` (``EMFILE``) names the limit if it is reached."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = open_fds() + ranks * FDS_PER_RANK + _MARGIN
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
