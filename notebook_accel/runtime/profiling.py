"""``torch.profiler`` around a block of training (``Accelerator.profile``), as the peer's
``ProfileKwargs``: one Chrome trace per process when ``output_trace_dir`` is set."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from notebook_accel.runtime.plugins import KwargsHandler

PROFILE_PATTERN_NAME = "profile_{suffix}.json"


@dataclass
class ProfileKwargs(KwargsHandler):
    """The profiler's settings (``torch.profiler.profile``'s arguments).

    Attributes:
        activities: ``"cpu"``, ``"cuda"``, ``"xpu"``...; None: torch's default (all available).
        schedule_option: ``torch.profiler.schedule``'s arguments (``wait``, ``warmup``, ``active``...).
        on_trace_ready: called with the profiler each time a scheduled cycle ends.
        output_trace_dir: where each process writes ``profile_<rank>.json`` (a Chrome trace).
    Raises:
        ValueError: (from :meth:`build`) an unknown activity, naming the known ones.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def build(self) -> torch.profiler.profile:
        """A ``torch.profiler.profile`` with these settings (not started)."""
        known = {name.lower(): activity
                 for name, activity in torch.profiler.ProfilerActivity.__members__.items()}
        activities = None
        if self.activities is not None:
            unknown = [a for a in self.activities if a not in known]
            if unknown:
                raise ValueError(f"unknown profiler activities {unknown}; choose from {sorted(known)}")
            activities = [known[a] for a in self.activities]
        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option else None
        return torch.profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes, profile_memory=self.profile_memory,
            with_stack=self.with_stack, with_flops=self.with_flops, with_modules=self.with_modules)


@contextlib.contextmanager
def profile(handler: ProfileKwargs, process_index: int,
            wait_for_everyone: Callable[[], None]) -> Iterator[torch.profiler.profile]:
    """Profile the block; then write this process's trace (when asked) and wait for the others."""
    with handler.build() as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    os.makedirs(handler.output_trace_dir, exist_ok=True)
    profiler.export_chrome_trace(os.path.join(handler.output_trace_dir,
                                              PROFILE_PATTERN_NAME.format(suffix=process_index)))
    wait_for_everyone()
