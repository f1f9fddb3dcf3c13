"""Items 1 and 7a: CUDA initialised in a real Jupyter kernel, then launching from that kernel.

``notebook_launcher(..., num_processes=2)`` and a ``%%accelerate`` cell must succeed, ``auto``
must pick the warm forkserver and say why; the launch latency (first and warm) is measured, and the
peer's ``notebook_launcher`` is called in the same kernel, where it refuses (its error is shown).
One GPU cannot hold two NCCL ranks, so the two workers run with ``device="cpu"`` (gloo) and each
uses ``cuda:0`` itself: that CUDA works in a worker forked from this kernel is what is checked.
"""

from __future__ import annotations

import re

from common import GPU, Report

from tests.kernel_harness import Kernel

SETUP = """
import time, torch
if torch.cuda.is_available():
    torch.ones(1, device="cuda")
print("CUDA_INITIALISED", torch.cuda.is_initialized())

def job(scale):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    on_gpu = (torch.ones(4, device="cuda") * t.item() * scale).sum().item() if torch.cuda.is_available() else None
    dist.destroy_process_group()
    return t.item(), on_gpu
"""

LAUNCH = """
from notebook_accel import notebook_launcher
start = time.perf_counter()
result = notebook_launcher(job, args=(2.0,), num_processes=2, device="cpu")
print("LAUNCHED", round(time.perf_counter() - start, 3), result)
"""

MAGIC = """%%accelerate -n 2 --device cpu
import torch
from notebook_accel import Accelerator
acc = Accelerator()
total = acc.reduce(torch.tensor([acc.process_index + 1.0]), "sum").item()
gpu = (torch.ones(2, device="cuda") * total).sum().item() if torch.cuda.is_available() else None
print("MAGIC", acc.process_index, total, gpu)
"""

PEER = """
import accelerate
try:
    accelerate.notebook_launcher(job, args=(2.0,), num_processes=2)
    print("PEER_LAUNCHED")
except Exception as error:
    print("PEER_ERROR", type(error).__name__, str(error).splitlines()[0][:300])
"""


def launches(kernel: Kernel) -> tuple[bool, dict, str]:
    init = kernel.ok(SETUP)
    cuda_on = "CUDA_INITIALISED True" in init.stdout
    times, outputs = [], ""
    for _ in range(3):
        cell = kernel.ok(LAUNCH, timeout=180)
        outputs += cell.stdout + cell.stderr
        times.append(float(re.search(r"LAUNCHED ([\d.]+)", cell.stdout).group(1)))
    result_ok = ("(3.0, 24.0)" if GPU else "(3.0, None)") in outputs
    said_forkserver = "forkserver" in outputs
    figures = {"cuda_initialised_in_kernel": cuda_on, "first_launch_s": times[0],
               "warm_launch_s": sorted(times[1:])[0], "said_forkserver": said_forkserver}
    why = next((line for line in outputs.splitlines() if "forkserver" in line), "")
    return result_ok and (said_forkserver or not GPU) and (cuda_on or not GPU), figures, why.strip()


def magic(kernel: Kernel) -> tuple[bool, dict, str]:
    kernel.ok("%load_ext notebook_accel")
    cell = kernel.ok(MAGIC, timeout=180)
    expected = "3.0 6.0" if GPU else "3.0 None"
    ranks = sorted(int(m) for m in re.findall(rf"\[rank (\d)\] MAGIC \d {re.escape(expected)}", cell.stdout))
    return ranks == [0, 1], {"cell_s": round(cell.elapsed, 3), "ranks_ok": ranks}, ""


def peer(kernel: Kernel) -> tuple[bool, dict, str]:
    cell = kernel.ok(PEER, timeout=120)
    out = cell.stdout + cell.stderr
    line = next((x for x in out.splitlines() if x.startswith(("PEER_ERROR", "PEER_LAUNCHED"))), out[-300:])
    cause = next((x.strip() for x in out.splitlines() if "Cannot re-initialize CUDA" in x), "")
    figures = {"peer_launched": line.startswith("PEER_LAUNCHED"), "peer_error": line.removeprefix("PEER_ERROR "),
               "root_cause_in_its_output": cause[:300], "seconds_to_fail": round(cell.elapsed, 2)}
    return line.startswith("PEER_ERROR"), figures, "\n".join(out.splitlines()[-12:])[-1500:]


def main() -> None:
    report = Report()
    kernel = Kernel()
    try:
        report.run("1a", "CUDA in the kernel, then notebook_launcher x2: auto -> forkserver", lambda: launches(kernel))
        report.run("1b", "CUDA in the kernel, then a %%accelerate cell on 2 workers", lambda: magic(kernel))
        if GPU:
            report.run("7a", "the peer's notebook_launcher after CUDA was initialised", lambda: peer(kernel))
        else:
            report.skip("7a", "the peer's notebook_launcher after CUDA was initialised",
                        "its refusal needs CUDA initialised in the kernel")
    finally:
        kernel.shutdown()
    report.emit()


if __name__ == "__main__":
    main()
