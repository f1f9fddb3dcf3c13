"""Detached pools: warm workers that belong to a keeper process of ours, not to the kernel.

A keeper (``keeper.py``) is started in a session of its own, without a parent-death signal to
the kernel: it owns a :class:`~notebook_accel.WorkerPool` (whose workers end with the keeper)
and answers on a Unix socket in a per-user runtime directory (``runtime_dir.py``: mode 0700,
a 0600 token per pool) whoever presents the token, if the same user (``SO_PEERCRED``).
``client.py`` is the kernel's side: start one, list them, stop one; ``attached.py`` the pool
as a kernel uses it (``WorkerPool(detach=True)``, ``WorkerPool.attach``): its runs go through
the keeper (``pool_service.py``), their output kept on disk (``output_ring.py``). It survives
the kernel that started it, and ends itself after ``idle_timeout`` seconds with no run and no
kernel attached.
"""
