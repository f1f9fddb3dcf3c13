"""Runtime checks for ``torchrun --nproc-per-node 2``; one launch covers many checks.

Usage: ``ddp_checks.py OUT_DIR PHASE`` where PHASE is ``train`` (equivalence,
collectives, mixed precision, and an uninterrupted run that also writes two
checkpoints) or ``resume`` (a fresh launch that loads those checkpoints and
finishes the run). Each rank writes ``OUT_DIR/<phase>_rank<r>.json``; the pytest
side asserts on them. Plain script: no launcher, nothing but the torchrun
environment, exactly what a user running ``torchrun`` does.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator, PartialState, set_seed
from notebook_accel.accelerator import DataLoaderConfiguration

# A hung collective must not hang the test: dump every thread's stack and exit.
faulthandler.dump_traceback_later(float(os.environ.get("DDP_CHECKS_TIMEOUT", "100")), exit=True)

OUT = Path(sys.argv[1])
PHASE = sys.argv[2]
results: dict = {}


def regression_data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(123)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def make_model(dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(dropout), torch.nn.Linear(16, 1)
    )


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def reference(global_batch: int, epochs: int) -> torch.Tensor:
    """One process, no Accelerator, the same global batch."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        for x, y in DataLoader(regression_data(), batch_size=global_batch):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return flat(model)


