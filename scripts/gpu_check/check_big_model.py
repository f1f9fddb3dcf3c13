"""Item 5: big-model inference over ``cuda:0`` + CPU + disk with a GPU budget smaller than the model.

The checkpoint (sharded safetensors, ~200 MB) is planned with ``device_map="auto"`` and a third of
the model's size for the GPU and a third for the CPU, so the rest goes to disk; the output must equal
the eagerly loaded model's. Reported: the placement, load time, peak GPU memory against the budget.
Without a GPU the plan is CPU + disk.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from common import GPU, Report

from notebook_accel.big_model import (
    compute_module_sizes,
    init_empty_weights,
    load_checkpoint_and_dispatch,
)
from tests.big_model_support import Net, eager, random_state, write_sharded

WIDTH, BLOCKS = 512, 24


def dispatched() -> tuple[bool, dict, str]:
    torch.backends.cuda.matmul.allow_tf32 = False
    with init_empty_weights():
        model = Net(WIDTH, BLOCKS)
    size = compute_module_sizes(model)[""]
    state = random_state(model)
    x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = eager(Net, state, width=WIDTH, blocks=BLOCKS)(x)
    budget = {0: size // 3, "cpu": size // 3} if GPU else {"cpu": size // 2}
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = write_sharded(state, Path(folder) / "ckpt", shards=4)
        if GPU:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        model = load_checkpoint_and_dispatch(model, checkpoint, device_map="auto", max_memory=budget,
                                             no_split_module_classes=["Block"],
                                             offload_folder=Path(folder) / "offload")
        load_s = time.perf_counter() - start
        with torch.no_grad():
            out = model(x.to("cuda" if GPU else "cpu")).cpu()
        peak = torch.cuda.max_memory_allocated() if GPU else 0
    placement = dict(Counter(str(v) for v in model.hf_device_map.values()))
    close = torch.allclose(out, expected, rtol=1e-4, atol=1e-5)
    wanted = {"0", "cpu", "disk"} if GPU else {"cpu", "disk"}
    figures = {"model_mb": size >> 20, "gpu_budget_mb": budget.get(0, 0) >> 20, "placement": placement,
               "load_s": round(load_s, 2), "peak_gpu_mb": peak >> 20,
               "max_abs_diff": float((out - expected).abs().max())}
    passed = close and set(placement) == wanted and (peak < size or not GPU)
    return passed, figures, ""


def main() -> None:
    report = Report()
    report.run("5", "device_map='auto' over cuda:0 + CPU + disk equals the eager model", dispatched)
    report.emit()


if __name__ == "__main__":
    main()
