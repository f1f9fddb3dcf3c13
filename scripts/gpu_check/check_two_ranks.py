"""Item 3: two processes on the one GPU, and NCCL with one rank.

NCCL refuses two ranks on one device, so ``notebook_launcher`` refuses ``num_processes=2`` on a
1-GPU machine up front (3b). What two ranks on one GPU can do is run gloo with CUDA tensors: the
launch says ``device="cpu"`` (gloo), and each worker puts its model and tensors on ``cuda:0``
(3a: a collective on CUDA tensors and a DDP step through gloo). 3c: NCCL with one rank.
"""

from __future__ import annotations

import torch
from common import GPU, Report

from notebook_accel import notebook_launcher


def gloo_on_gpu() -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    t = torch.full((4,), rank + 1.0, device=device)
    dist.all_reduce(t)
    torch.manual_seed(0)
    net = torch.nn.Linear(16, 4).to(device)
    ddp = DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank)).to(device)
    ddp(x).square().mean().backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    # no destroy_process_group() here: with the DDP model still alive that can deadlock in torch's
    # gloo teardown (docs/torch_gloo_exit_abort.md); the launcher's workers leave without it
    return {"sum": t.tolist(), "tensor_device": str(t.device), "param_device": str(flat.device),
            "ranks_agree": torch.equal(gathered[0], gathered[1])}


def nccl_one_rank() -> dict:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    t = torch.full((4,), 3.0, device="cuda")
    dist.all_reduce(t)
    out = {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "sum": t.tolist()}
    dist.destroy_process_group()
    return out


def two_ranks() -> tuple[bool, dict, str]:
    results = notebook_launcher(gloo_on_gpu, num_processes=2, device="cpu", return_all=True)
    want = "cuda:0" if GPU else "cpu"
    passed = all(r["sum"] == [3.0] * 4 and r["tensor_device"] == want and r["param_device"] == want
                 and r["ranks_agree"] for r in results)
    return passed, {"ranks": results}, "launched with device='cpu' (gloo); each rank on cuda:0"


def refused() -> tuple[bool, dict, str]:
    try:
        notebook_launcher(gloo_on_gpu, num_processes=torch.cuda.device_count() + 1)
    except ValueError as error:
        return "num_processes" in str(error), {}, str(error)
    return False, {}, "num_processes above the GPU count was not refused"


def one_rank_nccl() -> tuple[bool, dict, str]:
    result = notebook_launcher(nccl_one_rank, num_processes=1)
    return result == {"backend": "nccl", "world_size": 1, "sum": [3.0] * 4}, result, ""


def main() -> None:
    report = Report()
    report.run("3a", "two ranks on one GPU: gloo with CUDA tensors (all_reduce, a DDP step)", two_ranks)
    if GPU:
        report.run("3b", "num_processes above the GPU count refused before any worker starts", refused)
        report.run("3c", "NCCL with one rank", one_rank_nccl)
    else:
        report.skip("3b", "num_processes above the GPU count refused before any worker starts", "no CUDA device")
        report.skip("3c", "NCCL with one rank", "NCCL needs CUDA")
    report.emit()


if __name__ == "__main__":
    main()
