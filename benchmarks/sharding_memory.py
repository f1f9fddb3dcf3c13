"""Step time and peak memory per rank: DDP, FSDP2, DeepSpeed ZeRO-2 and ZeRO-3, ours and the peer's, same run.

A GPT-style transformer of about 50M parameters (tied embedding/head) trains with
AdamW on 2 CPU processes (gloo) for ``--steps`` steps after one warm-up step, each
(implementation, strategy) in a launch of fresh (spawned) workers, ours and the peer's
interleaved:

- ``ddp``: ``Accelerator(cpu=True)``;
- ``fsdp``: FSDP2, ours with ``TRANSFORMER_BASED_WRAP`` on each block (``reshard_after_forward``),
  the peer's with ``FullyShardedDataParallelPlugin(fsdp_version=2)`` the same way;
- ``zero2`` / ``zero3``: ``Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2 or 3))``
  (not ``cpu=True``: the peer's then drops the plugin and runs DDP), model, optimizer and a data loader (per-process batch 2) in one ``prepare`` call, the returned
  DeepSpeed engine doing backward and step in ``accelerator.backward`` (``optimizer.step()`` /
  ``zero_grad()`` stay in the loop and are no-ops).

Each rank reports its median step time, the parameter bytes it holds (FSDP2: the local
shard of each ``DTensor``; ZeRO-3: each parameter's ``ds_tensor`` partition) and its peak
RSS growth over the RSS it had before building the model (``ru_maxrss``), so what training
adds: weights, gradients, optimizer state, activations, communication buffers. The table
has one row per (implementation, strategy) (a range where the two ranks differ), then the
ratios ours/peer per strategy where both ran and each of our sharded strategies against
our DDP. A run that fails (the peer's DeepSpeed path on CPU without ``transformers``, for
one) prints its row with the exception's first line instead of figures.

    python benchmarks/sharding_memory.py [--steps 5] [--layers 14] [--width 512] [--skip-peer]
                                         [--strategies ddp,fsdp,zero2,zero3] [--zero-config JSON]

``--zero-config benchmarks/zero3_lean.json`` gives our ZeRO runs DeepSpeed settings that trade
speed for memory (gather each parameter when used, free it right after, small buckets).

Step times on a shared CPU machine are noisy; memory is the figure sharding is about. The
workers run with ``MALLOC_MMAP_THRESHOLD_=4194304`` (``--mmap-threshold``; 0: glibc's
adaptive default): glibc's adaptive threshold otherwise keeps freed multi-MB blocks (FSDP's
per-layer gather buffers) on a fragmenting heap, and RSS then grows step after step while
the live memory does not. DeepSpeed is imported (with ``DS_BUILD_OPS=0``, as our runtime
does) before the baseline in the ZeRO runs; its first run compiles one small C++ op
(cached in ``~/.cache/torch_extensions``), in the warm-up step, which is not timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import traceback

from notebook_accel import notebook_launcher

VOCAB, SEQ, BATCH = 8192, 64, 2
STRATEGIES = ("ddp", "fsdp", "zero2", "zero3")
NAMES = {"ddp": "DDP", "fsdp": "FSDP2", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


def held_bytes(parameters) -> int:
    """The parameter bytes this rank holds: a DTensor's local shard, a ZeRO-3 partition, else the tensor."""
    total = 0
    for p in parameters:
        if hasattr(p, "ds_tensor"):
            total += p.ds_tensor.numel() * p.ds_tensor.element_size()
        else:
            total += (p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
    return total


def train(strategy: str, peer: bool, steps: int, layers: int, width: int, zero_config: str | None = None) -> dict:
    """One rank's run; returns its figures, or ``{"error": first line, "traceback": ...}``."""
    try:
        return _train(strategy, peer, steps, layers, width, zero_config)
    except Exception as err:  # noqa: BLE001 - the row reports it
        first = (str(err).strip().splitlines() or [""])[0]
        return {"rank": int(os.environ.get("RANK", -1)), "error": f"{type(err).__name__}: {first}",
                "traceback": traceback.format_exc()}


def _train(strategy: str, peer: bool, steps: int, layers: int, width: int, zero_config: str | None) -> dict:
    import resource
    import time

    import psutil
    import torch

    torch.set_num_threads(1)
    zero = strategy.startswith("zero")
    # What any run pays once (torch.distributed's FSDP/DTensor modules, the optimizer's lazy
    # imports, DeepSpeed), before the baseline: the growth is then what this model's training adds.
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor  # noqa: F401
    if zero:
        os.environ.setdefault("DS_BUILD_OPS", "0")
        import deepspeed  # noqa: F401

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

        fsdp_plugin = deepspeed_plugin = None
        if strategy == "fsdp":
            fsdp_plugin = accelerate.FullyShardedDataParallelPlugin(
                fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"])
        elif zero:
            deepspeed_plugin = accelerate.DeepSpeedPlugin(zero_stage=int(strategy[-1]))
        accelerator = accelerate.Accelerator(cpu=not zero, fsdp_plugin=fsdp_plugin, deepspeed_plugin=deepspeed_plugin)
    else:
        from notebook_accel import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin

        fsdp_plugin = deepspeed_plugin = None
        if strategy == "fsdp":
            fsdp_plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                                         transformer_cls_names_to_wrap=["Block"])
        elif zero:
            deepspeed_plugin = DeepSpeedPlugin(zero_stage=int(strategy[-1]), hf_ds_config=zero_config)
        accelerator = Accelerator(cpu=not zero, fsdp_plugin=fsdp_plugin, deepspeed_plugin=deepspeed_plugin)
    accelerator.wait_for_everyone()
    start_rss = psutil.Process().memory_info().rss
    torch.manual_seed(0)
    model = GPT()
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(accelerator.process_index)
    if zero:
        # DeepSpeed's micro batch comes from the loader prepared with the engine, as a user's would.
        data = torch.randint(0, VOCAB, (BATCH * accelerator.num_processes, SEQ + 1), generator=torch.Generator())
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=BATCH)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        (tokens,) = next(iter(loader))
    else:
        model, optimizer = accelerator.prepare(model, optimizer)
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
    held = held_bytes(model.parameters())
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


