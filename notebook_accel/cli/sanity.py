"""A short, real training run that checks distributed training works on this machine.

``run_sanity_check`` trains a small linear model with the ``Accelerator`` on N
workers (data loader sharding, DDP gradient averaging, gather) and compares the
result with the same training done in this process alone: with the global batch
the same, the weights must agree. Used by ``%accelerate test``; a CLI or a config
panel can call it too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from notebook_accel.launch.planning.request import LaunchRequest

FEATURES = 8
BATCH_PER_PROCESS = 8
STEPS = 20
LEARNING_RATE = 0.05
_TOLERANCE = {"no": 1e-4}  # max weight difference to the reference; mixed precision: 5e-2


@dataclass
class WorkerReport:
    """What rank 0 reports about the distributed run."""

    world_size: int
    ranks: list[int]
    weights: Any  # torch.Tensor on the CPU, flattened
    rank_spread: float  # largest weight difference between any rank and rank 0
    loss_before: float
    loss_after: float
    device: str
    mixed_precision: str


def _problem(world_size: int) -> tuple[Any, Any, Any]:
    """The same model and data everywhere: (model, X, y), seeded, no global RNG used."""
    import torch

    generator = torch.Generator().manual_seed(1234)
    size = BATCH_PER_PROCESS * world_size * STEPS
    inputs = torch.randn(size, FEATURES, generator=generator)
    true_weights = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    targets = inputs @ true_weights + 0.5 + 0.01 * torch.randn(size, 1, generator=generator)
    model = torch.nn.Linear(FEATURES, 1)
    with torch.no_grad():
        model.weight.copy_(torch.linspace(0.3, -0.3, FEATURES).unsqueeze(0))
        model.bias.zero_()
    return model, inputs, targets


def _full_loss(model: Any, inputs: Any, targets: Any) -> float:
    import torch

    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(inputs), targets).item()


def _flat_weights(model: Any) -> Any:
    import torch

    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def _train_on_workers() -> WorkerReport:
    """Runs in every worker: prepare, train, and compare the ranks with each other."""
    import torch

    from notebook_accel.accelerator import Accelerator

    accelerator = Accelerator()
    model, inputs, targets = _problem(accelerator.num_processes)
    loss_before = _full_loss(model, inputs, targets)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets),
                                         batch_size=BATCH_PER_PROCESS)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch_inputs, batch_targets in loader:
        loss = torch.nn.functional.mse_loss(model(batch_inputs).float(), batch_targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    plain = accelerator.unwrap_model(model, keep_torch_compile=False)
    weights = _flat_weights(plain)
    every_rank = accelerator.gather(weights.unsqueeze(0))
    ranks = accelerator.gather(torch.tensor([accelerator.process_index], device=weights.device))
    return WorkerReport(
        world_size=accelerator.num_processes, ranks=ranks.tolist(), weights=weights.cpu(),
        rank_spread=(every_rank - every_rank[0]).abs().max().item(),
        loss_before=loss_before, loss_after=_full_loss(plain.cpu().float(), inputs, targets),
        device=str(accelerator.device), mixed_precision=str(accelerator.mixed_precision))


def _train_reference(world_size: int) -> Any:
    """The same training in this process: one batch of ``world_size`` workers' batches per step."""
    import torch

    model, inputs, targets = _problem(world_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    batch = BATCH_PER_PROCESS * world_size
    for start in range(0, len(inputs), batch):
        loss = torch.nn.functional.mse_loss(model(inputs[start:start + batch]),
                                            targets[start:start + batch])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return _flat_weights(model)


def _line(ok: bool, what: str, detail: str) -> bool:
    print(f"  {'PASS' if ok else 'FAIL'}  {what} ({detail})", flush=True)
    return ok


def run_sanity_check(num_processes: int | None = 2, request: LaunchRequest | None = None,
                     **launch_options: Any) -> bool:
    """Train a small model on ``num_processes`` workers and check the result.

    Prints one PASS/FAIL line per check and a verdict, like ``accelerate test``.

    Args:
        num_processes: workers to start (None: the launcher's default).
        request: the options a front door checked (the CLI's or the magic's flags), passed on
            as they are, so an error names their flags; ``num_processes`` over its count.
        **launch_options: instead of ``request``: passed on to ``notebook_launcher``
            (``mixed_precision``, ``start_method``, ``device``, ``config_file``, ``timeout``...).
    Returns:
        True when every check passed.

    Example:
        >>> run_sanity_check(2, start_method="spawn")  # doctest: +SKIP
    """
    from notebook_accel.launch.launcher import launch_request, notebook_launcher
    from notebook_accel.launch.supervision.errors import WorkerError

    if request is not None and launch_options:
        raise TypeError("give the launch options as request or as keywords, not both")

    shown = num_processes if num_processes is not None else "the default number of"
    print(f"notebook_accel sanity check: training a small model on {shown} workers", flush=True)
    try:
        if request is None:
            report = notebook_launcher(_train_on_workers, num_processes=num_processes,
                                       **launch_options)
        else:
            if num_processes is not None and request.get("num_processes") != num_processes:
                request = request.replaced(num_processes=num_processes)
            report = launch_request(_train_on_workers, request)
    except WorkerError as error:
        _line(False, "the workers trained", str(error))
        print("Test failed: distributed training does not work here (see above).", flush=True)
        return False
    reference = _train_reference(report.world_size)
    tolerance = _TOLERANCE.get(report.mixed_precision, 5e-2)
    difference = (report.weights - reference).abs().max().item()
    print(f"  world size {report.world_size}, device {report.device}, "
          f"mixed precision {report.mixed_precision}", flush=True)
    checks = [
        _line(report.ranks == list(range(report.world_size)), "every rank joined the job",
              f"ranks {report.ranks}"),
        _line(report.loss_after < report.loss_before, "the loss went down",
              f"{report.loss_before:.4f} -> {report.loss_after:.4f}"),
        _line(report.rank_spread <= 1e-6, "all ranks hold the same weights",
              f"largest difference {report.rank_spread:.1e}"),
        _line(difference <= tolerance, "the weights match a single-process run",
              f"largest difference {difference:.1e}, tolerance {tolerance:.0e}"),
    ]
    if all(checks):
        print("Test is a success! Distributed training works on this machine.", flush=True)
        return True
    print("Test failed: see the FAIL lines above.", file=sys.stderr, flush=True)
    return False
