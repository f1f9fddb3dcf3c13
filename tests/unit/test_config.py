"""LaunchConfig, its YAML file (the peer's format), and the launch precedence."""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest
import yaml

from notebook_accel import config as cfgmod
from notebook_accel.config import (
    LaunchConfig,
    default_config_path,
    detect_default_config,
    find_config_file,
    load_config,
    resolve_launch_options,
    save_config,
)
from notebook_accel.machine.hardware import Hardware

# As `accelerate config` (1.15) writes it for two GPUs, keys we do not use included.
PEER_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
dynamo_config: {}
enable_cpu_affinity: false
gpu_ids: all
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A home of our own and no HF_HOME (the config dirs are the test's: tests/conftest.py)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HOME")
    return tmp_path


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_round_trip(tmp_path):
    cfg = LaunchConfig(num_processes=4, num_machines=2, machine_rank=1, main_process_ip="10.0.0.1",
                       main_process_port=29600, gpu_ids="0,1", mixed_precision="fp16",
                       start_method="forkserver").with_device("cuda")
    path = save_config(cfg, tmp_path / "c.yaml")
    loaded = load_config(path)
    assert loaded == cfg
    assert loaded.source == path
    assert loaded.device_type == "cuda" and loaded.distributed_type == "MULTI_GPU"


def test_default_start_method_and_unset_values_are_left_out_of_the_file(tmp_path):
    path = save_config(LaunchConfig(), tmp_path / "c.yaml")
    data = yaml.safe_load(path.read_text())
    assert "start_method" not in data and "num_processes" not in data
    assert data["mixed_precision"] == "no" and data["distributed_type"] == "NO"
    assert load_config(path) == LaunchConfig()


def test_peer_file_loads_and_keeps_unused_keys_on_save(tmp_path):
    peer = _write(tmp_path / "peer.yaml", PEER_YAML)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only inert peer keys: nothing to report
        cfg = load_config(peer)
    assert (cfg.num_processes, cfg.mixed_precision, cfg.gpu_ids) == (2, "bf16", "all")
    assert cfg.device_type == "cuda"
    assert cfg.extra["rdzv_backend"] == "static" and cfg.extra["downcast_bf16"] == "no"
    out = save_config(cfg, tmp_path / "ours.yaml")
    assert yaml.safe_load(out.read_text()) == yaml.safe_load(PEER_YAML)


def test_peer_json_file_from_accelerate_config_default_loads(tmp_path):
    # `accelerate config default` writes JSON into default_config.yaml
    data = {"compute_environment": "LOCAL_MACHINE", "mixed_precision": "no", "use_cpu": True,
            "num_processes": 1, "distributed_type": "NO", "debug": False,
            "enable_cpu_affinity": False}
    cfg = load_config(_write(tmp_path / "default_config.yaml", json.dumps(data, indent=2)))
    assert cfg.device_type == "cpu" and cfg.num_processes == 1


def test_unknown_keys_reported_once_and_kept(tmp_path):
    text = PEER_YAML + "mixed_precison: fp16\ndeepspeed_config:\n  zero_stage: 2\n"
    path = _write(tmp_path / "c.yaml", text)
    with pytest.warns(UserWarning) as record:
        cfg = load_config(path)
    message = str(record[0].message)
    assert len(record) == 1 and str(path) in message
    assert "'mixed_precison'" in message and "did you mean 'mixed_precision'" in message
    assert "'deepspeed_config' is not used" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(path)  # reported once
    saved = yaml.safe_load(save_config(cfg, tmp_path / "out.yaml").read_text())
    assert saved["mixed_precison"] == "fp16" and saved["deepspeed_config"] == {"zero_stage": 2}


def test_unsupported_distributed_type_loads_with_a_warning(tmp_path):
    path = _write(tmp_path / "c.yaml", PEER_YAML.replace("MULTI_GPU", "MEGATRON_LM"))
    with pytest.warns(UserWarning, match="'MEGATRON_LM' is not supported"):
        cfg = load_config(path)
    assert cfg.device_type is None
    assert yaml.safe_load(save_config(cfg, tmp_path / "o.yaml").read_text())["distributed_type"] == "MEGATRON_LM"


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = _write(tmp_path / "broken.yaml", "num_processes: 2\nmixed_precision: [bf16\nuse_cpu: x\n")
    with pytest.raises(ValueError, match="malformed YAML") as err:
        load_config(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value)


def test_top_level_must_be_a_mapping(tmp_path):
    path = _write(tmp_path / "list.yaml", "- num_processes\n- 2\n")
    with pytest.raises(ValueError, match="expected a mapping") as err:
        load_config(path)
    assert str(path) in str(err.value)
    with pytest.raises(ValueError, match="keys must be names.*got 2"):
        load_config(_write(tmp_path / "intkey.yaml", "2: num_processes\n"))


@pytest.mark.parametrize(("key", "value", "valid"), [
    ("mixed_precision", "fp32", "'no', 'fp16', 'bf16', 'fp8'"),
    ("distributed_type", "MULTI_FOO", "'MULTI_GPU'"),
    ("compute_environment", "AMAZON_SAGEMAKER", "'LOCAL_MACHINE'"),
    ("start_method", "thread", "'auto', 'fork', 'forkserver', 'spawn'"),
    ("num_processes", "0", "an integer >= 1"),
    ("main_process_port", "70000", "an integer from 1 to 65535"),
    ("machine_rank", "1", "an integer from 0 to 0"),
    ("use_cpu", "maybe", "true or false"),
    ("gpu_ids", "first", "'all'"),
])
def test_bad_value_names_file_key_line_and_valid_values(tmp_path, key, value, valid):
    path = _write(tmp_path / "bad.yaml", f"num_machines: 1\n{key}: {value}\n")
    with pytest.raises(ValueError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message and f"{key}=" in message and "line 2" in message
    assert valid in message


def test_bare_yaml_no_means_no_mixed_precision(tmp_path):
    assert load_config(_write(tmp_path / "c.yaml", "mixed_precision: no\n")).mixed_precision == "no"


def test_values_are_validated_in_python_too():
    with pytest.raises(ValueError, match="mixed_precision='fp32' is not one of .*'bf16'"):
        LaunchConfig(mixed_precision="fp32")
    with pytest.raises(ValueError, match="device='gpu' is not one of .*'cuda'"):
        LaunchConfig().with_device("gpu")
    assert LaunchConfig(num_processes=-1).num_processes is None  # the peer's "not set"


def test_missing_files(tmp_path):
    assert find_config_file() is None
    cfg = load_config()
    assert cfg == LaunchConfig() and cfg.source is None
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "nope.yaml")


def test_default_path_follows_xdg_and_env_variable(isolated, monkeypatch):
    assert default_config_path() == isolated / "cache" / "notebook_accel" / "default_config.yaml"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_config_path() == isolated / "home" / ".cache/notebook_accel/default_config.yaml"
    chosen = isolated / "elsewhere" / "mine.yaml"
    monkeypatch.setenv(cfgmod.CONFIG_FILE_ENV, str(chosen))
    assert default_config_path() == chosen
    save_config(LaunchConfig(num_processes=3))
    assert chosen.is_file() and load_config().num_processes == 3


def test_falls_back_to_the_peer_file(isolated, monkeypatch):
    peer = _write(isolated / "cache" / "huggingface" / "accelerate" / "default_config.yaml",
                  PEER_YAML)
    assert find_config_file() == peer and load_config().num_processes == 2
    monkeypatch.setenv("HF_HOME", str(isolated / "hf"))
    assert find_config_file() is None
    peer = _write(isolated / "hf" / "accelerate" / "default_config.yaml", PEER_YAML)
    assert load_config().source == peer
    save_config(LaunchConfig(num_processes=5))  # ours, never the peer's
    assert load_config().num_processes == 5 and yaml.safe_load(peer.read_text())["num_processes"] == 2
    assert load_config().source == default_config_path()


def test_no_peer_fallback_when_env_variable_names_a_missing_file(isolated, monkeypatch):
    _write(isolated / "cache" / "huggingface" / "accelerate" / "default_config.yaml", PEER_YAML)
    monkeypatch.setenv(cfgmod.CONFIG_FILE_ENV, str(isolated / "missing.yaml"))
    assert find_config_file() is None and load_config() == LaunchConfig()


def test_save_modes_and_no_temp_files_left(isolated):
    path = save_config(LaunchConfig(num_processes=2))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.chmod(0o644)
    save_config(LaunchConfig(num_processes=3))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["default_config.yaml"]


def test_save_is_atomic(isolated, monkeypatch):
    path = save_config(LaunchConfig(num_processes=2))
    before = path.read_text()

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        save_config(LaunchConfig(num_processes=3))
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir()] == ["default_config.yaml"]


