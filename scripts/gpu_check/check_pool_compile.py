"""Item 8: what came after the first GPU run: a warm pool on the GPU, and torch.compile.

8a: a ``WorkerPool`` of one rank on the GPU (one GPU: one rank, no process group, as the
peer's one process): one run prepares a model on the device and keeps it; the next run finds
the same model there (same parameters, still on the GPU) and trains it on. 8b: one training function,
eager and with ``dynamo_backend="inductor"``: the compiled losses match the eager ones.
Without a GPU both run on the CPU (inductor's CPU code) and say N/A.
"""

from __future__ import annotations

from common import GPU, Report

from notebook_accel import WorkerPool, notebook_launcher

# The check runs as a script: its functions are ``__main__``'s, so they travel by value, as a
# notebook's do, and on the pool the names ``prepare`` assigns stay for ``train_on``.


def prepare() -> dict:
    global accelerator, model, optimizer
    import torch

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(0)
    net = torch.nn.Linear(32, 4)
    model, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    weight = accelerator.unwrap_model(model).weight
    return {"device": str(weight.device), "sum": float(weight.sum())}


def train_on() -> dict:
    import torch

    weight = accelerator.unwrap_model(model).weight
    before = {"device": str(weight.device), "sum": float(weight.sum())}
    x = torch.randn(16, 32, device=accelerator.device)
    accelerator.backward(model(x).square().mean())
    optimizer.step()
    return {"before": before, "input_device": str(x.device),
            "changed": float(weight.sum()) != before["sum"]}


def losses(dynamo_backend: str) -> list[float]:
    import torch

    from notebook_accel import Accelerator

    torch.backends.cuda.matmul.allow_tf32 = False  # compare like with like
    accelerator = Accelerator(dynamo_backend=dynamo_backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(5):
        x = torch.randn(64, 32, generator=generator).to(accelerator.device)
        y = x.sum(dim=1, keepdim=True).tanh()
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        out.append(loss.item())
    return out


def pool_on_the_gpu() -> tuple[bool, dict, str]:
    want = "cuda:0" if GPU else "cpu"
    with WorkerPool(num_processes=1, output="none") as pool:
        prepared = pool.run(prepare)
        trained = pool.run(train_on)
    passed = (prepared["device"] == want and trained["before"] == prepared
              and trained["input_device"] == want and trained["changed"])
    return passed, {"prepared": prepared, "next_run": trained}, \
        "the model prepared by one run is the next run's, on the device"


def compiled_matches_eager() -> tuple[bool, dict, str]:
    eager = notebook_launcher(losses, args=("no",), num_processes=1, output="none")
    compiled = notebook_launcher(losses, args=("inductor",), num_processes=1, output="none")
    worst = max(abs(a - b) for a, b in zip(eager, compiled, strict=True))
    return worst < 1e-4, {"eager": eager, "compiled": compiled, "max_difference": worst}, \
        "5 steps of one MLP, eager and dynamo_backend='inductor'"


def main() -> None:
    report = Report()
    report.run("8a", "a warm pool on the GPU: the model kept on the device across runs", pool_on_the_gpu)
    report.run("8b", "torch.compile (inductor) through the Accelerator matches eager", compiled_matches_eager)
    report.emit()


if __name__ == "__main__":
    main()
