"""The peer's names and parameters that a user switching from Accelerate relies on (issue 33):
``InitProcessGroupKwargs``, ..."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notebook_accel import Accelerator, InitProcessGroupKwargs
from notebook_accel.runtime import state as state_module

ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "NOTEBOOK_ACCEL_DEVICE", "ACCELERATE_TORCH_DEVICE")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def groups_made(monkeypatch):
    """Rank 0 of 2; the process group that would be created is recorded instead."""
    made = []
    monkeypatch.setattr(state_module, "ensure_process_group", lambda *args, **kwargs: made.append((args, kwargs)))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("NOTEBOOK_ACCEL_DEVICE", "cpu")
    return made


def test_init_process_group_kwargs_reach_the_process_group(groups_made):
    handler = InitProcessGroupKwargs(timeout=timedelta(seconds=7), init_method="tcp://127.0.0.1:1")
    Accelerator(kwargs_handlers=[handler])
    (backend, rank, world, timeout, _device), kwargs = groups_made[-1]
    assert (backend, rank, world, timeout) == ("gloo", 0, 2, timedelta(seconds=7))
    assert kwargs["init_method"] == "tcp://127.0.0.1:1"


def test_the_default_nccl_backend_means_the_devices_own_and_another_is_used_as_given(groups_made):
    assert InitProcessGroupKwargs().to_kwargs() == {}
    Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="nccl")])
    assert groups_made[-1][0][0] == "gloo"  # on the CPU
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="mpi")])
    assert groups_made[-1][0][0] == "mpi" == accelerator.state.backend


def test_the_peers_own_handler_is_understood(groups_made):
    peer = pytest.importorskip("accelerate.utils")
    Accelerator(kwargs_handlers=[peer.InitProcessGroupKwargs(timeout=timedelta(seconds=3))])
    assert groups_made[-1][0][3] == timedelta(seconds=3)