@pytest.mark.parametrize(("distributed_type", "use_cpu", "device"), [
    ("NO", False, None), ("NO", True, "cpu"), ("MULTI_CPU", False, "cpu"),
    ("MULTI_GPU", False, "cuda"), ("XLA", False, "xla"), ("TPU", False, "xla"),
    ("MULTI_GPU", True, "cpu"), ("FSDP", False, None), ("multi_gpu", False, "cuda"),
])
def test_device_type_from_peer_keys(distributed_type, use_cpu, device):
    assert LaunchConfig(distributed_type=distributed_type, use_cpu=use_cpu).device_type == device


def test_with_device_writes_the_peer_keys():
    two = LaunchConfig(num_processes=2)
    # The peer's `accelerate launch` starts several processes only for MULTI_GPU (its MULTI_CPU
    # runs one, mpirun aside); use_cpu says cpu.
    assert (two.with_device("cpu").distributed_type, two.with_device("cpu").use_cpu) == (
        "MULTI_GPU", True)
    assert (two.with_device("cuda").distributed_type, two.with_device("cuda").use_cpu) == (
        "MULTI_GPU", False)
    assert LaunchConfig(num_processes=1).with_device("cpu").distributed_type == "NO"
    assert LaunchConfig(num_machines=2).with_device("cpu").distributed_type == "MULTI_GPU"
    assert two.with_device("xla").distributed_type == "XLA"
    assert two.with_device("cpu").with_device(None).device_type is None  # auto: NO
    mpirun = LaunchConfig(num_processes=2, distributed_type="MULTI_CPU",
                          extra={"mpirun_config": {"mpirun_hostfile": "hosts"}})
    assert mpirun.with_device("cpu").distributed_type == "MULTI_CPU"  # the peer's mpirun launch
    assert LaunchConfig(num_processes=2, distributed_type="MULTI_CPU").with_device(
        "cpu").distributed_type == "MULTI_GPU"


