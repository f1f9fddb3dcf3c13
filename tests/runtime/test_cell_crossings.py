"""What crosses between the notebook and the workers, where it needs the real libraries (deepspeed's
engine class) or a fresh interpreter (tests/unit/test_cell_crossings.py has the rest)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch

from notebook_accel import Accelerator
from notebook_accel.launch.handoff.rank_identity import RANK_BOUND, rank_bound_kind


@pytest.mark.parametrize(("module", "attribute", "kind"), RANK_BOUND)
def test_every_rank_bound_type_names_a_real_class(module, attribute, kind):
    assert isinstance(getattr(importlib.import_module(module), attribute), type), (module, attribute)


def test_the_check_tells_rank_bound_objects_apart_and_never_imports_what_it_checks():
    assert rank_bound_kind(3) is None and rank_bound_kind(torch.nn.Linear(1, 1)) is None
    assert rank_bound_kind(Accelerator(cpu=True)) == "an Accelerator"
    # in a kernel that never imported torch, checking a notebook value imports none of it
    code = ("import sys; from notebook_accel.launch import check_sendable; "
            "assert check_sendable({'lr': 0.1}) is None; "
            "print(sorted(m for m in ('torch', 'deepspeed', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out
