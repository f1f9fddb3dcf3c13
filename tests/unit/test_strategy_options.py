"""The strategies' launch options (``fsdp=``, ``deepspeed=``), rows of the strategy registry: what
each value makes of the workers' variables, over the config file's strategy."""

from __future__ import annotations

import pytest

from notebook_accel.launch.planning.options import fill_options
from notebook_accel.launch.planning.request import LaunchRequest, door_options
from notebook_accel.strategies.registry import STRATEGIES


@pytest.fixture
def files(tmp_path):
    ds = tmp_path / "ds.yaml"
    ds.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n")
    fsdp = tmp_path / "fsdp.yaml"
    fsdp.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n")
    return {"ds": ds, "fsdp": fsdp, "none": None}


def _env(file, **chosen):
    return fill_options(LaunchRequest.from_keywords("notebook_launcher", chosen), file)["worker_env"]


def test_every_door_takes_the_registrys_strategy_options():
    rows = {name for name, r in STRATEGIES.items() if r.option is not None}
    assert rows == {"fsdp", "deepspeed"}
    for door in ("notebook_launcher", "WorkerPool"):
        assert rows <= set(door_options(door))


def test_true_asks_for_the_strategy_with_the_files_section_else_its_defaults(files):
    assert _env(files["ds"], deepspeed=True) == _env(files["ds"])  # the file's section
    assert _env(files["ds"])["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"
    assert _env(files["none"], deepspeed=True)["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert _env(files["none"], fsdp=True)["ACCELERATE_USE_FSDP"] == "true"
    # the argument wins over the file's other strategy
    assert "ACCELERATE_USE_DEEPSPEED" not in _env(files["ds"], fsdp=True)
    assert "ACCELERATE_USE_FSDP" not in _env(files["fsdp"], deepspeed=True)


def test_false_refuses_the_files_strategy_and_none_leaves_it(files):
    assert _env(files["ds"], deepspeed=False) == {}
    assert _env(files["fsdp"], fsdp=False) == {}
    assert _env(files["fsdp"], deepspeed=False) == _env(files["fsdp"])
    assert _env(files["none"]) == {}


def test_two_strategies_or_a_plugin_the_option_cannot_send_are_refused(files):
    with pytest.raises(ValueError, match="deepspeed=True and fsdp=True: choose one strategy"):
        _env(files["none"], fsdp=True, deepspeed=True)
    with pytest.raises(TypeError, match=r"deepspeed=.*Accelerator\(deepspeed_plugin=...\)"):
        _env(files["none"], deepspeed=object())