@pytest.mark.parametrize("device", ["cpu", "cuda", "xla"])
@pytest.mark.parametrize("processes", [1, 3])
def test_saved_device_and_processes_read_back(tmp_path, device, processes):
    cfg = LaunchConfig(num_processes=processes).with_device(device)
    data = yaml.safe_load(save_config(cfg, tmp_path / "c.yaml").read_text())
    written = {("cpu", 3): "MULTI_GPU", ("cuda", 3): "MULTI_GPU", ("xla", 3): "XLA",
               ("cpu", 1): "NO", ("cuda", 1): "NO", ("xla", 1): "XLA"}[device, processes]
    assert (data["distributed_type"], data["use_cpu"], data["num_processes"]) == (
        written, device == "cpu", processes)
    back = load_config(tmp_path / "c.yaml")
    # one process on cuda is the peer's NO: auto-detect, which is cuda on a GPU machine
    assert back.device_type == (None if (device, processes) == ("cuda", 1) else device)
    assert back.num_processes == processes and back.with_device(device) == cfg


def test_precedence_explicit_over_env_over_file(monkeypatch):
    cfg = LaunchConfig(num_processes=4, mixed_precision="fp16", start_method="spawn",
                       main_process_port=29999, main_process_ip="10.1.1.1", num_machines=2,
                       machine_rank=1, gpu_ids="0,1").with_device("cuda")
    opts = resolve_launch_options({}, cfg)
    assert opts == {"num_processes": 4, "mixed_precision": "fp16", "start_method": "spawn",
                    "use_port": 29999, "master_addr": "10.1.1.1", "num_nodes": 2, "node_rank": 1,
                    "device": "cuda", "gpu_ids": "0,1", "cluster": None, "dynamo_backend": None,
                    "heal": None, "snapshot_every": None, "snapshot_dir": None, "snapshot_in_peers": None,
                    "check_collectives": None, "idle_timeout": None}
    monkeypatch.setenv("NOTEBOOK_ACCEL_NUM_PROCESSES", "3")
    monkeypatch.setenv("NOTEBOOK_ACCEL_MIXED_PRECISION", "BF16")
    monkeypatch.setenv("NOTEBOOK_ACCEL_START_METHOD", "fork")
    opts = resolve_launch_options({"num_processes": None}, cfg)
    assert (opts["num_processes"], opts["mixed_precision"], opts["start_method"]) == (
        3, "bf16", "fork")
    opts = resolve_launch_options({"num_processes": 2, "mixed_precision": "no",
                                   "start_method": "forkserver", "use_port": 1234}, cfg)
    assert (opts["num_processes"], opts["mixed_precision"], opts["start_method"],
            opts["use_port"]) == (2, "no", "forkserver", 1234)


