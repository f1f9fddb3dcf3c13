"""Count, at one or more revisions, what the seams were built to remove: strategy special cases
outside the strategies, places that spell launch options or their choices, wire message kinds
spelled as bare strings (issue 20); lines naming a launch option outside its row, device branches
and XLA imports outside the device seam, and backend branches outside the launcher backends
(issue 32). Each count is a regular expression over the engine and front-end sources (``git grep``,
tests excluded), so any commit can be measured the same way.

Usage, from a checkout: ``python scripts/seam_counts.py 8877f8f HEAD``.
"""

from __future__ import annotations

import subprocess
import sys

SOURCES = ["notebook_accel", "magics"]
ACCELERATOR = "notebook_accel/accelerator.py"
WORKER_SIDE = [ACCELERATOR, "notebook_accel/utils.py", "notebook_accel/runtime", "notebook_accel/strategies",
               "notebook_accel/data", "notebook_accel/checkpoint", "notebook_accel/observe", "notebook_accel/big_model"]
KERNEL_SIDE = ["notebook_accel/launch", "notebook_accel/config", "notebook_accel/cli"]
# where each strategy's own code lives, before (fsdp/, deepspeed_zero/, xla/) and after (strategies/)
STRATEGY_HOMES = ("notebook_accel/strategies/", "notebook_accel/fsdp/", "notebook_accel/deepspeed_zero/",
                  "notebook_accel/xla/")
_CHOICE = r'"(no|fp16|bf16|fp8)"'
# the device seam: runtime/device.py, the XLA kind in runtime/xla.py, the XLA strategy (machine/ probes
# what is installed; the kernel side, which plans launches and starts torch_xla's launcher, is counted apart)
DEVICE_SEAM = ("notebook_accel/runtime/device.py", "notebook_accel/runtime/xla.py", "notebook_accel/strategies/xla.py")
# the kernel side's: the XLA host worker (it runs torch_xla's launcher; each core reads its ordinals
# from the XLA device); the kernel asks machine/launch_kinds.py's kind of the plan's device type
KERNEL_DEVICE_SEAM = ("notebook_accel/launch/worker/xla_cores.py",)
_XLA_DEVICE_TEST = r'(device|device_type|\.type|backend\(\))\s*(==|!=|in)\s*\(?[^)]*"xla"|\b(on|is|alone_on)_xla\b'
_XLA_IMPORT = r'import torch_xla|from torch_xla|_import\("torch_xla|from notebook_accel\.runtime import xla|runtime\.xla import'
# name -> (pattern, sources, excluded paths)
COUNTS = {
    "strategy special cases outside the strategies":
        (r'distributed_type\s*[!=]=|DistributedType\.(FSDP|DEEPSPEED|XLA)|is_xla\(|_uses_xla|'
         r'isinstance\([^)]*(Fsdp|FSDP|DeepSpeed|Zero)', SOURCES, STRATEGY_HOMES),
    "lists of the mixed-precision choices (two or more together)":
        (rf'[(\[{{]\s*{_CHOICE}\s*,\s*{_CHOICE}|{_CHOICE}\s*:\s*torch\.', SOURCES,
         ("notebook_accel/contract.py",)),
    "lists of the device choices":
        (r'"cpu", "cuda"|"cuda", "cpu"|\("cpu", "cuda", "xla"\)', SOURCES, ("notebook_accel/contract.py",)),
    "option names spelled as flags or keys (mixed_precision)":
        (r'"--mixed[-_]precision"|"mixed_precision":|\("mixed_precision"', SOURCES,
         ("notebook_accel/contract.py",)),
    # issue 32: an option named once. Every line naming the option outside its row: the plumbing
    # (signatures, keyword lists, flag lists) and what it does (the plan's field, its user)
    "lines naming a launch option outside its row (hang_after)":
        (r'hang[_-]after', SOURCES, ("notebook_accel/contract.py",)),
    "lines naming a launch option outside its row (dynamo_backend)":
        (r'dynamo[_-]backend', SOURCES, ("notebook_accel/contract.py",)),
    "device branches outside the device seam (worker side)":
        (rf'{_XLA_DEVICE_TEST}|backend\s*[!=]=\s*"xla"', WORKER_SIDE, DEVICE_SEAM),
    "XLA imports outside the device seam (worker side)":
        (_XLA_IMPORT, WORKER_SIDE, DEVICE_SEAM),
    "device branches, XLA imports (kernel side, but the XLA host worker)":
        (rf'{_XLA_DEVICE_TEST}|backend\s*[!=]=\s*"xla"|{_XLA_IMPORT}', KERNEL_SIDE, KERNEL_DEVICE_SEAM),
    "backend branches outside launch/backends and launch/cluster":
        (r'plan\.(cluster|xla) is|if (not )?plan\.(cluster|xla)\b|plan\.cluster if', SOURCES,
         ("notebook_accel/launch/backends/", "notebook_accel/launch/cluster/")),
    "wire message kinds as bare strings (engine)":
        (r'kind\s*==\s*"|\(\s*"(ok|error|display|metrics|progress|memory|dropped)"\s*,', ["notebook_accel"],
         ("notebook_accel/wire.py", "notebook_accel/wire/")),
}


def count(revision: str, pattern: str, sources: list[str], excluded: tuple[str, ...]) -> tuple[int, int]:
    """(matching lines, files) of ``pattern`` in ``sources`` at ``revision``, outside ``excluded``."""
    found = subprocess.run(["git", "grep", "-n", "-E", pattern, revision, "--", *sources],
                           capture_output=True, text=True).stdout.splitlines()
    paths = [line.split(":", 2)[1] for line in found]
    kept = [p for p in paths if not p.startswith(excluded)]
    return len(kept), len(set(kept))


def lines(revision: str, path: str) -> int:
    """The number of lines of ``path`` at ``revision``."""
    text = subprocess.run(["git", "show", f"{revision}:{path}"], capture_output=True, text=True).stdout
    return len(text.splitlines())


def main(revisions: list[str]) -> None:
    revisions = revisions or ["HEAD"]
    print(f"{'':68s}" + "".join(f"{r:>18s}" for r in revisions))
    for name, (pattern, sources, excluded) in COUNTS.items():
        cells = [count(r, pattern, sources, excluded) for r in revisions]
        print(f"{name:68s}" + "".join(f"{f'{n} in {f} files':>18s}" for n, f in cells))
    print(f"{'lines of notebook_accel/accelerator.py':68s}" + "".join(f"{lines(r, ACCELERATOR):>18d}" for r in revisions))


if __name__ == "__main__":
    main(sys.argv[1:])
