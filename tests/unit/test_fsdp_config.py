"""FSDP settings without processes: the plugin's fields and variables, the config file's keys."""

from __future__ import annotations

import warnings

import pytest

from notebook_accel.config import load_config
from notebook_accel.launch.planning.options import fill_options
from notebook_accel.strategies.fsdp.config import plugin_environment, plugin_from_config
from notebook_accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin, resolve_plugin

FSDP_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: Block,Layer
  fsdp_reshard_after_forward: false
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_offload_params: true
  fsdp_cpu_ram_efficient_loading: true
  fsdp_activation_checkpointing: true
mixed_precision: bf16
num_processes: 2
use_cpu: true
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("FSDP_")] + ["ACCELERATE_USE_FSDP"]:
        monkeypatch.delenv(name, raising=False)


def test_defaults_are_fsdp2_full_shard_sharded_checkpoints():
    plugin = FullyShardedDataParallelPlugin()
    assert (plugin.fsdp_version, plugin.reshard_after_forward, plugin.auto_wrap_policy, plugin.state_dict_type,
            plugin.cpu_offload) == (2, True, "NO_WRAP", "SHARDED_STATE_DICT", False)


def test_unset_fields_come_from_the_peers_variables(monkeypatch):
    assert resolve_plugin(None) is None
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "SIZE_BASED_WRAP")
    monkeypatch.setenv("FSDP_MIN_NUM_PARAMS", "1000")
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    plugin = resolve_plugin(None)
    assert (plugin.auto_wrap_policy, plugin.min_num_params, plugin.cpu_offload) == ("SIZE_BASED_WRAP", 1000, True)


def test_fsdp1_settings_warn_and_map():
    with pytest.warns(UserWarning, match="fsdp_version 1 is not implemented.*sharding_strategy SHARD_GRAD_OP"):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=1, sharding_strategy="SHARD_GRAD_OP")
    assert plugin.reshard_after_forward is False
    with pytest.warns(UserWarning, match="backward_prefetch is an FSDP1 setting"):
        FullyShardedDataParallelPlugin(backward_prefetch="BACKWARD_PRE")
    with pytest.warns(UserWarning, match="FSDP1 spelling"):
        assert FullyShardedDataParallelPlugin(reshard_after_forward="FULL_SHARD").reshard_after_forward is True


@pytest.mark.parametrize(("fields", "message"), [
    ({"forward_prefetch": True}, "forward_prefetch=True is not available in FSDP2"),
    ({"state_dict_type": "LOCAL_STATE_DICT"}, "valid values: \\['SHARDED_STATE_DICT', 'FULL_STATE_DICT'\\]"),
    ({"reshard_after_forward": "sometimes"}, "FSDP2 takes a bool"),
    ({"auto_wrap_policy": "LAYER_WRAP"}, "valid values: \\['TRANSFORMER_BASED_WRAP'"),
    ({"sharding_strategy": "NO_SHARD"}, "no FSDP2 equivalent.*DDP"),
    ({"min_num_params": "many"}, "an integer >= 0"),
    ({"fsdp_version": 3}, "valid values: 1, 2"),
    ({"activation_checkpointing": True}, "activation_checkpointing needs auto_wrap_policy.*got NO_WRAP"),
])
def test_refused_values_name_the_choices(fields, message):
    with pytest.raises(ValueError, match=message):
        FullyShardedDataParallelPlugin(**fields)


def test_config_keys_become_worker_variables_that_rebuild_the_plugin(monkeypatch, tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text(FSDP_YAML)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fsdp_config is used: no "not used" note
        config = load_config(path)
        options = fill_options({"num_processes": None, "device": None}, path)
    assert config.device_type == "cpu" and options["num_processes"] == 2
    env = options["worker_env"]
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "Block,Layer"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rebuilt = resolve_plugin(None)  # what a worker's Accelerator() builds
    expected = plugin_from_config(config.extra["fsdp_config"])
    assert rebuilt == expected
    assert (rebuilt.reshard_after_forward, rebuilt.state_dict_type, rebuilt.cpu_offload,
            rebuilt.cpu_ram_efficient_loading, rebuilt.activation_checkpointing,
            rebuilt.transformer_cls_names_to_wrap) == (False, "FULL_STATE_DICT", True, True, True, ["Block", "Layer"])
    assert plugin_environment(rebuilt) == env


def test_bad_fsdp_config_fails_before_launch_naming_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(FSDP_YAML.replace("fsdp_offload_params: true", "fsdp_offload_param: true"))
    with pytest.raises(ValueError, match=r"bad.yaml: fsdp_config: unknown fsdp_config key\(s\) "
                                         r"\['fsdp_offload_param'\]; valid keys: .*'fsdp_offload_params'"):
        fill_options({"num_processes": None}, path)


def test_other_distributed_types_add_no_variables(tmp_path):
    path = tmp_path / "ddp.yaml"
    path.write_text(FSDP_YAML.replace("distributed_type: FSDP", "distributed_type: MULTI_CPU"))
    assert fill_options({"num_processes": None}, path)["worker_env"] == {}


def test_the_peers_plugin_object_is_accepted():
    accelerate = pytest.importorskip("accelerate")
    peer = accelerate.FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"],
        reshard_after_forward=False, state_dict_type="FULL_STATE_DICT")
    ours = resolve_plugin(peer)
    assert (ours.auto_wrap_policy, ours.transformer_cls_names_to_wrap, ours.reshard_after_forward,
            ours.state_dict_type, ours.cpu_offload) == ("TRANSFORMER_BASED_WRAP", ["Block"], False,
                                                        "FULL_STATE_DICT", False)
    offloading = accelerate.FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=True)
    assert resolve_plugin(offloading).cpu_offload is True


