"""Item 6: a rank fails after CUDA work; the GPU's memory is back to its baseline within 5 s.

Both ranks put 4 GiB on ``cuda:0``; rank 1 raises while rank 0 waits for it in a collective. The
launcher must raise ``WorkerError`` naming rank 1, stop rank 0, and leave no process holding the
device: the machine's used GPU memory (``cudaMemGetInfo``, every process) must return to what it
was before the launch within 5 s, and the next launch must work.
"""

from __future__ import annotations

import threading
import time

import psutil
from common import GPU, Report, gpu_memory_used

from notebook_accel import WorkerError, notebook_launcher

SLACK = 64 << 20


def hold_then_fail() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    held = torch.empty(4 << 30 if device == "cuda" else 1 << 20, dtype=torch.uint8, device=device).fill_(1)
    dist.barrier()
    if dist.get_rank() == 1:
        raise RuntimeError(f"planned failure with {held.numel() >> 20} MiB on {device}")
    dist.barrier()  # rank 1 never comes: rank 0 must be stopped by the launcher


def small_job() -> float:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.ones(8, device=device).sum().item()


def failing_rank() -> tuple[bool, dict, str]:
    baseline = gpu_memory_used() if GPU else 0
    peak, done = [baseline], threading.Event()

    def sample() -> None:  # the device's memory while the job runs: the 2 x 4 GiB must show
        while GPU and not done.wait(0.05):
            peak[0] = max(peak[0], gpu_memory_used())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    launched = time.perf_counter()
    try:
        notebook_launcher(hold_then_fail, num_processes=2, device="cpu", output="main")
        return False, {}, "the failing launch did not raise"
    except WorkerError as error:
        failed_at, rank = time.perf_counter(), error.rank
    finally:
        done.set()
        sampler.join()
    recovered_s = None
    while time.perf_counter() - failed_at < 10:
        if not GPU or gpu_memory_used() <= baseline + SLACK:
            recovered_s = round(time.perf_counter() - failed_at, 2)
            break
        time.sleep(0.05)
    left = [p.pid for p in psutil.Process().children(recursive=True)
            if p.name().startswith("nbaccel-r") and p.status() != psutil.STATUS_ZOMBIE]
    again = notebook_launcher(small_job, num_processes=2, device="cpu", return_all=True)
    figures = {"failed_rank": rank, "baseline_gpu_mb": baseline >> 20, "peak_during_job_mb": peak[0] >> 20,
               "error_raised_after_s": round(failed_at - launched, 2), "memory_back_after_s": recovered_s,
               "workers_left": left, "next_launch": again}
    held = peak[0] - baseline >= 8 << 30 if GPU else True
    passed = held and rank == 1 and recovered_s is not None and recovered_s <= 5 and not left and again == [8.0, 8.0]
    return passed, figures, ""


def main() -> None:
    report = Report()
    if GPU:
        gpu_memory_used()  # CUDA initialised here, as in a kernel that used the GPU
    report.run("6", "a failing rank after CUDA work: GPU memory back to baseline in 5 s", failing_rank)
    report.emit()


if __name__ == "__main__":
    main()
