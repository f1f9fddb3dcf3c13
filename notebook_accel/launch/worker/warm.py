"""Imported once by the forkserver, so every worker forked from it starts warm.

Importing torch costs seconds, and the first ``torch.optim`` optimizer in a
process imports ``torch._dynamo`` (seconds more). Paying both here, once per
kernel, keeps later launches fast.
"""

import torch
import torch.distributed  # noqa: F401

import notebook_accel.launch.worker.main  # noqa: F401


def warm_optimizer_import() -> None:
    """Build a throwaway optimizer so ``torch._dynamo`` is imported now."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


warm_optimizer_import()
