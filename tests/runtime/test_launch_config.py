"""The launcher takes unset options from the environment, then the config file."""

from __future__ import annotations

import os

import pytest

from notebook_accel import notebook_launcher


def _env():
    return os.environ["WORLD_SIZE"], os.environ["NOTEBOOK_ACCEL_MIXED_PRECISION"]


def test_config_file_fills_unset_options_and_arguments_win(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTEBOOK_ACCEL_MIXED_PRECISION", raising=False)
    monkeypatch.delenv("NOTEBOOK_ACCEL_NUM_PROCESSES", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
                      "num_processes: 2\nmixed_precision: bf16\nuse_cpu: true\n")
    assert notebook_launcher(_env, config_file=config) == ("2", "bf16")
    assert notebook_launcher(_env, num_processes=1, mixed_precision="no",
                             config_file=config) == ("1", "no")
    monkeypatch.setenv("NOTEBOOK_ACCEL_CONFIG_FILE", str(config))
    monkeypatch.setenv("NOTEBOOK_ACCEL_MIXED_PRECISION", "fp16")  # environment beats the file
    assert notebook_launcher(_env) == ("2", "fp16")


def test_bad_config_value_names_the_file(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("mixed_precision: fp32\n")
    with pytest.raises(ValueError, match="bad.yaml") as info:
        notebook_launcher(_env, config_file=config)
    assert "mixed_precision" in str(info.value)