def span(values: list[float], digits: int) -> str:
    """``"a"`` or ``"lo-hi"`` where the ranks differ (at the printed precision)."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo}-{hi}"


def summary_row(who: str, strategy: str, results: list[dict] | str) -> str:
    head = f"{who:5} {NAMES[strategy]:7}"
    failed = results if isinstance(results, str) else next((r["error"] for r in results if "error" in r), None)
    if failed is not None:
        return f"{head} FAILED: {failed}"
    return (f"{head} {results[0]['type']:10} {results[0]['params'] / 1e6:>6.1f}M "
            f"{span([r['step_s'] for r in results], 3):>13} {span([r['held_mb'] for r in results], 1):>13} "
            f"{span([r['peak_growth_mb'] for r in results], 1):>15}")


def ratios(a: list[dict], b: list[dict]) -> str:
    """Step time, held bytes and peak growth of ``a`` over ``b`` (each: the larger rank's figure)."""
    def worst(results: list[dict], key: str) -> float:
        return max(r[key] for r in results)

    return "  ".join(f"{name} {worst(a, key) / worst(b, key):.2f}x" for name, key in
                     (("step", "step_s"), ("held", "held_mb"), ("peak", "peak_growth_mb")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=14)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--skip-peer", action="store_true", help="only our runs")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma list of {','.join(STRATEGIES)} (default: all)")
    parser.add_argument("--mmap-threshold", type=int, default=4 << 20, metavar="BYTES",
                        help="glibc's MALLOC_MMAP_THRESHOLD_ in the workers; 0: glibc's adaptive default")
    parser.add_argument("--zero-config", metavar="JSON", help="our ZeRO runs start from this DeepSpeed "
                        "config (e.g. benchmarks/zero3_lean.json); the stage still comes from --strategies")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launch before it is stopped")
    args = parser.parse_args()
    strategies = [s.strip().lower() for s in args.strategies.split(",") if s.strip()]
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown or not strategies:
        parser.error(f"--strategies: unknown {', '.join(unknown) or '(none given)'}; choose from {','.join(STRATEGIES)}")
    strategies = [s for s in STRATEGIES if s in strategies]
    if args.mmap_threshold:  # read by each spawned worker's C library at start-up
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    whos = ["ours"] if args.skip_peer else ["ours", "peer"]
    runs = [(who, strategy) for strategy in strategies for who in whos]  # interleaved: load drifts
    done: dict[tuple[str, str], list[dict] | str] = {}
    print(f"{'who':5} {'asked':7} {'ran as':10} {'rank':>4} {'params':>7} {'held MB':>8} {'step s':>7} "
          f"{'peak +MB':>9}")
    for who, strategy in runs:
        try:
            results = notebook_launcher(train, (strategy, who == "peer", args.steps, args.layers, args.width,
                                                args.zero_config),
                                        num_processes=2, device="cpu", start_method="spawn", return_all=True,
                                        output="none", timeout=args.timeout)
        except Exception as err:  # noqa: BLE001 - a failed launch is a row too
            first = (str(err).strip().splitlines() or [""])[0]
            done[who, strategy] = f"{type(err).__name__}: {first}"
            print(f"{who:5} {NAMES[strategy]:7} launch failed: {done[who, strategy]}", flush=True)
            if who == "ours":
                traceback.print_exc()
            continue
        results = sorted(results, key=lambda r: r["rank"])
        done[who, strategy] = results
        for r in results:
            if "error" in r:
                print(f"{who:5} {NAMES[strategy]:7} {'':10} {r['rank']:>4} failed: {r['error']}", flush=True)
                if who == "ours":
                    print(r["traceback"], file=sys.stderr, flush=True)
                continue
            print(f"{who:5} {NAMES[strategy]:7} {r['type']:10} {r['rank']:>4} {r['params'] / 1e6:>6.1f}M "
                  f"{r['held_mb']:>8.1f} {r['step_s']:>7.3f} {r['peak_growth_mb']:>9.1f}", flush=True)

    print(f"\nper rank (a range where the 2 ranks differ), {args.steps} steps after 1 warm-up:")
    print(f"{'who':5} {'asked':7} {'ran as':10} {'params':>7} {'median step s':>13} {'params MB':>13} "
          f"{'peak RSS +MB':>15}")
    for who, strategy in runs:
        print(summary_row(who, strategy, done[who, strategy]))

    def ok(key: tuple[str, str]) -> list[dict] | None:
        results = done.get(key)
        return results if isinstance(results, list) and all("error" not in r for r in results) else None

    lines = []
    for strategy in strategies:
        ours, theirs = ok(("ours", strategy)), ok(("peer", strategy))
        if ours and theirs:
            ran = "" if theirs[0]["type"] == ours[0]["type"] else f"  (the peer ran as {theirs[0]['type']})"
            lines.append(f"ours/peer {NAMES[strategy]:7}: {ratios(ours, theirs)}{ran}")
        elif not args.skip_peer:
            lines.append(f"ours/peer {NAMES[strategy]:7}: - ({'ours' if not ours else 'the peer'} did not run)")
    base = ok(("ours", "ddp"))
    for strategy in strategies:
        ours = ok(("ours", strategy))
        if strategy != "ddp" and base and ours:
            lines.append(f"ours {NAMES[strategy]} / ours DDP: {ratios(ours, base)}")
    if lines:
        print("\nratios (the larger rank's figures):")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