def test_unset_stays_none_without_a_file():
    opts = resolve_launch_options({"num_nodes": None}, None)
    assert set(opts.values()) == {None} and len(opts) == 17


def test_heal_from_the_file_and_the_environment(tmp_path, monkeypatch):
    """The pool's heal rule is a contract row: the config file's own key, the environment."""
    path = tmp_path / "c.yaml"
    path.write_text("heal: false\n")
    assert resolve_launch_options({}, load_config(path))["heal"] is False
    monkeypatch.setenv("NOTEBOOK_ACCEL_HEAL", "true")
    assert resolve_launch_options({}, load_config(path))["heal"] is True
    path.write_text("heal: sometimes\n")
    with pytest.raises(ValueError, match="heal"):
        load_config(path)


def test_precedence_errors(monkeypatch):
    with pytest.raises(ValueError, match="unknown launch option.*'nprocs'.*'num_processes'"):
        resolve_launch_options({"nprocs": 2}, None)
    with pytest.raises(ValueError, match="start_method='threads' is not one of .*'forkserver'"):
        resolve_launch_options({"start_method": "threads"}, None)
    monkeypatch.setenv("NOTEBOOK_ACCEL_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="NOTEBOOK_ACCEL_NUM_PROCESSES.*integer >= 1"):
        resolve_launch_options({}, None)
    assert resolve_launch_options({"num_processes": 2}, None)["num_processes"] == 2


@pytest.mark.parametrize(("hw", "device", "nproc"), [
    (Hardware(cpu_count=8), "cpu", None),
    (Hardware(cpu_count=8, gpu_names=("H100", "H100")), "cuda", 2),
    (Hardware(cpu_count=8, tpu=True), "xla", None),
])
def test_detect_default_config(monkeypatch, hw, device, nproc):
    monkeypatch.setattr("notebook_accel.machine.hardware.detect", lambda: hw)
    cfg = detect_default_config()
    assert (cfg.device_type, cfg.num_processes) == (device, nproc)


def test_saved_file_is_readable_by_the_peer(tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    cfg = LaunchConfig(num_processes=2, mixed_precision="bf16").with_device("cpu")
    path = save_config(cfg, tmp_path / "default_config.yaml")
    peer = config_args.load_config_from_file(str(path))
    assert (peer.num_processes, peer.mixed_precision, peer.use_cpu) == (2, "bf16", True)
    assert peer.distributed_type == "MULTI_GPU"  # its MULTI_CPU would start one process


def test_a_switch_takes_true_or_false_only():
    """A bool option never reads a word it does not know as true (``return_all="sometimes"``)."""
    from notebook_accel.contract import OPTIONS

    assert OPTIONS["heal"].check("False", "environment variable NOTEBOOK_ACCEL_HEAL") is False
    assert OPTIONS["return_all"].check(True) is True
    assert OPTIONS["return_all"].check("no") is False
    with pytest.raises(ValueError, match="return_all='sometimes'.*true or false"):
        OPTIONS["return_all"].check("sometimes")


def test_snapshot_in_peers_from_the_file_and_the_environment(tmp_path, monkeypatch):
    """Snapshots kept in the peers' memory is a contract row: the config file's own key, the environment."""
    path = tmp_path / "c.yaml"
    path.write_text("snapshot_in_peers: true\n")
    assert resolve_launch_options({}, load_config(path))["snapshot_in_peers"] is True
    monkeypatch.setenv("NOTEBOOK_ACCEL_SNAPSHOT_IN_PEERS", "false")
    assert resolve_launch_options({}, load_config(path))["snapshot_in_peers"] is False
