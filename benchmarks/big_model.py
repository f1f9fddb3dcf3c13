"""Big-model inference: our load_checkpoint_and_dispatch vs the peer's, same model, same budget.

Builds a random fp32 checkpoint (default: 3 GiB, 24 residual MLP blocks of width 2048, 6
safetensors shards with an index, the Hub's layout), then loads it with ``device_map="auto"`` and a
CPU budget (default 1 GiB) in a fresh process per loader (eager ``load_state_dict``, ours, the
peer's), rounds alternating. Run::

    .venv/bin/python benchmarks/big_model.py [--width 2048] [--blocks 24] [--budget 1GiB] [--rounds 1]

Prints, per loader: load time, warm forward time (batch 16; best of the 2nd..4th forward) and its
ratio to eager, then the forward times again with all three models in one process run in turn
(robust to the machine's load shifting), peak anonymous RSS and peak total (anonymous + file-backed) RSS above the baseline,
bytes written to the offload folder, and whether the output is bitwise equal to eager. The page
cache is warmed before each measurement. Needs ``accelerate`` (the ``bench`` extra). The checkpoint
is deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from notebook_accel.big_model.memory import parse_size  # noqa: E402
from tests.big_model_support import probe, write_net_checkpoint  # noqa: E402

KINDS = ("eager", "ours", "peer")
MiB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--budget", default="1GiB", help="CPU budget (max_memory['cpu'])")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint")
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="big_model_bench-"))
    checkpoint = work / "checkpoint"
    budget = parse_size(args.budget)
    try:
        if not (checkpoint / "model.safetensors.index.json").exists():
            print(f"writing the checkpoint to {checkpoint} ...", flush=True)
            write_net_checkpoint(checkpoint, args.width, args.blocks)
        size = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
        print(f"model {size / 2**30:.2f} GiB fp32, {args.blocks} blocks, CPU budget {budget / 2**30:.2f} GiB")
        runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
        for round_ in range(args.rounds):
            for kind in KINDS:
                out = work / f"{kind}-{round_}"
                result = probe(kind, checkpoint, args.width, args.blocks, budget, out)
                reference = torch.load(work / "eager-0" / "output-eager.pt")
                result["bitwise_equal"] = torch.equal(torch.load(out / f"output-{kind}.pt"), reference)
                runs[kind].append(result)
                shutil.rmtree(out / f"offload-{kind}", ignore_errors=True)
        turns = probe("alternate:" + ",".join(KINDS), checkpoint, args.width, args.blocks, budget, work / "turns")
        shutil.rmtree(work / "turns", ignore_errors=True)
        report(runs, size, turns)
    finally:
        if args.keep:
            print(f"checkpoint kept in {checkpoint}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def report(runs: dict[str, list[dict]], size: int, turns: dict[str, dict]) -> None:
    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    eager_forward = median("eager", "warm_forward_s")
    print(f"\n{'':6} {'load s':>7} {'fwd s':>7} {'x eager':>8} {'peak anon MiB':>14} "
          f"{'peak total MiB':>15} {'x model':>8} {'written MiB':>12} {'bitwise':>8}")
    for kind in KINDS:
        total = median(kind, "peak_total_delta")
        print(f"{kind:6} {median(kind, 'load_s'):7.2f} {median(kind, 'warm_forward_s'):7.2f} "
              f"{median(kind, 'warm_forward_s') / eager_forward:8.2f} {median(kind, 'peak_anon_delta') / MiB:14.0f} "
              f"{total / MiB:15.0f} {total / size:8.2f} {median(kind, 'offload_bytes') / MiB:12.0f} "
              f"{str(all(r['bitwise_equal'] for r in runs[kind])):>8}")
    print("\nforwards in turn, all three models in one process (6 rounds):")
    print(f"{'':6} {'best s':>7} {'median s':>9} {'x eager (median of per-round ratios)':>38}")
    for kind in KINDS:
        print(f"{kind:6} {turns[kind]['best_s']:7.2f} {turns[kind]['median_s']:9.2f} "
              f"{turns[kind]['median_ratio']:38.2f}")
    print(f"\nours vs peer: load {median('peer', 'load_s') / median('ours', 'load_s'):.1f}x faster, "
          f"forward {median('peer', 'warm_forward_s') / median('ours', 'warm_forward_s'):.2f}x faster, "
          f"peak total RSS {median('ours', 'peak_total_delta') / median('peer', 'peak_total_delta'):.2f}x, "
          f"peak anonymous RSS {median('ours', 'peak_anon_delta') / median('peer', 'peak_anon_delta'):.2f}x, "
          f"written {median('ours', 'offload_bytes') / MiB:.0f} MiB vs {median('peer', 'offload_bytes') / MiB:.0f} MiB")


if __name__ == "__main__":
    main()
