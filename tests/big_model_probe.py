"""Measure one way of loading and running a big model, in a fresh process, and print JSON.

    python -m tests.big_model_probe {ours,peer,eager,disk_offload} CHECKPOINT WIDTH BLOCKS BUDGET OUT_DIR

``ours`` / ``peer``: ``load_checkpoint_and_dispatch`` with ``device_map="auto"`` and a CPU budget of
BUDGET bytes; ``eager``: the ordinary ``load_state_dict``; ``disk_offload``: an eagerly loaded model
handed to our ``disk_offload``. Four forwards follow; the output is saved to OUT_DIR.
``alternate:eager,ours[,peer]``: those models in one process, forwards timed in turn.

Memory comes from /proc/self/status, sampled every millisecond from a thread: ``RssAnon``
(anonymous memory: what the process really holds) and ``RssFile`` (mapped file pages, which count
as RSS while mapped but are page cache the kernel can take back) are reported apart; ``VmHWM``
(the kernel's exact peak of their sum, reset at the baseline) is reported too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path


def status() -> dict[str, int]:
    """Kilobyte fields of /proc/self/status, in bytes."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                found[key] = int(value.split()[0]) * 1024
    return found


class Peaks(threading.Thread):
    """Highest RssAnon, RssFile and their sum seen while running."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.anon = self.file = self.total = 0
        self.running = True

    def sample(self) -> None:
        now = status()
        self.anon = max(self.anon, now["RssAnon"])
        self.file = max(self.file, now["RssFile"])
        self.total = max(self.total, now["RssAnon"] + now["RssFile"] + now.get("RssShmem", 0))

    def run(self) -> None:
        while self.running:
            self.sample()
            time.sleep(0.001)

    def restart(self) -> int:
        """The anonymous peak so far; the next peak counts from now."""
        self.sample()
        anon, self.anon = self.anon, 0
        return anon

    def stop(self) -> None:
        self.running = False
        self.join()
        self.sample()


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def warm(checkpoint: Path) -> None:
    """Read the checkpoint once so the page cache holds it (the 'warm' measurements). In another
    process: large reads here would raise glibc's mmap threshold and change what is measured."""
    subprocess.run(["cat", *map(str, checkpoint.iterdir())], stdout=subprocess.DEVNULL, check=True)


def eager_model(checkpoint: Path, width: int, blocks: int):
    from safetensors.torch import load_file

    from notebook_accel import init_empty_weights
    from tests.big_model_support import Net

    with init_empty_weights():  # skip random init: the checkpoint overwrites every weight
        model = Net(width, blocks)
    for file in sorted(checkpoint.glob("*.safetensors")):  # copied into memory, as usual
        shard = {name: tensor.clone() for name, tensor in load_file(file).items()}
        model.load_state_dict(shard, strict=False, assign=True)
    return model


def load(kind: str, checkpoint: Path, width: int, blocks: int, budget: int, offload: Path):
    """The model, loaded the way ``kind`` names."""
    from tests.big_model_support import Net

    if kind == "eager":
        return eager_model(checkpoint, width, blocks)
    if kind == "disk_offload":
        from notebook_accel import disk_offload

        return disk_offload(eager_model(checkpoint, width, blocks), offload, execution_device="cpu")
    if kind == "peer":
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    else:
        from notebook_accel import init_empty_weights, load_checkpoint_and_dispatch
    with init_empty_weights():
        model = Net(width, blocks)
    return load_checkpoint_and_dispatch(
        model, checkpoint, device_map="auto", max_memory={"cpu": budget},
        no_split_module_classes=["Block"], offload_folder=str(offload),
    )


def alternate(kinds: list[str], checkpoint: Path, width: int, blocks: int, budget: int, out_dir: Path) -> dict:
    """Forward times of several loaders' models held in this one process, run in turn, so that
    machine load shifts hit them alike: best and median of 6 warm forwards each, and the median
    of the per-round ratios to the first kind."""
    import statistics

    import torch

    torch.manual_seed(0)
    x = torch.randn(16, width)
    models = {kind: load(kind, checkpoint, width, blocks, budget, out_dir / f"offload-{kind}") for kind in kinds}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    with torch.no_grad():
        for model in models.values():
            model(x)  # first forwards are not warm
        for _ in range(6):
            for kind, model in models.items():
                start = time.perf_counter()
                model(x)
                times[kind].append(time.perf_counter() - start)
    base = times[kinds[0]]
    return {kind: {"best_s": min(t), "median_s": statistics.median(t),
                   # each round's time over the first kind's in the same round: drift cancels out
                   "median_ratio": statistics.median(a / b for a, b in zip(t, base, strict=True))}
            for kind, t in times.items()}


def main() -> None:
    kind, checkpoint, width, blocks, budget, out_dir = sys.argv[1:7]
    checkpoint, width, blocks, out_dir = Path(checkpoint), int(width), int(blocks), Path(out_dir)
    if kind.startswith("alternate:"):
        warm(checkpoint)
        print(json.dumps(alternate(kind.split(":")[1].split(","), checkpoint, width, blocks, int(budget), out_dir)))
        return
    import gc

    import torch

    import notebook_accel.big_model  # noqa: F401 - imports are not part of the measurement

    if kind == "peer":
        import accelerate  # noqa: F401

    torch.manual_seed(0)
    x = torch.randn(16, width)
    offload = out_dir / f"offload-{kind}"
    offload.mkdir(parents=True, exist_ok=True)
    warm(checkpoint)
    before = status()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    peaks = Peaks()
    peaks.start()
    start = time.perf_counter()
    model = load(kind, checkpoint, width, blocks, int(budget), offload)
    load_s = time.perf_counter() - start
    gc.collect()
    after_load = status()
    load_peak_anon = peaks.restart()
    forwards = []
    with torch.no_grad():
        for _ in range(4):
            start = time.perf_counter()
            y = model(x)
            forwards.append(time.perf_counter() - start)
    peaks.stop()
    end = status()
    torch.save(y, out_dir / f"output-{kind}.pt")
    plan = getattr(model, "hf_device_map", {"": "cpu"})
    total_before = before["RssAnon"] + before["RssFile"] + before.get("RssShmem", 0)
    print(json.dumps({
        "kind": kind,
        "load_s": load_s,
        "forward_s": forwards,
        "warm_forward_s": min(forwards[1:]),
        "peak_anon_delta": max(load_peak_anon, peaks.anon) - before["RssAnon"],
        "forward_peak_anon_delta": peaks.anon - before["RssAnon"],
        "peak_file_delta": peaks.file - before["RssFile"],
        "peak_total_delta": max(peaks.total, end["VmHWM"]) - total_before,
        "anon_after_load_delta": after_load["RssAnon"] - before["RssAnon"],
        "offload_bytes": folder_bytes(offload),
        "on_disk": sum(1 for d in plan.values() if d == "disk"),
        "on_cpu": sum(1 for d in plan.values() if d == "cpu"),
    }))


if __name__ == "__main__":
    main()
