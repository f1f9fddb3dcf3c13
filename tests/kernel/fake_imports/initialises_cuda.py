"""Stands in for a library that initialises CUDA when imported (torchao, numa on Kaggle), on a
machine without a GPU (imported by tests/kernel/test_cuda_first_kernel.py, in the kernel).

What such an import leaves, and what the launcher's probe reads: ``torch.cuda.is_initialized()``
is True (through the very flag it reads, ``torch.cuda._initialized``), and a child forked from
this process is a bad fork (what torch's fork handler does after a real initialisation): there
``torch.cuda._is_in_bad_fork()`` is True, and any CUDA call raises "Cannot re-initialize CUDA in
forked subprocess".
"""

import os

import torch.cuda

torch.cuda._initialized = True


def _mark_bad_fork() -> None:
    torch.cuda._is_in_bad_fork = lambda: True


os.register_at_fork(after_in_child=_mark_bad_fork)


def forked_child_is_bad_fork() -> bool:
    """Whether this process is a bad fork (run in a child forked from the kernel, as a check)."""
    return torch.cuda._is_in_bad_fork()
