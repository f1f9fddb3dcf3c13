"""Item 7b: training-step throughput of a ~48M-parameter transformer in bf16 on the GPU.

The same model, data and AdamW step through our ``Accelerator``, the peer's (Hugging Face
Accelerate) and a plain ``torch.autocast`` loop; each variant runs in a fresh process, the three
alternate over two rounds (``GPU_CHECK_ROUNDS``) and each keeps its best round. Prints steps/s and the ratios
ours/peer and ours/plain torch. Without a GPU a tiny model runs two steps of each (N/A).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch
from common import GPU, Report

SIZES = ({"vocab": 32768, "dim": 512, "layers": 10, "batch": 16, "seq": 256, "warmup": 10, "steps": 40} if GPU
         else {"vocab": 128, "dim": 32, "layers": 1, "batch": 2, "seq": 8, "warmup": 1, "steps": 2})
VARIANTS = ("torch", "ours", "peer")


class LM(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, 8 if dim >= 64 else 2, 4 * dim, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))


def one_variant(variant: str) -> dict:
    """Run one variant in this process; returns steps/s and the parameter count."""
    s = SIZES
    device = torch.device("cuda" if GPU else "cpu")
    torch.manual_seed(0)
    model = LM(s["vocab"], s["dim"], s["layers"])
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, s["vocab"], (s["batch"], s["seq"] + 1), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)

    if variant == "torch":
        model.to(device)

        def step() -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
    else:
        if variant == "ours":
            from notebook_accel import Accelerator
        else:
            from accelerate import Accelerator
        acc = Accelerator(mixed_precision="bf16", cpu=not GPU)
        model, opt = acc.prepare(model, opt)

        def step() -> None:
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
            acc.backward(loss)
            opt.step()
            opt.zero_grad()

    for _ in range(s["warmup"]):
        step()
    if GPU:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(s["steps"]):
        step()
    if GPU:
        torch.cuda.synchronize()
    return {"steps_per_s": s["steps"] / (time.perf_counter() - start), "params": params}


def compare() -> tuple[bool, dict, str]:
    best: dict[str, float] = {}
    params = 0
    for _ in range(int(os.environ.get("GPU_CHECK_ROUNDS", "2"))):
        for variant in VARIANTS:
            out = subprocess.run([sys.executable, __file__, variant], capture_output=True, text=True, timeout=240)
            if out.returncode != 0:
                return False, {}, f"{variant} failed:\n{out.stderr[-3000:]}"
            result = json.loads(out.stdout.strip().splitlines()[-1])
            params = result["params"]
            best[variant] = max(best.get(variant, 0.0), result["steps_per_s"])
    figures = {"params_m": round(params / 1e6, 1), **{f"{k}_steps_per_s": round(v, 2) for k, v in best.items()},
               "ours_over_peer": round(best["ours"] / best["peer"], 3),
               "ours_over_torch": round(best["ours"] / best["torch"], 3)}
    return figures["ours_over_torch"] >= 0.9 or not GPU, figures, "goal: ours/torch >= 0.9 (reported, not tuned)"


def main() -> None:
    report = Report()
    report.run("7b", "bf16 step throughput of a ~48M transformer: ours / peer / plain torch", compare)
    report.emit()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(one_variant(sys.argv[1])))
    else:
        main()
