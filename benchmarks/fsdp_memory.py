"""Step time and peak memory per rank: DDP vs FSDP2 (ours) and the peer's, same model, same run.

A GPT-style transformer of about 50M parameters (tied embedding/head) trains with
AdamW on 2 CPU processes (gloo) for ``--steps`` steps after one warm-up step, in
four launches of fresh (spawned) workers: ours with DDP, ours with FSDP2
(``TRANSFORMER_BASED_WRAP`` on each block, ``reshard_after_forward``), then the
peer's ``Accelerator`` the same two ways (``FullyShardedDataParallelPlugin(fsdp_version=2)``).
Each rank reports its median step time, the parameter bytes it holds, and its peak
RSS growth over the RSS it had before building the model (``ru_maxrss``), so what
training adds: weights, gradients, Adam state, activations, communication buffers.

    python benchmarks/fsdp_memory.py [--steps 5] [--layers 14] [--width 512] [--skip-peer]

Step times on a shared CPU machine are noisy; memory is the figure FSDP is about. The workers
run with ``MALLOC_MMAP_THRESHOLD_=131072`` (unless ``--default-malloc``): glibc's adaptive
threshold otherwise keeps freed multi-MB blocks (FSDP's per-layer gather buffers) on a
fragmenting heap, and RSS then grows step after step while the live memory does not.
"""

from __future__ import annotations

import argparse
import os
import statistics

from notebook_accel import notebook_launcher

VOCAB, SEQ, BATCH = 8192, 64, 2


def train(strategy: str, peer: bool, steps: int, layers: int, width: int) -> dict:
    """One rank's run; returns its figures."""
    import resource
    import time

    import psutil
    import torch

    torch.set_num_threads(1)
    # What any run pays once (torch.distributed's FSDP/DTensor modules, the optimizer's lazy
    # imports), before the baseline: the growth is then what this model's training adds.
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

    warm = torch.nn.Linear(2, 2)
    torch.optim.AdamW(warm.parameters()).step()

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
            self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
            self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, 8, width // 8).permute(2, 0, 3, 1, 4)
            attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attn.transpose(1, 2).reshape(b, t, width))
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))

    class GPT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, width)
            self.blocks = torch.nn.Sequential(*[Block() for _ in range(layers)])
            self.norm = torch.nn.LayerNorm(width)
            self.head = torch.nn.Linear(width, VOCAB, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.norm(self.blocks(self.embed(tokens))))

    if peer:
        import accelerate

        plugin = None
        if strategy == "fsdp":
            plugin = accelerate.FullyShardedDataParallelPlugin(
                fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"])
        accelerator = accelerate.Accelerator(cpu=True, fsdp_plugin=plugin)
    else:
        from notebook_accel import Accelerator, FullyShardedDataParallelPlugin

        plugin = None
        if strategy == "fsdp":
            plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                                    transformer_cls_names_to_wrap=["Block"])
        accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    accelerator.wait_for_everyone()
    start_rss = psutil.Process().memory_info().rss
    torch.manual_seed(0)
    model = GPT()
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    held = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size() for p in model.parameters())
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(accelerator.process_index))
    times = []
    for _ in range(steps + 1):
        began = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rank": accelerator.process_index, "type": str(accelerator.distributed_type).split(".")[-1],
            "params": total, "held_mb": held / 2**20, "step_s": statistics.median(times[1:]),
            "peak_growth_mb": (peak - start_rss) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=14)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--skip-peer", action="store_true", help="only our two strategies")
    parser.add_argument("--mmap-threshold", type=int, default=4 << 20, metavar="BYTES",
                        help="glibc's MALLOC_MMAP_THRESHOLD_ in the workers; 0: glibc's adaptive default")
    args = parser.parse_args()
    if args.mmap_threshold:  # read by each spawned worker's C library at start-up
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    runs = [("ours", "ddp"), ("peer", "ddp"), ("ours", "fsdp"), ("peer", "fsdp")]  # interleaved: load drifts
    if args.skip_peer:
        runs = [run for run in runs if run[0] == "ours"]
    print(f"{'who':5} {'asked':5} {'ran as':10} {'rank':>4} {'params':>7} {'held MB':>8} {'step s':>7} "
          f"{'peak +MB':>9}")
    for who, strategy in runs:
        results = notebook_launcher(train, (strategy, who == "peer", args.steps, args.layers, args.width),
                                    num_processes=2, device="cpu", start_method="spawn", return_all=True,
                                    output="none")
        for r in results:
            print(f"{who:5} {strategy:5} {r['type']:10} {r['rank']:>4} {r['params'] / 1e6:>6.1f}M "
                  f"{r['held_mb']:>8.1f} {r['step_s']:>7.3f} {r['peak_growth_mb']:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
