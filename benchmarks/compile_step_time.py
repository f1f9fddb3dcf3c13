"""Step time of models compiled through the Accelerator vs eager, on the CPU (one process).

For a small MLP and a small stack of transformer blocks: the compile time (the first training
step, with an empty inductor cache, so the compiler really works) and the median step time
after warm-up, eager / compiled whole / compiled by regions (each repeated block on its own).
Run::

    python benchmarks/compile_step_time.py [ROUNDS] [STEPS] [BACKEND]

The compile times are measured first, each from a cold compiler; then the three prepared models
take turns, ROUNDS times STEPS steps each, so that load on the machine drifts out of the ratios.
Prints one line per model and mode, then the ratios eager/compiled (above 1: compiled is faster).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
BACKEND = sys.argv[3] if len(sys.argv) > 3 else "inductor"
WARMUP = 3

import torch  # noqa: E402

from notebook_accel import Accelerator, TorchDynamoPlugin  # noqa: E402


def cold_compiler() -> None:
    """Forget every compiled graph, and point inductor at an empty cache: the next compile is cold."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_bench_")
    torch._dynamo.reset()
    torch._inductor.utils.clear_inductor_caches()


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                               torch.nn.GELU(), torch.nn.Linear(1024, 10))


class Blocks(torch.nn.Module):
    """Four pre-norm transformer encoder blocks and a head."""

    def __init__(self, width: int = 128, depth: int = 4) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(depth))
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))


MODELS = {"mlp": (mlp, (64, 256)), "transformer blocks": (Blocks, (16, 64, 128))}


def warm_compiler() -> None:
    """Pay the compiler's once-per-process start (imports, worker pool) before anything is timed; a
    function, not a module, whose shapes would make the models' first compile dynamic."""
    weight = torch.randn(4, 4, requires_grad=True)
    torch.compile(lambda x: torch.tanh(x @ weight).sum(), backend=BACKEND)(torch.randn(2, 4)).backward()


def prepared(build, shape, plugin: TorchDynamoPlugin):
    """One training step function of a freshly prepared model, and the seconds its first step took."""
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin)
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = torch.randn(*shape), torch.randint(0, 10, (shape[0],))

    def step() -> float:
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - start

    return step, step()


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, backend {BACKEND}, "
          f"{ROUNDS} rounds of {STEPS} steps after {WARMUP} warm-up, modes alternating")
    modes = {"eager": TorchDynamoPlugin(backend="no"),
             "compiled": TorchDynamoPlugin(backend=BACKEND),
             "regional": TorchDynamoPlugin(backend=BACKEND, use_regional_compilation=True)}
    warm_compiler()
    for name, (build, shape) in MODELS.items():
        compile_time = {}
        for mode, plugin in modes.items():  # cold: each compiles from nothing
            cold_compiler()
            compile_time[mode] = prepared(build, shape, plugin)[1]
        torch._dynamo.reset()
        steps = {mode: prepared(build, shape, plugin)[0] for mode, plugin in modes.items()}
        for step in steps.values():
            for _ in range(WARMUP):
                step()
        rounds: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(ROUNDS):  # alternating, so the machine's load drifts out of the ratios
            for mode, step in steps.items():
                rounds[mode].append(statistics.median(step() for _ in range(STEPS)))
        for mode in modes:
            print(f"{name:20s} {mode:9s} first step {compile_time[mode]:7.2f} s   "
                  f"step {statistics.median(rounds[mode]) * 1e3:8.2f} ms")
        ratio = {mode: statistics.median(e / c for e, c in zip(rounds["eager"], rounds[mode], strict=True))
                 for mode in ("compiled", "regional")}
        print(f"{name:20s} eager/compiled {ratio['compiled']:.2f}x, eager/regional {ratio['regional']:.2f}x "
              f"(median per round); compile time whole {compile_time['compiled'] - compile_time['eager']:.1f} s, "
              f"regional {compile_time['regional'] - compile_time['eager']:.1f} s")


if __name__ == "__main__":
    main()
