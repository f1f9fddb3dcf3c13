"""Items 9a-9b: the hardware's truth on a real GPU (issue 31, part 3).

- 9a: what a launch detects here, without initialising CUDA in this process: the GPU's compute
  capability, that the installed torch has kernels for it, and ``mixed_precision="auto"``
  resolving to the precision the GPU has natively (bf16 from compute capability 8.0, else
  fp16); a one-GPU launch with ``auto`` then trains with it. Without a GPU: the same on the CPU.
- 9b: bf16 on a GPU without native bf16 (a T4's capability, 7.5, faked on this GPU: no such GPU
  is lent) is refused before any worker starts, naming the GPU and suggesting fp16.
"""

from __future__ import annotations

import torch
from common import GPU, Report

from notebook_accel import notebook_launcher
from notebook_accel.launch.planning import plan as planmod
from notebook_accel.machine import devices, gpu_support, hardware

CU128 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")  # a T4-capable build, on the CPU


def trained_precision() -> str:
    """One training step through the Accelerator on this rank; the precision it used."""
    from notebook_accel import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    with accelerator.autocast():
        loss = model(torch.randn(4, 8, device=accelerator.device)).float().pow(2).mean()
    accelerator.backward(loss)
    opt.step()
    assert torch.isfinite(loss).item()
    return str(accelerator.mixed_precision)


def detected() -> tuple[bool, dict, str]:
    hw = hardware.detect()
    device = devices.auto_device(hw)
    best = devices.best_precision(device, hw)
    arch = gpu_support.torch_arch_list() if GPU else ()
    runs = [gpu_support.torch_runs(c, arch) for c in hw.gpu_capabilities if c is not None]
    untouched = not torch.cuda.is_initialized()  # nothing above may initialise CUDA here
    used = notebook_launcher(trained_precision, num_processes=1, mixed_precision="auto",
                             output="none")
    wanted = ("bf16" if all(c is not None and c >= (8, 0) for c in hw.gpu_capabilities) else "fp16") \
        if GPU else devices.best_precision("cpu", hw)
    figures = {"gpus": list(hw.gpu_names), "capabilities": [list(c or ()) for c in hw.gpu_capabilities],
               "arch_list": list(arch), "auto": best, "trained_with": used,
               "cuda_initialised_in_kernel": not untouched}
    return (untouched and all(runs) and best == wanted and used == best), figures, ""


def t4_refused() -> tuple[bool, dict, str]:
    names = hardware.detect().gpu_names if GPU else ("Tesla T4",)
    fake = hardware.Hardware(cpu_count=4, gpu_names=tuple(names[:1]), gpu_capabilities=((7, 5),))
    saved = hardware.detect, gpu_support.torch_arch_list, torch.version.cuda
    hardware.detect = lambda: fake
    if not GPU:
        gpu_support.torch_arch_list, torch.version.cuda = (lambda: CU128), "12.8"
    try:
        planmod.make_plan(num_processes=1, mixed_precision="bf16", use_port=None,
                          master_addr="127.0.0.1", node_rank=0, num_nodes=1, start_method="spawn",
                          timeout=None, output="none", return_all=False, max_restarts=0,
                          device="cuda")
        message = ""
    except ValueError as error:
        message = str(error)
    finally:
        hardware.detect, gpu_support.torch_arch_list, torch.version.cuda = saved
    passed = message.startswith(f"mixed_precision='bf16' on {names[0]} (compute capability 7.5)") \
        and "'fp16'" in message
    return passed, {"message": message[:200]}, ""


def main() -> None:
    report = Report()
    report.run("9a", "auto precision is the GPU's native one, detected without initialising CUDA",
               detected)
    report.run("9b", "bf16 on a GPU below compute capability 8.0 (faked) is refused before a launch",
               t4_refused)
    report.emit()


if __name__ == "__main__":
    main()