def distributed(per_rank_batch: int, accum: int, split: bool, epochs: int) -> tuple[torch.Tensor, Accelerator]:
    acc = Accelerator(gradient_accumulation_steps=accum, dataloader_config=DataLoaderConfiguration(split_batches=split))
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(regression_data(), batch_size=per_rank_batch)
    model, opt, loader = acc.prepare(model, opt, loader)
    for _ in range(epochs):
        for x, y in loader:
            with acc.accumulate(model):
                acc.backward(torch.nn.functional.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
    return flat(acc.unwrap_model(model)), acc


def check_equivalence() -> None:
    cases = {"plain": (4, 1, False, 8), "accumulate": (4, 2, False, 16), "split_batches": (8, 1, True, 8)}
    for name, (bs, accum, split, global_batch) in cases.items():
        ours, acc = distributed(bs, accum, split, epochs=2)
        results[f"equiv_{name}"] = float((ours - reference(global_batch, epochs=2)).abs().max())
        results[f"ranks_agree_{name}"] = float((acc.gather(ours[None]) - ours).abs().max())


def parity_run(accelerator) -> tuple[torch.Tensor, list[float], list[int]]:
    model = make_model(dropout=0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9**step)
    loader = DataLoader(regression_data(60), batch_size=4)
    evaluation = DataLoader(TensorDataset(torch.arange(21.0)[:, None]), batch_size=4)
    model, opt, loader, sched, evaluation = accelerator.prepare(model, opt, loader, sched, evaluation)
    lrs = []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            sched.step()
            opt.zero_grad()
            lrs.append(sched.get_last_lr()[0])
    seen = [int(v) for (x,) in evaluation for v in accelerator.gather_for_metrics(x[:, 0])]
    return flat(accelerator.unwrap_model(model)), lrs, seen


def check_peer_parity() -> None:
    """The same loop under the peer's Accelerator and ours: same weights, LRs, eval set."""
    try:
        import accelerate
    except ImportError:
        results["peer_parity"] = None
        return
    ours = parity_run(Accelerator(gradient_accumulation_steps=3))
    theirs = parity_run(accelerate.Accelerator(gradient_accumulation_steps=3, cpu=True))
    results["peer_parity"] = {
        "weights": float((ours[0] - theirs[0]).abs().max()), "lrs_equal": ours[1] == theirs[1],
        "eval_equal": ours[2] == theirs[2], "eval": ours[2],
    }


def check_no_sync(sync_each_batch: bool = False) -> None:
    class Plugin:
        num_steps = 2

    Plugin.sync_each_batch = sync_each_batch
    acc = Accelerator(gradient_accumulation_plugin=Plugin())
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(regression_data(), batch_size=4)
    model, opt, loader = acc.prepare(model, opt, loader)
    spreads, syncs = [], []
    for i, (x, y) in enumerate(loader):
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            grads = acc.gather(torch.cat([p.grad.reshape(-1) for p in model.parameters()])[None])
            spreads.append(float((grads[0] - grads[1]).abs().max()))
            syncs.append(acc.sync_gradients)
            opt.step()
            opt.zero_grad()
        if i == 3:
            break
    suffix = "_each_batch" if sync_each_batch else ""
    results[f"no_sync_spreads{suffix}"] = spreads
    results[f"no_sync_syncs{suffix}"] = syncs


def check_join_uneven_inputs() -> None:
    acc = Accelerator(even_batches=False)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt, loader = acc.prepare(model, opt, DataLoader(regression_data(52), batch_size=8))
    steps = 0
    with acc.join_uneven_inputs([model]):  # rank 0 has 4 batches, rank 1 has 3
        for x, y in loader:
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            steps += 1
    results["join_steps"] = steps
    results["join_ranks_agree"] = float((acc.gather(flat(model)[None]) - flat(model)).abs().max())


def eval_ids(acc: Accelerator, n: int = 101, batch: int = 8) -> tuple[list[int], list[int]]:
    ds = TensorDataset(torch.arange(n, dtype=torch.float32)[:, None])
    loader = acc.prepare(DataLoader(ds, batch_size=batch))
    tensors, objects = [], []
    for (x,) in loader:
        tensors.append(acc.gather_for_metrics(x[:, 0]))
        objects.extend(acc.gather_for_metrics([int(v) for v in x[:, 0]]))
    return [int(v) for v in torch.cat(tensors)], objects


def check_metrics_and_collectives() -> None:
    acc = Accelerator()
    results["metrics_even"], results["metrics_even_objects"] = eval_ids(acc)
    # even_batches=False: ranks get different batch counts, so gather once, after the loop.
    uneven = Accelerator(even_batches=False)
    loader = uneven.prepare(DataLoader(TensorDataset(torch.arange(101.0)[:, None]), batch_size=8))
    mine = torch.cat([x[:, 0] for (x,) in loader])
    results["metrics_uneven"] = sorted(int(v) for v in uneven.gather_for_metrics(mine))
    results["metrics_split"], _ = eval_ids(Accelerator(split_batches=True))

    class Stream(torch.utils.data.IterableDataset):  # length unknown to the loader
        def __iter__(self):
            return iter(torch.arange(101.0)[:, None])

    stream = acc.prepare(DataLoader(Stream(), batch_size=8))
    results["metrics_iterable"] = [int(v) for (x,) in ((b,) for b in stream) for v in acc.gather_for_metrics(x[:, 0])]
    rank = acc.process_index
    results["reduce_sum"] = float(acc.reduce(torch.tensor(float(rank + 1))))
    results["reduce_mean"] = float(acc.reduce(torch.tensor(float(rank + 1)), reduction="mean"))
    results["broadcast"] = acc.broadcast({"a": torch.tensor([rank, rank])}, from_process=1)["a"].tolist()
    padded = acc.pad_across_processes(torch.ones(rank + 1, 2), dim=0, pad_index=-1)
    results["pad"] = padded.tolist()
    results["pad_first"] = acc.pad_across_processes(torch.full((1, rank + 1), 5), dim=1, pad_first=True).tolist()
    results["gather_nested"] = {k: v.tolist() for k, v in acc.gather({"r": torch.tensor(rank), "v": torch.full((2,), rank)}).items()}
    results["gather_object"] = acc.gather_object({"rank": rank})
    with acc.split_between_processes(list(range(5))) as mine:
        results["split"] = mine
    with acc.split_between_processes(list(range(5)), apply_padding=True) as mine:
        results["split_padded"] = mine
    order = OUT / "order.txt"
    with acc.main_process_first():
        if rank == 1:
            time.sleep(0.05)
        with open(order, "a") as f:
            f.write(f"{rank}\n")
    acc.wait_for_everyone()
    results["order"] = order.read_text().split()
    if rank == 1:
        acc.set_trigger()
    results["trigger"] = acc.check_trigger()
    results["on_main"] = acc.on_main_process(lambda: "ran")()
    state = PartialState()
    results["state"] = [state.process_index, state.num_processes, state.distributed_type.value, str(state.device)]


def check_mixed_precision() -> None:
    for mp in ("bf16", "fp16"):
        acc = Accelerator(mixed_precision=mp)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = acc.prepare(DataLoader(regression_data(), batch_size=8))
        model, opt = acc.prepare(model, opt)
        losses, dtypes = [], set()
        for x, y in loader:
            out = model(x)
            dtypes.add(str(out.dtype))
            loss = torch.nn.functional.mse_loss(out, y)
            acc.backward(loss)
            acc.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
        results[f"mp_{mp}"] = {"losses": losses, "dtypes": sorted(dtypes), "scaler": acc.scaler is not None,
                               "skipped": acc.optimizer_step_was_skipped}


def resume_setup() -> tuple:
    set_seed(11)
    acc = Accelerator()
    model = make_model(dropout=0.3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.97**step)
    loader = DataLoader(regression_data(96), batch_size=4, shuffle=True)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    return acc, model, opt, loader, sched


def train_batches(acc, model, opt, sched, batches, save_mid: int | None = None) -> None:
    for step, (x, y) in enumerate(batches):
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
        if save_mid is not None and step + 1 == save_mid:
            acc.save_state(OUT / "ckpt_mid")


EPOCHS, MID = 3, 5


def run_uninterrupted() -> None:
    acc, model, opt, loader, sched = resume_setup()
    for epoch in range(EPOCHS):
        train_batches(acc, model, opt, sched, loader, save_mid=MID if epoch == 1 else None)
        if epoch == 0:
            acc.save_state(OUT / "ckpt_epoch")
    if acc.is_main_process:
        torch.save(flat(acc.unwrap_model(model)), OUT / "uninterrupted.pt")
    acc.wait_for_everyone()


def run_resumed(name: str, start_epoch: int) -> float:
    acc, model, opt, loader, sched = resume_setup()
    acc.load_state(OUT / name)
    for epoch in range(start_epoch, EPOCHS):
        batches = loader
        if epoch == start_epoch and loader.resume_step:
            results[f"{name}_resume_step"] = loader.resume_step
            batches = acc.skip_first_batches(loader)
        train_batches(acc, model, opt, sched, batches)
    expected = torch.load(OUT / "uninterrupted.pt")
    return float((flat(acc.unwrap_model(model)) - expected).abs().max())


if PHASE == "train":
    check_equivalence()
    check_no_sync()
    check_no_sync(sync_each_batch=True)
    check_peer_parity()
    check_join_uneven_inputs()
    check_metrics_and_collectives()
    check_mixed_precision()
    run_uninterrupted()
elif PHASE == "resume":
    results["resume_epoch_diff"] = run_resumed("ckpt_epoch", 1)
    results["resume_mid_diff"] = run_resumed("ckpt_mid", 1)
else:
    raise SystemExit(f"unknown phase {PHASE!r}")

rank = PartialState().process_index
(OUT / f"{PHASE}_rank{rank}.json").write_text(json.dumps(results))
