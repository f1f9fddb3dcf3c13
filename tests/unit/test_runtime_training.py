"""Training-step semantics in one process: accumulation, optimizer/scheduler wrappers, precision."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator
from notebook_accel.runtime.gradient_state import GradientState
from notebook_accel.runtime.optim import AcceleratedOptimizer, AcceleratedScheduler


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("NOTEBOOK_ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION", "NOTEBOOK_ACCEL_DEVICE"):
        monkeypatch.delenv(name, raising=False)


def data(n: int = 24) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def test_accumulation_matches_one_big_batch():
    acc = Accelerator(gradient_accumulation_steps=3)
    m = model()
    m, opt, loader = acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1), DataLoader(data(), batch_size=2))
    syncs = []
    for x, y in loader:
        with acc.accumulate(m):
            acc.backward(torch.nn.functional.mse_loss(m(x), y))
            syncs.append(acc.sync_gradients)
            opt.step()
            opt.zero_grad()
    assert syncs == [False, False, True] * 4
    ref = model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x, y in DataLoader(data(), batch_size=6):
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    assert torch.allclose(m.weight, ref.weight, atol=1e-6) and torch.allclose(m.bias, ref.bias, atol=1e-6)


def test_end_of_dataloader_forces_a_sync():
    acc = Accelerator(gradient_accumulation_steps=4)
    loader = acc.prepare(DataLoader(data(10), batch_size=2))  # 5 batches
    syncs = []
    for _ in loader:
        with acc.accumulate():
            syncs.append(acc.sync_gradients)
    assert syncs == [False, False, False, True, True]
    assert acc.gradient_state.step == 0


def test_optimizer_skips_step_and_zero_grad_while_accumulating():
    m = model()
    state = GradientState(2)
    opt = AcceleratedOptimizer(torch.optim.SGD(m.parameters(), lr=1.0), state)
    m(torch.ones(1, 3)).sum().backward()
    before = m.weight.detach().clone()
    state.sync_gradients = False
    opt.step()
    opt.zero_grad()
    assert torch.equal(m.weight, before) and m.weight.grad is not None
    state.sync_gradients = True
    opt.step()
    opt.zero_grad()
    assert not torch.equal(m.weight, before) and m.weight.grad is None
    assert opt.param_groups[0]["lr"] == 1.0 and not opt.step_was_skipped


@pytest.mark.parametrize(("split", "expected"), [(False, 4), (True, 2)])
def test_scheduler_steps_num_processes_times_per_optimizer_step(split, expected):
    m = model()
    state = GradientState(1)
    raw = torch.optim.SGD(m.parameters(), lr=1.0)
    opt = AcceleratedOptimizer(raw, state)
    sched = AcceleratedScheduler(torch.optim.lr_scheduler.StepLR(raw, 1, 0.5), [opt], state,
                                 num_processes=2, split_batches=split)
    for sync in (True, False, True):
        state.sync_gradients = sync
        opt.step()
        sched.step()
    assert sched.scheduler.last_epoch == expected


def test_one_cycle_scheduler_is_not_stepped_past_its_total():
    m = model()
    state = GradientState(1)
    raw = torch.optim.SGD(m.parameters(), lr=1.0)
    opt = AcceleratedOptimizer(raw, state)
    sched = AcceleratedScheduler(torch.optim.lr_scheduler.OneCycleLR(raw, 1.0, total_steps=5), [opt], state, 4)
    for _ in range(3):
        opt.step()
        sched.step()  # 12 steps asked, only 5 allowed
    assert sched.scheduler.last_epoch == 5


def test_fp16_on_cpu_uses_torch_cpu_scaler_and_reports_skipped_steps():
    acc = Accelerator(mixed_precision="fp16", scaler_kwargs={"init_scale": 1024.0})
    assert acc.scaler is not None and acc.scaler.is_enabled() and acc.scaler.get_scale() == 1024.0
    m = model()
    raw = torch.optim.SGD(m.parameters(), lr=0.1)
    sched_raw = torch.optim.lr_scheduler.StepLR(raw, 1, 0.5)
    m, opt, sched = acc.prepare(m, raw, sched_raw)
    x = torch.ones(2, 3)
    out = m(x)
    assert out.dtype == torch.float32  # forward under autocast, output back to fp32
    acc.backward(out.sum() * float("inf"))
    before = m.weight.detach().clone()
    opt.step()
    sched.step()
    assert acc.optimizer_step_was_skipped and torch.equal(m.weight, before)
    assert sched_raw.last_epoch == 0  # a skipped optimizer step skips the scheduler
    opt.zero_grad()
    acc.backward(m(x).sum())
    opt.step()
    sched.step()
    assert not acc.optimizer_step_was_skipped and not torch.equal(m.weight, before)
    assert sched_raw.last_epoch == 1


def test_fp16_clip_grad_norm_unscales_first():
    acc = Accelerator(mixed_precision="fp16", scaler_kwargs={"init_scale": 1024.0})
    m = model()
    m, opt = acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1))
    acc.backward(m(torch.ones(1, 3)).sum())
    norm = acc.clip_grad_norm_(m.parameters(), 1e9)
    expected = torch.tensor([1.0, 1.0, 1.0, 1.0]).norm()  # d(sum)/dw = x = 1, d/db = 1
    assert torch.allclose(norm, expected, rtol=1e-3)
    acc.clip_grad_norm_(m.parameters(), 1e9)  # a second call in the same step is fine
    opt.step()


def test_bf16_autocast_and_unwrap_model():
    acc = Accelerator(mixed_precision="bf16")
    m = acc.prepare(torch.nn.Sequential(model()))
    inner = []
    m[0].register_forward_hook(lambda mod, inp, out: inner.append(out.dtype))
    assert m(torch.ones(2, 3)).dtype == torch.float32 and inner == [torch.bfloat16]
    with acc.autocast():
        assert torch.nn.functional.linear(torch.ones(1, 3), torch.ones(1, 3)).dtype == torch.bfloat16

    class Off:
        enabled = False

    with acc.autocast(autocast_handler=Off()):
        assert torch.nn.functional.linear(torch.ones(1, 3), torch.ones(1, 3)).dtype == torch.float32
    plain = acc.unwrap_model(m, keep_fp32_wrapper=False)
    assert plain is m and "forward" not in vars(plain)
    inner.clear()
    assert m(torch.ones(2, 3)).dtype == torch.float32 and inner == [torch.float32]


def test_clip_grad_value_and_backward_divides_by_accumulation_steps():
    acc = Accelerator(gradient_accumulation_steps=4)
    m = acc.prepare(model())
    acc.backward(m(torch.ones(1, 3)).sum())
    assert torch.allclose(m.weight.grad, torch.full((1, 3), 0.25))
    acc.clip_grad_value_(m.parameters(), 0.1)
    assert torch.allclose(m.weight.grad, torch.full((1, 3), 0.1))


def test_prepare_keeps_order_and_passes_other_objects_through():
    acc = Accelerator()
    m = model()
    raw = torch.optim.SGD(m.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(raw, 1)
    marker = object()
    out = acc.prepare(sched, m, marker, raw)
    assert isinstance(out[0], AcceleratedScheduler) and out[0].optimizers[0].optimizer is raw
    assert out[1] is m and out[2] is marker and isinstance(out[3], AcceleratedOptimizer)
    assert acc.free_memory(m, raw) == [None, None] and acc._models == []


def test_gradient_accumulation_plugin_and_process_decorators():
    class Plugin:  # duck-typed like the peer's GradientAccumulationPlugin
        num_steps = 3
        sync_with_dataloader = False
        sync_each_batch = True

    acc = Accelerator(gradient_accumulation_plugin=Plugin())
    assert acc.gradient_accumulation_steps == 3 and not acc.gradient_state.sync_with_dataloader
    assert acc.sync_each_batch
    assert acc.on_last_process(lambda: 1)() == 1 and acc.on_process(lambda: 2, process_index=0)() == 2
    assert acc.on_process(process_index=1)(lambda: 3)() is None
    m = acc.prepare(model())
    with acc.join_uneven_inputs([m], even_batches=False):
        pass


def test_prepared_objects_carry_the_peers_marker_and_are_not_prepared_twice():
    acc = Accelerator()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    loader = DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)
    prepared = acc.prepare(model, optimizer, scheduler, loader)
    assert all(getattr(obj, "_is_accelerate_prepared", False) for obj in prepared)
    other = Accelerator()
    assert other.prepare(prepared[0]) is prepared[0]  # marked: kept as it is