def test_launcher_argument_overrides_the_file():
    from notebook_accel.strategies.fsdp.config import launch_environment

    from_file = {"ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "true", "OTHER": "1"}
    assert launch_environment(None, from_file) == from_file
    assert launch_environment(False, from_file) == {"OTHER": "1"}
    assert launch_environment(True, from_file) == from_file
    assert launch_environment(True, {})["FSDP_AUTO_WRAP_POLICY"] == "NO_WRAP"
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=10)
    env = launch_environment(plugin, from_file)
    assert env["FSDP_OFFLOAD_PARAMS"] == "false" and env["FSDP_MIN_NUM_PARAMS"] == "10" and env["OTHER"] == "1"
    with pytest.raises(ValueError, match=r"\['auto_wrap_policy'\] cannot be sent.*Accelerator\(fsdp_plugin=...\)"):
        launch_environment(FullyShardedDataParallelPlugin(auto_wrap_policy=lambda m: True), {})
    with pytest.raises(TypeError, match="pass True, False, None or a FullyShardedDataParallelPlugin"):
        launch_environment("yes", {})


def test_changing_the_device_keeps_the_fsdp_strategy():
    from notebook_accel.config import LaunchConfig

    cfg = LaunchConfig(distributed_type="FSDP", num_processes=2, extra={"fsdp_config": {"fsdp_version": 2}})
    on_cpu = cfg.with_device("cpu")
    assert (on_cpu.distributed_type, on_cpu.use_cpu, on_cpu.device_type) == ("FSDP", True, "cpu")
    assert on_cpu.with_device(None).distributed_type == "FSDP" and on_cpu.extra == cfg.extra


def test_xla_is_refused_naming_the_alternatives():
    import torch

    from notebook_accel.strategies.base import StrategyContext
    from notebook_accel.strategies.fsdp.strategy import FsdpStrategy

    with pytest.raises(ValueError, match="does not run on XLA devices.*'cuda' or 'cpu'"):
        FsdpStrategy(StrategyContext.on_device(torch.device("xla")), FullyShardedDataParallelPlugin())


def test_config_panel_strategy_choice_round_trips_the_file(tmp_path):
    import yaml

    from magics.panel.form import config_panel
    from notebook_accel.machine.hardware import Hardware

    path = tmp_path / "fsdp.yaml"
    path.write_text(FSDP_YAML)
    panel = config_panel(path, hardware=Hardware(cpu_count=2))
    fields = panel.strategy
    assert (fields.strategy.value, fields.wrap.value, fields.classes.value, fields.reshard.value,
            fields.state_dict_type.value, fields.offload.value) == (
        "FSDP", "TRANSFORMER_BASED_WRAP", "Block,Layer", False, "FULL_STATE_DICT", True)
    assert fields.options.layout.display == "" and fields.min_num_params.layout.display == "none"
    fields.classes.value = ""
    # As the peer: no classes named means the model's own _no_split_modules; a note, not an error.
    assert "_no_split_modules" in panel.messages.value and not panel.save_button.disabled
    fields.wrap.value = "SIZE_BASED_WRAP"
    fields.min_num_params.value = 5000
    panel._show_code()
    assert "fsdp=True" in panel.code.value and "--fsdp" in panel.code.value
    saved = yaml.safe_load(panel.save().read_text())
    assert (saved["distributed_type"], saved["use_cpu"]) == ("FSDP", True)
    assert saved["fsdp_config"]["fsdp_auto_wrap_policy"] == "SIZE_BASED_WRAP"
    assert saved["fsdp_config"]["fsdp_min_num_params"] == 5000
    assert saved["fsdp_config"]["fsdp_activation_checkpointing"] is True  # a key the panel does not show: kept
    fields.strategy.value = "DDP"
    assert fields.options.layout.display == "none"
    saved = yaml.safe_load(panel.save().read_text())
    assert saved["distributed_type"] == "MULTI_GPU"  # DDP on 2 CPU processes (use_cpu: true)


def test_the_plugin_is_on_the_accelerators_state_as_in_the_peer():
    from notebook_accel import Accelerator

    plugin = FullyShardedDataParallelPlugin()
    accelerator = Accelerator(fsdp_plugin=plugin)
    assert accelerator.state.fsdp_plugin is accelerator.fsdp_plugin is plugin  # peft's examples set its policy there
    assert Accelerator().state.fsdp_plugin is None
