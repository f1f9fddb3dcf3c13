"""Two-process halves of the issue-12 regression tests, for ``torchrun --nproc-per-node 2``.

Usage: ``compat_checks.py OUT_DIR``. Each rank writes ``OUT_DIR/compat_rank<r>.json``
with one entry per check; the pytest side (``test_compat_distributed.py``) asserts on them.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator, PartialState
from notebook_accel.runtime.ops import gather, gather_object, reduce

faulthandler.dump_traceback_later(float(os.environ.get("DDP_CHECKS_TIMEOUT", "100")), exit=True)

OUT = Path(sys.argv[1])
results: dict = {}


def data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 1, generator=g)
    return TensorDataset(x, 2 * x + 3 + 0.1 * torch.randn(n, 1, generator=g))


def train(loader, model, opt, backward) -> torch.Tensor:
    for _ in range(3):
        for x, y in loader:
            opt.zero_grad()
            backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def check_users_generator_gives_the_one_process_order() -> None:
    """Bug 1: 2 processes with the user's generator train the model one process trains."""
    world = PartialState().num_processes
    g = torch.Generator()
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    ref_model = torch.nn.Linear(1, 1)
    ref_model.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    g.manual_seed(42)
    reference = train(DataLoader(data(), batch_size=8 * world, shuffle=True, generator=g), ref_model, ref_opt,
                      lambda loss: loss.backward())
    acc = Accelerator()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, model, opt = acc.prepare(DataLoader(data(), batch_size=8, shuffle=True, generator=g), model, opt)
    g.manual_seed(42)
    got = train(loader, model, opt, acc.backward)
    results["one_process_order"] = float((got - reference).abs().max())


def check_save_state_into_unshared_directories() -> None:
    """Bug 7: every rank saves into its own directory (no shared file system)."""
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 2))
    mine = OUT / f"own_{acc.process_index}" / "ckpt"
    acc.save_state(mine)
    acc.save_state(mine)  # again over an existing checkpoint
    files = sorted(p.name for p in mine.iterdir())
    acc.load_state(mine)
    results["unshared_files"] = files
    leftovers = sorted(p.name for p in mine.parent.iterdir() if p.name != "ckpt")
    results["unshared_leftovers"] = leftovers
    shared = OUT / "shared_ckpt"
    acc.save_state(shared)
    results["shared_files"] = sorted(p.name for p in shared.iterdir())
    del model


def check_reductions_and_splits() -> None:
    """Bug 8: max/min reductions; split_between_processes of a sized indexable."""
    state = PartialState()
    t = torch.tensor([1.0, 2.0]) + 2 * state.process_index
    results["max"] = reduce(t, "max").tolist()
    results["min"] = reduce(t, "min").tolist()
    ds = TensorDataset(torch.arange(5))
    with state.split_between_processes(ds, apply_padding=True) as part:
        mine = [int(part[i][0]) for i in range(len(part))]
    results["split"] = gather_object(mine)
    results["gather"] = gather(torch.tensor([state.process_index])).tolist()


def check_dispatch_batches() -> None:
    """dispatch_batches=True: rank 0 loads, every rank gets its slice; nothing lost, remainder exact."""
    from notebook_accel.data.prepare import DataLoaderConfiguration

    for split in (False, True):
        acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True, split_batches=split))
        loader = acc.prepare(DataLoader(TensorDataset(torch.arange(22)), batch_size=4 if split else 2))
        seen = [acc.gather_for_metrics(x).tolist() for (x,) in loader]
        results[f"dispatch_split{split}"] = [sorted(v for batch in seen for v in batch), len(loader), len(seen)]


def check_rng_sync_trigger_sync_and_debug_mode() -> None:
    from notebook_accel.runtime.op_checks import DistributedOperationException
    from notebook_accel.runtime.rng_sync import synchronize_rng_states
    from notebook_accel.runtime.testing import are_the_same_tensors

    state = PartialState()
    torch.manual_seed(state.process_index)
    g = torch.Generator().manual_seed(100 + state.process_index)
    synchronize_rng_states(["torch", "generator"], generator=g)
    results["rng_synced"] = are_the_same_tensors(torch.get_rng_state()) and are_the_same_tensors(g.get_state())

    acc = Accelerator()
    torch.manual_seed(0)
    model = acc.prepare(torch.nn.Linear(2, 1))
    x = torch.full((1, 2), float(acc.process_index + 1))
    losses = []
    with acc.no_sync(model):
        for _ in range(2):
            losses.append(model(x).sum())
    acc.backward(losses[0])
    unsynced = model.module.weight.grad.clone()
    with acc.trigger_sync_in_backward(model):
        acc.backward(losses[1])
    grads = gather(model.module.weight.grad[None])
    results["trigger_sync"] = [bool(torch.equal(grads[0], grads[1])), unsynced.tolist()]

    state.debug = True
    try:
        shape = (1, 5) if state.process_index == 0 else (1, 1, 5)
        reduce(torch.zeros(shape))
        results["debug_mode"] = "no error"
    except DistributedOperationException as error:
        results["debug_mode"] = str(error)
    finally:
        state.debug = False


def main() -> None:
    for check in (check_users_generator_gives_the_one_process_order, check_save_state_into_unshared_directories,
                  check_reductions_and_splits, check_dispatch_batches, check_rng_sync_trigger_sync_and_debug_mode):
        check()
    rank = PartialState().process_index
    (OUT / f"compat_rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
