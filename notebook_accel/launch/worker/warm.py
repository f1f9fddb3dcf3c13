"""Imported once by the forkserver, so every worker forked from it starts warm.

Importing torch costs seconds, and the first ``torch.optim`` optimizer in a
process imports ``torch._dynamo`` (seconds more). Paying both here, once per
kernel, keeps later launches fast. So does the ``Accelerator``'s own package
(its strategies, data, checkpoint and runtime modules: some 70 modules, 0.1-0.2 s
that every forked worker would otherwise import again in its first
``Accelerator()``), and ``setproctitle``, which every worker's setup uses.
"""

import contextlib

import torch
import torch.distributed  # noqa: F401

import notebook_accel.accelerator  # noqa: F401
import notebook_accel.launch.worker.main  # noqa: F401
from notebook_accel.strategies.registry import STRATEGIES, strategy_class

with contextlib.suppress(ImportError):  # optional: the worker's process name
    import setproctitle  # noqa: F401


def warm_optimizer_import() -> None:
    """Build a throwaway optimizer so ``torch._dynamo`` is imported now."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


warm_optimizer_import()
for _name in STRATEGIES:  # each Accelerator() asks every strategy (their modules are torch-light)
    strategy_class(_name)
