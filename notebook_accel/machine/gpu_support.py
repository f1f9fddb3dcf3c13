"""What the visible NVIDIA GPUs can do: native bf16, and kernels in the installed torch at all.

The one place that judges it: the launcher refuses a launch with it (``launch/planning/plan.py``) and the
config panel greys out its choices with it (``magics/panel/rules.py``). Nothing here initialises
CUDA in this process, nor marks it as having done so:

- A GPU's compute capability comes from ``nvidia-smi`` (or from torch when CUDA is already
  initialised here), found by :mod:`~notebook_accel.machine.hardware`; failing both, its name
  tells whether it has bf16 (``torch.cuda.is_bf16_supported()`` cannot: it says True on a T4,
  counting emulation).
- torch's arch list is asked in a forked child: ``torch.cuda.get_arch_list()`` does not
  initialise CUDA, but it registers torch's fork handler (``poison_fork`` in
  ``torch/csrc/cuda/Module.cpp``), so every worker forked afterwards would fail with "Cannot
  re-initialize CUDA in forked subprocess".
"""

from __future__ import annotations

import functools
import os
import re
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait

from notebook_accel.machine.hardware import Capability, Hardware

BF16_WHY = "bf16 needs compute capability 8.0 or newer (Ampere, Ada, Hopper, Blackwell)"

# bf16 needs compute capability 8.0+: Ampere (A100, A10, RTX 30xx, RTX A6000), Ada (L4, L40,
# RTX 40xx, RTX 6000 Ada), Hopper (H100, H200, GH200), Blackwell (B200, RTX 50xx, RTX PRO).
_BF16_NAME = re.compile(
    r"\b(?:A\d{1,4}[A-Z]?|H\d{2,3}|GH\d{3}|G?B\d{2,3}|L\d{1,2}S?|RTX\s*A\d{3,4}|RTX\s*[345]0\d0"
    r"|RTX\s*PRO|RTX\s*\d{4}\s*ADA|AMPERE|ADA|HOPPER|BLACKWELL)\b", re.IGNORECASE)
# Older families (Kepler .. Turing): fp16 yes, bf16 no.
_NO_BF16_NAME = re.compile(
    r"\b(?:T4|T10|V100\w*|P100\w*|P40|P4|K\d{2,4}|M\d{2}|GTX|TITAN|QUADRO|RTX\s*20\d0"
    r"|TESLA\s+[KMPVT]\d*)\b", re.IGNORECASE)

_ARCH = re.compile(r"(sm|compute)_(\d+)(\d)([a-z]?)")


def gpu_supports_bf16(name: str, capability: Capability | None = None) -> bool | None:
    """Whether a GPU has native bf16: by its compute capability when known, else by its name;
    None when neither tells.

    Example: ``gpu_supports_bf16("Tesla T4")`` is False, ``gpu_supports_bf16("NVIDIA H100 80GB
    HBM3")`` True, ``gpu_supports_bf16("NVIDIA GPU", (8, 6))`` True.
    """
    if capability is not None:
        return capability >= (8, 0)
    if _NO_BF16_NAME.search(name) and not re.search(r"\bADA\b|RTX\s*A\d", name, re.IGNORECASE):
        return False
    if _BF16_NAME.search(name.replace("NVIDIA", "")):
        return True
    return None


def bf16_verdicts(hw: Hardware) -> dict[str, bool | None]:
    """Each distinct visible GPU, described (:func:`describe`), with its bf16 verdict."""
    return {describe(name, cap): gpu_supports_bf16(name, cap)
            for name, cap in sorted(set(hw.gpus()), key=str)}


def describe(name: str, capability: Capability | None) -> str:
    """``Tesla T4 (compute capability 7.5)``, or the bare name when the capability is unknown."""
    return f"{name} (compute capability {capability[0]}.{capability[1]})" if capability else name


def torch_runs(capability: Capability, arch_list: Sequence[str]) -> bool:
    """Whether a torch built for ``arch_list`` (``torch.cuda.get_arch_list()``) has kernels that
    run on a GPU of this compute capability.

    A cubin (``sm_86``) runs on GPUs of its major version and the same or a newer minor (an L4,
    8.9, runs ``sm_86``); PTX (``compute_120``) is compiled by the driver for the same or newer
    GPUs; an arch-specific entry (``sm_90a``) only on exactly that capability.
    """
    for entry in arch_list:
        match = _ARCH.fullmatch(entry.strip())
        if match is None:
            continue
        kind, arch, suffix = match[1], (int(match[2]), int(match[3])), match[4]
        if suffix == "a":
            runs = arch == capability
        elif kind == "sm" or suffix == "f":
            runs = arch[0] == capability[0] and arch[1] <= capability[1]
        else:
            runs = arch <= capability
        if runs:
            return True
    return False


def gpus_torch_cannot_run(hw: Hardware, arch_list: Sequence[str]) -> list[tuple[str, Capability]]:
    """The distinct visible GPUs of known capability that no kernel of ``arch_list`` runs on
    (none when the arch list is unknown: empty)."""
    if not arch_list:
        return []
    return sorted({(name, cap) for name, cap in hw.gpus()
                   if cap is not None and not torch_runs(cap, arch_list)})


def torch_build() -> str:
    """``torch 2.8.0+cu128 (CUDA 12.8)``: the installed torch (imported: only on a GPU machine)."""
    import torch

    return f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})"


@functools.lru_cache(maxsize=1)
def torch_arch_list() -> tuple[str, ...]:
    """The CUDA architectures the installed torch was built for (``('sm_75', ..., 'compute_120')``),
    or ``()`` when they cannot be told. Asked in a forked child unless CUDA is already initialised
    here (see the module's docstring); the answer is kept for the life of the process."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return tuple(torch.cuda.get_arch_list())
    answer = in_forked_child(_arch_flags)
    return tuple(answer.split()) if answer else ()


def _arch_flags() -> str:
    import torch

    flags = getattr(torch._C, "_cuda_getArchFlags", None)  # no driver call (get_arch_list's
    return (flags() if flags else None) or " ".join(torch.cuda.get_arch_list())  # may make one)


def in_forked_child(call: Callable[[], str], timeout: float = 30.0) -> str | None:
    """``call()`` run in a forked child of this process, so that what it does to this process's
    state (torch's fork handler, a CUDA driver) stays in the child; its text, or None when it
    failed, took longer than ``timeout`` seconds, or this system cannot fork."""
    if not hasattr(os, "fork"):
        return None
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # "this process is multi-threaded": the child runs one call
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (coverage does not follow it)
        code = 1
        try:
            os.close(read_fd)
            data = call().encode()
            while data:
                data = data[os.write(write_fd, data):]
            code = 0
        finally:
            os._exit(code)  # never the parent's exit handlers or buffered output
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    answered = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not wait([read_fd], left):  # any fd number (select: < 1024)
                return None
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        answered = True
    finally:
        os.close(read_fd)
        status = _reap(pid, kill=not answered)  # no process left behind
    if status != 0:
        return None
    return b"".join(chunks).decode(errors="replace")


def _reap(pid: int, kill: bool) -> int | None:
    """The child's exit code (after killing it first when ``kill``); None when not ours to reap."""
    try:
        if kill:
            os.kill(pid, signal.SIGKILL)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except (ChildProcessError, ProcessLookupError):
        return None
