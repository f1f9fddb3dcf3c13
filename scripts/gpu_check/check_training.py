"""Item 2: one process training on the GPU through ``Accelerator``.

fp32 against a plain torch loop, bf16 autocast, fp16 with the grad scaler (a forced overflow must
skip the step and say so), gradient accumulation against one big batch, and a bit-exact
``save_state`` / ``load_state`` resume (dropout draws from the CUDA generator, so its state must
come back too).
"""

from __future__ import annotations

import tempfile

import torch
from common import DEVICE, GPU, Report, rel_diff

from notebook_accel import Accelerator

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
STEPS = 12


def model(dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(256, 8))


def batches(n: int = STEPS, size: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(size, 64, generator=g), torch.randn(size, 8, generator=g)) for _ in range(n)]


def train(acc: Accelerator | None, net: torch.nn.Module, data, start: int = 0, stop: int = STEPS,
          opt=None) -> tuple[list[float], torch.nn.Module, torch.optim.Optimizer]:
    if opt is None:
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        if acc is not None:
            net, opt = acc.prepare(net, opt)
    device = acc.device if acc is not None else DEVICE
    net.to(device)
    losses = []
    for x, y in data[start:stop]:
        loss = torch.nn.functional.mse_loss(net(x.to(device)).float(), y.to(device))
        (acc.backward(loss) if acc is not None else loss.backward())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, net, opt


def fp32() -> tuple[bool, dict, str]:
    data = batches()
    ref, _, _ = train(None, model(), data)
    acc = Accelerator()
    ours, net, _ = train(acc, model(), data)
    device = str(next(net.parameters()).device)
    diff = rel_diff(ours, ref)
    return diff == 0.0 and device.startswith(DEVICE.type), {"device": device, "loss_rel_vs_torch": diff}, ""


def bf16() -> tuple[bool, dict, str]:
    data = batches()
    ref, _, _ = train(None, model(), data)
    acc = Accelerator(mixed_precision="bf16")
    seen: list[torch.dtype] = []
    net = model()
    net[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    ours, net, _ = train(acc, net, data)
    diff = rel_diff(ours, ref)
    master = {str(p.dtype) for p in net.parameters()}
    passed = seen[0] == torch.bfloat16 and master == {"torch.float32"} and diff < 3e-2
    return passed, {"activation_dtype": str(seen[0]), "master_dtypes": sorted(master), "loss_rel_vs_fp32": diff}, ""


def fp16_overflow() -> tuple[bool, dict, str]:
    acc = Accelerator(mixed_precision="fp16")
    net = model()
    net, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    x, y = batches(1)[0]
    x, y = x.to(acc.device), y.to(acc.device)

    def step(scale: float) -> bool:
        loss = torch.nn.functional.mse_loss(net(x).float(), y) * scale
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        return acc.optimizer_step_was_skipped

    before = [p.detach().clone() for p in net.parameters()]
    skipped_on_inf = step(float("inf"))
    unchanged = all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    skipped_normal = step(1.0)
    changed = not all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    figures = {"skipped_on_overflow": skipped_on_inf, "params_unchanged_by_skipped_step": unchanged,
               "skipped_normal_step": skipped_normal, "params_changed_by_normal_step": changed}
    return skipped_on_inf and unchanged and not skipped_normal and changed, figures, ""


def accumulation() -> tuple[bool, dict, str]:
    (x, y), = batches(1, size=32)
    ref = model().to(DEVICE)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(ref(x.to(DEVICE)), y.to(DEVICE)).backward()
    ref_opt.step()
    acc = Accelerator(gradient_accumulation_steps=4)
    net = model()
    net, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    steps_taken = 0
    for xs, ys in zip(x.chunk(4), y.chunk(4), strict=True):
        with acc.accumulate(net):
            acc.backward(torch.nn.functional.mse_loss(net(xs.to(acc.device)), ys.to(acc.device)))
            opt.step()
            steps_taken += int(acc.sync_gradients)
            opt.zero_grad()
    diff = max((a - b).abs().max().item() for a, b in zip(net.parameters(), ref.parameters(), strict=True))
    return steps_taken == 1 and diff < 1e-6, {"optimizer_steps": steps_taken, "max_param_diff": diff}, ""


def resume() -> tuple[bool, dict, str]:
    data = batches()
    with tempfile.TemporaryDirectory() as folder:
        acc = Accelerator()
        net = model(0.2)
        net, opt = acc.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
        first, _, _ = train(acc, net, data, 0, 6, opt)
        acc.save_state(folder)
        rest, _, _ = train(acc, net, data, 6, STEPS, opt)
        params = [p.detach().clone() for p in net.parameters()]
        acc2 = Accelerator()
        net2 = model(0.2)
        opt2 = torch.optim.AdamW(net2.parameters(), lr=1e-3)
        net2, opt2 = acc2.prepare(net2, opt2)
        torch.manual_seed(999)  # the resume must restore the generators, not rely on them
        if GPU:
            torch.cuda.manual_seed(999)
        acc2.load_state(folder)
        resumed, _, _ = train(acc2, net2, data, 6, STEPS, opt2)
    exact = resumed == rest and all(torch.equal(a, b) for a, b in zip(params, net2.parameters(), strict=True))
    return exact, {"losses_after_resume_equal": resumed == rest, "device": str(acc2.device)}, ""


def main() -> None:
    report = Report()
    report.run("2a", "fp32 through Accelerator equals plain torch", fp32)
    report.run("2b", "bf16 autocast, fp32 master weights", bf16)
    if GPU:
        report.run("2c", "fp16 grad scaler: forced overflow skips the step", fp16_overflow)
    else:
        report.skip("2c", "fp16 grad scaler: forced overflow skips the step", "fp16 with the grad scaler needs CUDA")
    report.run("2d", "gradient accumulation (4 x 8) equals one batch of 32", accumulation)
    report.run("2e", "save_state / load_state resume is bit-exact", resume)
    report.emit()


if __name__ == "__main__":
    main()
