"""How a script using our Accelerator ends under ``torchrun --nproc-per-node 2``.

Usage: ``exit_checks.py MODE`` where MODE is
- ``train``: a short DDP training loop, then a normal end of script;
- ``atexit``: the same, plus a user atexit handler and output left unflushed at the end;
- ``raise``: rank 1 raises after training (the job must fail fast, with the traceback).
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import sys

import torch

from notebook_accel import Accelerator

faulthandler.dump_traceback_later(float(os.environ.get("DDP_CHECKS_TIMEOUT", "100")), exit=True)
MODE = sys.argv[1]

accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = accelerator.prepare(model, optimizer)
generator = torch.Generator().manual_seed(accelerator.process_index)
for _ in range(30):
    optimizer.zero_grad()
    x = torch.randn(4, 8, generator=generator)
    accelerator.backward(model(x).pow(2).mean())
    optimizer.step()

if MODE == "atexit":
    rank = accelerator.process_index
    atexit.register(lambda: print(f"user atexit ran on rank {rank}", flush=True))
    sys.stdout.write(f"unflushed tail of rank {rank}\n")  # stdout is a pipe: block-buffered
elif MODE == "raise" and accelerator.process_index == 1:
    raise RuntimeError("rank 1 failed on purpose")
