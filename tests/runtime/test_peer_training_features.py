"""The peer's by_feature helpers on 2 processes: LocalSGD, DDP communication hooks and
``Accelerator.profile``."""

from __future__ import annotations

import json

import torch

from notebook_accel import notebook_launcher


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1, bias=False)


def _local_sgd() -> list[list[float]]:
    from notebook_accel import Accelerator
    from notebook_accel.local_sgd import LocalSGD

    accelerator = Accelerator()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.full((2, 4), float(accelerator.process_index + 1))  # each rank: its own data
    weights = []
    with LocalSGD(accelerator, model, local_sgd_steps=2) as local_sgd:
        for _ in range(2):
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            weights.append(model.module.weight.detach().flatten().tolist())
    return weights


def test_local_sgd_trains_alone_then_averages_every_k_steps():
    rank0, rank1 = notebook_launcher(_local_sgd, num_processes=2, return_all=True)
    # step 1, no all-reduce: weight - 0.1 * 2 * (rank + 1) (the sum of the batch's inputs)
    assert rank0[0] != rank1[0]
    w0 = _model().weight.detach().flatten()
    assert torch.allclose(torch.tensor(rank0[0]), w0 - 0.2) and torch.allclose(torch.tensor(rank1[0]), w0 - 0.4)
    # step 2 (k = 2): the average of the ranks' own two steps, (w0 - 0.4 + w0 - 0.8) / 2
    assert rank0[1] == rank1[1]
    assert torch.allclose(torch.tensor(rank0[1]), w0 - 0.6, atol=1e-6)


def _grads_with(hook: str, wrapper: str, options: dict) -> list[float]:
    from notebook_accel import Accelerator
    from notebook_accel.utils import DistributedDataParallelKwargs

    handler = DistributedDataParallelKwargs(comm_hook=hook, comm_wrapper=wrapper, comm_state_option=options)
    accelerator = Accelerator(kwargs_handlers=[handler])
    model = accelerator.prepare(_model())
    x = torch.full((1, 4), 1.0 + 1e-3 * (accelerator.process_index + 1))  # not exact in fp16 / bf16
    accelerator.backward(model(x).sum())
    return model.module.weight.grad.flatten().tolist()


def _hooks() -> dict[str, list[float]]:
    runs = {"no": ("no", "no", {}), "fp16": ("fp16", "no", {}),
            "power_sgd": ("power_sgd", "fp16", {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2})}
    grads = {name: _grads_with(*spec) for name, spec in runs.items()}
    try:
        _grads_with("bf16", "no", {})
    except TypeError as exc:  # torch allows bf16 compression on NCCL / XCCL only, not gloo
        grads["bf16"] = str(exc)
    return grads


def test_ddp_comm_hooks_compress_the_all_reduce():
    rank0, rank1 = notebook_launcher(_hooks, num_processes=2, return_all=True)
    assert rank0 == rank1  # every hook leaves the ranks with the same gradients
    exact = 1.0 + 1e-3 * 1.5
    assert rank0["no"] == [exact] * 4 or max(abs(g - exact) for g in rank0["no"]) < 1e-7
    error = max(abs(g - exact) for g in rank0["fp16"])
    assert 1e-7 < error < 1e-3, rank0["fp16"]  # compressed: close, not exact
    assert "BF16" in rank0["bf16"]  # on CPU torch refuses it, naming what it needs
    assert max(abs(g - exact) for g in rank0["power_sgd"]) < 1e-3  # its first iteration: all-reduce


def _profiled(trace_dir: str) -> dict:
    from notebook_accel import Accelerator, ProfileKwargs

    cycles = []
    handler = ProfileKwargs(activities=["cpu"], record_shapes=True, output_trace_dir=trace_dir,
                            schedule_option={"wait": 1, "warmup": 1, "active": 1},
                            on_trace_ready=lambda prof: cycles.append(len(prof.key_averages())))
    accelerator = Accelerator(kwargs_handlers=[handler])
    model = accelerator.prepare(_model())
    with accelerator.profile() as prof:
        for _ in range(3):
            model(torch.ones(8, 4)).sum().backward()
            prof.step()
    return {"cycles": len(cycles), "events": cycles[0] if cycles else 0}


def test_profile_writes_one_chrome_trace_per_process(tmp_path):
    results = notebook_launcher(_profiled, args=(str(tmp_path),), num_processes=2, return_all=True)
    assert [r["cycles"] for r in results] == [1, 1] and all(r["events"] > 0 for r in results)
    for rank in (0, 1):
        trace = json.loads((tmp_path / f"profile_{rank}.json").read_text())
        names = {event.get("name") for event in trace["traceEvents"]}
        assert "aten::linear" in names or "aten::mm" in names, sorted(n for n in names if n)[:20]
