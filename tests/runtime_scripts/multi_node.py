"""One training function for the no-Ray multi-node paths: torchrun c10d and submitit.

``train()`` trains a tiny model a few steps with our ``Accelerator`` and returns what its rank
saw (world size, rank, the final weights, an all-reduced and a gathered value).
``python multi_node.py`` (under torchrun) prints that as one ``RESULT {...}`` JSON line per rank.
"""

from __future__ import annotations

import json

import torch

from notebook_accel import Accelerator


def train() -> dict:
    """A few SGD steps on one fixed batch per rank, then an all_reduce and a gather."""
    torch.manual_seed(0)
    acc = Accelerator()
    model = torch.nn.Linear(3, 1)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(acc.process_index))
    for _ in range(3):
        acc.backward(model(x).pow(2).mean())
        opt.step()
        opt.zero_grad()
    rank = torch.tensor([float(acc.process_index)])
    return {"world": acc.num_processes, "rank": acc.process_index,
            "weights": [round(w, 6) for w in acc.unwrap_model(model).weight.detach().reshape(-1).tolist()],
            "rank_sum": acc.reduce(rank, "sum").item(), "gathered": acc.gather(rank).tolist()}


def train_in_submitit() -> dict:
    """``train`` as a submitit task: export submitit's view of the job as torchrun's variables.

    Every GPU stays visible (the Accelerator takes ``cuda:LOCAL_RANK``); ``overwrite`` lets the
    ``MASTER_PORT`` the job inherited stand (submitit reads it, then refuses to re-export it).
    """
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return train()


if __name__ == "__main__":
    print("RESULT " + json.dumps(train()), flush=True)
