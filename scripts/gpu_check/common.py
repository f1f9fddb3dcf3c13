"""What every GPU check shares: whether a GPU is here, and how a check reports its items.

A check is a script that prints, as its last line, ``GPU_CHECK_RESULT <json>``: a list of items,
each ``{"item": "2b", "title": ..., "status": "PASS" | "FAIL" | "N/A", "figures": {...},
"detail": "..."}``. On a machine without CUDA a check still runs what the CPU can run (so the
script cannot rot) and reports the GPU-only items as "N/A".
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

MARKER = "GPU_CHECK_RESULT "
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the checks import the project and tests/ helpers from this checkout
    sys.path.insert(0, str(REPO))
GPU = torch.cuda.is_available() and os.environ.get("GPU_CHECK_FORCE_CPU") != "1"
DEVICE = torch.device("cuda") if GPU else torch.device("cpu")


class Report:
    """The items one check script reports."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def add(self, item: str, title: str, passed: bool, figures: dict | None = None, detail: str = "",
            gpu_only: bool = True) -> None:
        """Record an item; without a GPU, a GPU-only item that ran on the CPU is "N/A"."""
        status = "PASS" if passed else "FAIL"
        if gpu_only and not GPU and passed:
            status, detail = "N/A", f"no CUDA device (ran on the CPU: ok) {detail}".strip()
        self.items.append({"item": item, "title": title, "status": status, "figures": figures or {},
                           "detail": detail})

    def skip(self, item: str, title: str, why: str) -> None:
        """An item that cannot run on this machine at all (reported "N/A", saying why)."""
        self.items.append({"item": item, "title": title, "status": "N/A", "figures": {}, "detail": why})
        print(f"[{item}] N/A {title}: {why}", flush=True)

    def run(self, item: str, title: str, body: Callable[[], tuple[bool, dict, str]],
            gpu_only: bool = True) -> None:
        """Run ``body`` (returns passed, figures, detail); an exception is a FAIL with its traceback."""
        start = time.perf_counter()
        try:
            passed, figures, detail = body()
        except Exception:  # noqa: BLE001 - a check's failure is reported, not raised
            passed, figures, detail = False, {}, traceback.format_exc(limit=8)
            print(detail, file=sys.stderr, flush=True)
        figures = {**figures, "seconds": round(time.perf_counter() - start, 2)}
        self.add(item, title, passed, figures, detail, gpu_only)
        print(f"[{item}] {self.items[-1]['status']} {title} {json.dumps(figures)}", flush=True)

    def emit(self) -> None:
        print(MARKER + json.dumps(self.items, default=str), flush=True)


def gpu_memory_used() -> int:
    """Bytes in use on GPU 0 by every process (the device's view, not this process's allocator)."""
    free, total = torch.cuda.mem_get_info(0)
    return total - free


def rel_diff(a: list[float], b: list[float]) -> float:
    """The largest relative difference between two equally long loss curves."""
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))
