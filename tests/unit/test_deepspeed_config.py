"""DeepSpeedPlugin and ``deepspeed_config:`` (no deepspeed needed): validation, the generated
config, the workers' variables, and the error before any worker starts."""

from __future__ import annotations

import json

import pytest
import torch

from notebook_accel import DeepSpeedPlugin, notebook_launcher
from notebook_accel.strategies.deepspeed.config import plugin_from_config, strategy_environment
from notebook_accel.strategies.deepspeed.plugin import resolve_plugin
from notebook_accel.strategies.deepspeed.runtime import fill_auto


def test_generated_config_leaves_job_values_auto_and_turns_off_deepspeeds_silent_clipping():
    plugin = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu", zero3_save_16bit_model=True)
    config = plugin.deepspeed_config
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert config["train_micro_batch_size_per_gpu"] == config["gradient_accumulation_steps"] == "auto"
    assert "gradient_clipping" not in config  # filled at prepare: 0.0 unless asked (DeepSpeed's default is 1.0)
    filled = fill_auto(config, micro_batch=4, accumulation=2, world_size=2, mixed_precision="bf16",
                       model=torch.nn.Linear(2, 2))
    assert (filled["train_micro_batch_size_per_gpu"], filled["train_batch_size"]) == (4, 16)
    assert filled["gradient_clipping"] == 0.0 and filled["bf16"] == {"enabled": True}
    assert filled["zero_optimization"]["offload_optimizer"]["pin_memory"] is False  # no accelerator here
    with pytest.raises(ValueError, match="train_batch_size=5 is not micro batch 4 x accumulation 2 x 2"):
        fill_auto({**config, "train_batch_size": 5}, micro_batch=4, accumulation=2, world_size=2,
                  mixed_precision="no", model=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="'optimizer' section is not supported"):
        fill_auto({**config, "optimizer": {"type": "AdamW"}}, micro_batch=4, accumulation=1, world_size=2,
                  mixed_precision="no", model=torch.nn.Linear(2, 2))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"zero_stage": 4}, r"invalid zero_stage 4; valid values: \[0, 1, 2, 3\]"),
    ({"offload_optimizer_device": "gpu"}, r"invalid offload_optimizer_device 'gpu'; valid values"),
    ({"zero_stage": 2, "offload_param_device": "cpu"}, "offload_param_device 'cpu' needs zero_stage 3"),
    ({"zero_stage": 0, "offload_optimizer_device": "cpu"}, "offload_optimizer_device 'cpu' needs zero_stage 1, 2"),
    ({"offload_param_device": "nvme", "zero_stage": 3}, "needs offload_param_nvme_path"),
    ({"gradient_clipping": "lots"}, "invalid value 'lots' for gradient_clipping"),
    ({"hf_ds_config": "/no/such.json"}, "no such file"),
    ({"hf_ds_config": {"train_batch_size": 8}}, "no 'zero_optimization' section"),
    ({"enable_msamp": True}, "MS-AMP"),
])
def test_bad_plugin_values_name_the_value_and_the_valid_ones(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeepSpeedPlugin(**kwargs)


def test_a_deepspeed_json_file_fills_only_its_auto_values(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": "auto"}, "gradient_clipping": 0.3}))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path), zero_stage=1, gradient_clipping=9.0)
    assert plugin.zero_stage == 1 and plugin.deepspeed_config["gradient_clipping"] == 0.3


def test_config_file_keys_become_the_workers_variables_and_back(monkeypatch):
    env = strategy_environment("DEEPSPEED", {"zero_stage": 3, "gradient_clipping": 1.0,
                                             "zero3_save_16bit_model": True, "offload_optimizer_device": "cpu"})
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plugin = resolve_plugin(None)  # what Accelerator() does in a worker
    assert plugin.zero_stage == 3 and plugin.zero3_save_16bit_model
    assert plugin.deepspeed_config["gradient_clipping"] == 1.0 and plugin.offload_optimizer_device == "cpu"
    assert strategy_environment("MULTI_CPU", {"zero_stage": 3}) == {}
    with pytest.raises(ValueError, match=r"unknown deepspeed_config key\(s\) \['zero_stag'\]; valid keys"):
        plugin_from_config({"zero_stag": 3})


def test_the_peers_plugin_is_converted():
    accelerate = pytest.importorskip("accelerate.utils")
    try:
        peer = accelerate.DeepSpeedPlugin(zero_stage=3, gradient_clipping=0.5)
    except Exception as err:  # the peer's plugin needs transformers for some paths
        pytest.skip(f"the peer's DeepSpeedPlugin cannot be built here: {err}")
    ours = resolve_plugin(peer)
    assert ours.zero_stage == 3 and ours.deepspeed_config["gradient_clipping"] == 0.5


def test_bad_deepspeed_config_fails_before_any_worker_starts(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text("distributed_type: DEEPSPEED\nuse_cpu: true\nnum_processes: 2\n"
                    "deepspeed_config:\n  zero_stage: 7\n")
    with pytest.raises(ValueError, match=r"ds\.yaml: deepspeed_config: invalid zero_stage 7"):
        notebook_launcher(print, config_file=str(path))


def test_a_json_file_travels_with_the_keys_set_beside_it(tmp_path, monkeypatch):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "gradient_clipping": "auto",
                                "gradient_accumulation_steps": "auto"}))
    env = strategy_environment("DEEPSPEED", {"deepspeed_config_file": str(path), "zero3_init_flag": True,
                                             "gradient_accumulation_steps": 4, "gradient_clipping": 1.0})
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plugin = resolve_plugin(None)  # the worker's
    assert (plugin.zero3_init_flag, plugin.gradient_accumulation_steps, plugin.gradient_clipping) == (True, 4, 1.0)
    assert plugin.zero_stage == 3


def test_auto_stage_and_auto_16bit_gather_resolve_like_the_peer():
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {
        "stage": "auto", "stage3_gather_16bit_weights_on_model_save": "auto"}})
    assert plugin.zero_stage == 2 and plugin.zero3_save_16bit_model is False


def test_dummy_optim_and_scheduler_exist_and_say_what_to_do_instead():
    from notebook_accel.utils import DummyOptim, DummyScheduler

    params = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(ValueError, match=r"'optimizer' section.*torch.optim.AdamW\(params, lr=0.01\)"):
        DummyOptim(params, lr=0.01)
    with pytest.raises(ValueError, match="'scheduler' section.*torch LR scheduler"):
        DummyScheduler(None, total_num_steps=10, warmup_num_steps=2)
