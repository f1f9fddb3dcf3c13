"""``is_*_available`` probes (the peer's names): which packages and devices this process can use.

Package probes only look for the package (nothing is imported); device probes never
initialise CUDA in this process, so a kernel can still fork workers afterwards.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch.torch_version import TorchVersion


def _has(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def is_cuda_available() -> bool:
    """A CUDA device is visible (NVML-based check: CUDA stays uninitialised)."""
    old = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return torch.cuda.is_available()
    finally:
        if old is None:
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = old


def is_rocm_available() -> bool:
    """This torch is a ROCm build and sees a GPU."""
    return torch.version.hip is not None and is_cuda_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    """Apple's MPS backend is built and usable (and torch is at least ``min_version``)."""
    return (TorchVersion(torch.__version__) >= min_version and torch.backends.mps.is_available()
            and torch.backends.mps.is_built())


def is_xpu_available() -> bool:
    """An Intel XPU is visible to this torch."""
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """torch_xla is installed (TPU / XLA devices); with ``check_is_tpu`` / ``check_is_gpu``, and
    ``PJRT_DEVICE`` names a TPU / a GPU (``CUDA``) as the XLA device."""
    device = os.environ.get("PJRT_DEVICE", "").strip().upper()
    return _has("torch_xla") and (not check_is_tpu or device == "TPU") and (
        not check_is_gpu or device in ("CUDA", "GPU"))


def is_hpu_available() -> bool:
    """Habana's torch plugin is installed."""
    return _has("habana_frameworks")


def is_npu_available() -> bool:
    """Ascend's torch_npu is installed."""
    return _has("torch_npu")


def is_mlu_available() -> bool:
    """Cambricon's torch_mlu is installed."""
    return _has("torch_mlu")


def is_musa_available() -> bool:
    """Moore Threads' torch_musa is installed."""
    return _has("torch_musa")


def is_sdaa_available() -> bool:
    """Tecorigin's torch_sdaa is installed."""
    return _has("torch_sdaa")


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """bf16 works here: on CUDA when the GPU supports it, on a TPU unless ``ignore_tpu``, on the CPU always."""
    if is_torch_xla_available() and os.environ.get("PJRT_DEVICE", "").upper() == "TPU":
        return not ignore_tpu
    if is_cuda_available():
        return torch.cuda.is_bf16_supported()
    return True


def is_fp16_available() -> bool:
    """fp16 works here: on CUDA, or on the CPU through ``torch.amp.GradScaler`` (torch >= 2.3)."""
    return is_cuda_available() or hasattr(torch.amp, "GradScaler")


def is_datasets_available() -> bool:
    """The ``datasets`` package is installed."""
    return _has("datasets")


def is_torchdata_available() -> bool:
    """The ``torchdata`` package is installed."""
    return _has("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    """torchdata with its ``StatefulDataLoader`` (0.8 or later) is installed (``use_stateful_dataloader``)."""
    return _has("torchdata.stateful_dataloader")  # False too when torchdata is missing


def is_pytest_available() -> bool:
    """The ``pytest`` package is installed."""
    return _has("pytest")


def is_bnb_available() -> bool:
    """The ``bitsandbytes`` package is installed."""
    return _has("bitsandbytes")


def is_tensorboard_available() -> bool:
    """The ``tensorboard`` package is installed."""
    return _has("tensorboard") or _has("tensorboardX")


def is_wandb_available() -> bool:
    """The ``wandb`` package is installed."""
    return _has("wandb")


def is_mlflow_available() -> bool:
    """``mlflow`` (or ``mlflow-skinny``) is installed."""
    return _has("mlflow")


def is_matplotlib_available() -> bool:
    """The ``matplotlib`` package is installed."""
    return _has("matplotlib")


def is_safetensors_available() -> bool:
    """The ``safetensors`` package is installed."""
    return _has("safetensors")


def is_numpy_available() -> bool:
    """The ``numpy`` package is installed."""
    return _has("numpy")


def is_transformers_available() -> bool:
    """The ``transformers`` package is installed."""
    return _has("transformers")


def is_peft_available() -> bool:
    """The ``peft`` package is installed."""
    return _has("peft")


def is_schedulefree_available() -> bool:
    """The ``schedulefree`` package (Meta's schedule-free optimizers) is installed."""
    return _has("schedulefree")


def is_deepspeed_available() -> bool:
    """The ``deepspeed`` package is installed."""
    return _has("deepspeed")


def is_ipex_available() -> bool:
    """The ``intel_extension_for_pytorch`` package is installed."""
    return _has("intel_extension_for_pytorch")
