"""Minimal reproduction of torch's gloo exit abort (plain torch, none of our code).

    for i in $(seq 10); do torchrun --nproc-per-node 2 docs/repro/gloo_exit_abort.py || echo FAILED; done

On a busy 2-core machine (e.g. two `python -c "while True: pass"` running beside it)
about 1 run in 3 ends with one rank printing "terminate called without an active
exception" and dying of SIGABRT after the loop finished. Calling
`dist.destroy_process_group()` at the end does not help (DDP keeps the group alive).
Set SETTLE=1 to apply the workaround notebook_accel uses (an atexit handler that
tears the group down and releases the GIL until gloo's threads are idle).
See docs/torch_gloo_exit_abort.md.
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if os.environ.get("SETTLE"):
    from notebook_accel.runtime import exit_teardown

    exit_teardown.register("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(50):
    optimizer.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()
if os.environ.get("DESTROY"):
    dist.destroy_process_group()
