"""The strategies' registry and process group in fresh interpreters: the kernel reads their config
without torch, and one process needs no rendezvous (tests/unit/test_strategies.py has the rest)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from notebook_accel.strategies import registry


def test_the_config_sections_and_worker_variables_come_from_the_registry_without_torch():
    from notebook_accel.strategies.fsdp.config import strategy_environment

    assert registry.config_sections() == {"FSDP": "fsdp_config", "DEEPSPEED": "deepspeed_config"}
    section = {"fsdp_version": 2, "fsdp_state_dict_type": "FULL_STATE_DICT"}
    assert registry.worker_environment("FSDP", section) == strategy_environment("FSDP", section)
    assert registry.worker_environment("FSDP", section)["FSDP_STATE_DICT_TYPE"] == "FULL_STATE_DICT"
    assert registry.worker_environment("MULTI_GPU", None) == {} == registry.worker_environment("NO", None)
    assert registry.for_distributed_type("XLA") == "xla"
    with pytest.raises(ValueError, match="bad key"):
        registry.worker_environment("FSDP", {"bad key": 1})
    code = ("import sys; from notebook_accel.config import load_config; "
            "from notebook_accel.launch.planning.options import worker_strategy_environment; "
            "from notebook_accel.strategies import registry; registry.config_sections(); "
            "registry.worker_environment('DEEPSPEED', {'zero_stage': 2}); "
            "registry.worker_environment('FSDP', {'fsdp_version': 2}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"  # the kernel reads the strategies' config without importing torch


def test_a_one_process_group_needs_no_port_nor_rendezvous_variables():
    code = (
        "import os, torch.distributed as dist\n"
        "from notebook_accel.runtime.state import ensure_process_group\n"
        "for k in ('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE'): os.environ.pop(k, None)\n"
        "ensure_process_group('gloo', 0, 1, None)\n"
        "assert not dist.is_initialized()\n"
        "ensure_process_group('gloo', 0, 1, None, alone=True)\n"
        "assert dist.get_world_size() == 1 and dist.get_backend() == 'gloo'\n"
        "dist.destroy_process_group()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
