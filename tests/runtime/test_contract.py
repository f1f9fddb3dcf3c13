"""The options table (notebook_accel.contract) against every place that names the launch options,
and the errors for a bad value: each names where the value came from and the valid choices."""

from __future__ import annotations

import argparse
import inspect

import pytest

from notebook_accel import contract, notebook_launcher
from notebook_accel.cli import command as cli
from notebook_accel.config import ENV_OPTIONS, LaunchConfig, resolve_launch_options
from notebook_accel.contract import OPTIONS
from notebook_accel.machine.hardware import Hardware

VALID_PRECISIONS = "'no', 'fp16', 'bf16'"


@pytest.fixture
def isolated(tmp_path):
    """The test's default config location (tests/conftest.py isolates it)."""
    return tmp_path / "cache" / "notebook_accel" / "default_config.yaml"


def _never_runs():
    raise AssertionError("a worker ran")


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}  # noqa: SLF001


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = cli._build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    return sub.choices[name]


# --- every front end matches the table ------------------------------------------------------

def test_notebook_launcher_takes_every_option_of_the_table():
    """Its signature is made from the table (contract.OPTIONS and the strategies' rows): the
    peer's positional parameters in the peer's order, the others keyword-only."""
    from notebook_accel.launch.planning.request import door_options, launch_options

    params = inspect.signature(notebook_launcher).parameters
    peer = ["function", "args", "num_processes", "mixed_precision", "use_port", "master_addr",
            "node_rank", "num_nodes", "rdzv_backend", "rdzv_endpoint", "rdzv_conf", "rdzv_id",
            "max_restarts", "monitor_interval", "log_line_prefix_template"]  # accelerate 1.x
    assert list(params)[:len(peer)] == peer  # the peer's positional order
    assert set(params) - {"function", "args", "kwargs"} == set(door_options("notebook_launcher"))
    for name, option in launch_options().items():
        assert (name in params) == (option.argument and not option.pool_only), name
        if name in params:
            kind = params[name].kind
            assert (kind is inspect.Parameter.POSITIONAL_OR_KEYWORD) == option.positional, name
    assert {"fsdp", "deepspeed"} <= set(params)  # the strategies' rows (strategies/registry.py)


def test_vocabularies_are_the_tables():
    """What takes each vocabulary accepts exactly it. (launch/handoff/environment.py, launch/planning/start_method.py
    and config/schema.py import contract's tuples: comparing those names would compare an object
    with itself, so their users are asked instead.)"""
    import multiprocessing

    from notebook_accel.config import schema
    from notebook_accel.machine.devices import best_precision
    from notebook_accel.runtime.precision import resolve_mixed_precision

    # a launch also takes "auto", resolved in the kernel: the workers take the rest, and only those
    workers = [c for c in OPTIONS["mixed_precision"].choices if c != "auto"]
    assert [resolve_mixed_precision(c) for c in workers] == workers
    for refused in ("auto", "fp8"):
        with pytest.raises(ValueError, match=f"mixed_precision='{refused}' is not valid"):
            resolve_mixed_precision(refused)
    machines = (Hardware(cpu_count=2), Hardware(cpu_count=2, cpu_bf16=True),
                Hardware(cpu_count=2, gpu_names=("H100",), gpu_capabilities=((9, 0),)),
                Hardware(cpu_count=2, gpu_names=("Tesla T4",), gpu_capabilities=((7, 5),)))
    assert {best_precision(d, hw) for d in OPTIONS["device"].choices for hw in machines} == set(workers)
    # every start method but "auto" is one multiprocessing has here (Linux)
    assert set(OPTIONS["start_method"].choices) - {"auto"} == set(multiprocessing.get_all_start_methods())
    assert schema.LaunchConfig(mixed_precision="fp8").mixed_precision == "fp8"  # a file may hold fp8
    for device in OPTIONS["device"].choices:  # the file can say every device, in the peer's keys
        assert schema.LaunchConfig(num_processes=2).with_device(device).device_type == device
    assert ENV_OPTIONS == {"num_processes": "NOTEBOOK_ACCEL_NUM_PROCESSES",
                           "mixed_precision": "NOTEBOOK_ACCEL_MIXED_PRECISION",
                           "start_method": "NOTEBOOK_ACCEL_START_METHOD",
                           "cluster": "NOTEBOOK_ACCEL_CLUSTER",
                           "dynamo_backend": "ACCELERATE_DYNAMO_BACKEND",  # the peer's variable
                           "snapshot_every": "NOTEBOOK_ACCEL_SNAPSHOT_EVERY",
                           "snapshot_dir": "NOTEBOOK_ACCEL_SNAPSHOT_DIR",
                           "snapshot_in_peers": "NOTEBOOK_ACCEL_SNAPSHOT_IN_PEERS",
                           "check_collectives": "NOTEBOOK_ACCEL_CHECK_COLLECTIVES",
                           "heal": "NOTEBOOK_ACCEL_HEAL",
                           "idle_timeout": "NOTEBOOK_ACCEL_IDLE_TIMEOUT"}
    keys = {o.file_key for o in OPTIONS.values() if o.file_key}
    assert keys <= set(LaunchConfig.__dataclass_fields__)


def test_magic_flags_match_the_table():
    from magics.accelerate_magic import AccelerateMagics
    from notebook_accel.launch.planning.request import launch_options

    parser = AccelerateMagics.accelerate.parser
    rows = [o for o in launch_options().values() if o.magic_flag]
    table = {o.magic_flag for o in rows} | {"--no-" + o.magic_flag[2:] for o in rows if o.switch}
    others = {"-h", "--help", "-n", "--main-only", "--fresh", "--ranks", "--push", "--pull",
              "--no-pull", "--last", "--background"}  # the magic's own flags, no launch option's
    assert _flags(parser) - others == table
    for option in rows:
        if option.choices:
            [action] = [a for a in parser._actions if option.magic_flag in a.option_strings]  # noqa: SLF001
            assert tuple(action.choices) == option.choices


def test_cli_flags_match_the_table():
    launch, test, config = _subparser("launch"), _subparser("test"), _subparser("config")
    for option in OPTIONS.values():
        if option.cli_flag:
            assert option.cli_flag in _flags(launch), option.name
            assert (option.cli_flag in _flags(test)) != option.cli_launch_only, option.name
        flag = contract.config_flag(option)
        if flag:
            assert flag in _flags(config), option.name
    for parser in (launch, test):
        for option in OPTIONS.values():
            if option.cli_flag and option.choices and option.cli_flag in _flags(parser):
                [action] = [a for a in parser._actions if option.cli_flag in a.option_strings]  # noqa: SLF001
                assert tuple(action.choices) == option.choices
    [device] = [a for a in config._actions if "--device" in a.option_strings]  # noqa: SLF001
    assert tuple(device.choices) == ("auto", *OPTIONS["device"].choices)


def test_panel_fields_match_the_table(isolated):
    pytest.importorskip("ipywidgets")
    from magics.panel.form import ConfigPanel
    from magics.panel.rules import START_METHOD_TIPS, device_choices, precision_choices
    from magics.panel.state import FormState

    panel = ConfigPanel(hardware=Hardware(cpu_count=2))
    fields = set(FormState.__dataclass_fields__)
    for option in OPTIONS.values():
        if option.panel_field:
            assert hasattr(panel, option.panel_field), option.name
            assert option.name in fields or option.file_key in fields, option.name
        elif option.file_key and option.config_flag:  # the file's other rows: fields made from the row
            assert option.name in panel.table.fields, option.name
    hw = Hardware(cpu_count=2)
    assert tuple(panel.precision_buttons) == contract.FILE_MIXED_PRECISIONS
    enabled = {c.value for c in precision_choices("cuda", Hardware(cpu_count=2, gpu_names=("H100",)))
               if c.enabled}
    assert enabled <= set(OPTIONS["mixed_precision"].choices)  # fp8 shows, never enabled
    assert tuple(START_METHOD_TIPS) == tuple(panel.start_method.options) == OPTIONS["start_method"].choices
    assert tuple(c.value for c in device_choices(hw)) == ("auto", *OPTIONS["device"].choices)


# --- fp8: the CLI refuses what a launch refuses -----------------------------------------------

def test_cli_config_refuses_fp8_naming_the_valid_choices(isolated, capsys):
    assert cli.main(["config", "--mixed-precision", "fp8"]) == 1
    err = capsys.readouterr().err
    assert "--mixed-precision" in err and "'fp8'" in err and VALID_PRECISIONS in err
    assert not isolated.exists()
    assert cli.main(["config", "--mixed-precision", "BF16"]) == 0
    assert "mixed_precision: bf16" in isolated.read_text()


def test_cli_config_writes_the_heal_rule_and_refuses_a_word_it_does_not_know(isolated, capsys):
    from notebook_accel import load_config

    assert cli.main(["config", "--heal", "false"]) == 0
    assert load_config(isolated).heal is False
    assert cli.main(["config", "--heal", "sometimes"]) == 1
    assert "heal='sometimes'" in capsys.readouterr().err and load_config(isolated).heal is False


def test_cli_config_refuses_a_bad_port_naming_the_flag(isolated, capsys):
    assert cli.main(["config", "--main-process-port", "70000"]) == 1
    err = capsys.readouterr().err
    assert "flag --main-process-port" in err and "from 1 to 65535" in err
    assert not isolated.exists()


def test_launch_with_fp8_in_the_file_names_file_line_key_and_choices(tmp_path, isolated):
    path = tmp_path / "peer.yaml"
    path.write_text("num_processes: 2\nmixed_precision: fp8\nuse_cpu: true\n")
    with pytest.raises(ValueError) as info:
        notebook_launcher(_never_runs, config_file=path)
    message = str(info.value)
    assert f"{path}, line 2" in message and "mixed_precision='fp8'" in message
    assert VALID_PRECISIONS in message
    assert notebook_launcher(lambda: 7, mixed_precision="no", num_processes=1,
                             config_file=path) == 7  # the argument wins over the file


def test_the_panel_still_loads_a_peer_file_with_fp8(tmp_path, isolated):
    path = tmp_path / "peer.yaml"
    path.write_text("mixed_precision: fp8\n")
    from notebook_accel import load_config

    assert load_config(path).mixed_precision == "fp8"  # the peer's file stays loadable


# --- every error names its source --------------------------------------------------------------

def test_argument_errors_name_the_argument(isolated):
    with pytest.raises(ValueError, match=rf"mixed_precision='fp8' is not one of {VALID_PRECISIONS}"):
        notebook_launcher(_never_runs, num_processes=1, mixed_precision="fp8")
    with pytest.raises(ValueError, match="device='gpu' is not one of 'cpu', 'cuda', 'xla'"):
        notebook_launcher(_never_runs, num_processes=1, device="gpu")
    with pytest.raises(TypeError, match="num_nodes='2' must be an int >= 1"):
        notebook_launcher(_never_runs, num_processes=1, num_nodes="2")


@pytest.mark.parametrize(("var", "value", "valid"), [
    ("NOTEBOOK_ACCEL_MIXED_PRECISION", "fp8", VALID_PRECISIONS),
    ("NOTEBOOK_ACCEL_START_METHOD", "thread", "'auto', 'fork', 'forkserver', 'spawn'"),
    ("NOTEBOOK_ACCEL_NUM_PROCESSES", "0", "an integer >= 1"),
])
def test_environment_errors_name_the_variable(isolated, monkeypatch, var, value, valid):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as info:
        notebook_launcher(_never_runs)
    assert f"environment variable {var}" in str(info.value) and valid in str(info.value)


def test_file_errors_name_the_file_and_key(tmp_path, isolated):
    path = tmp_path / "c.yaml"
    path.write_text("num_processes: 0\n")
    with pytest.raises(ValueError) as info:
        notebook_launcher(_never_runs, config_file=path)
    assert str(info.value) == f"{path}, line 1: num_processes=0 must be an integer >= 1"
    cfg = LaunchConfig(mixed_precision="fp8")  # built in Python: no file to name
    with pytest.raises(ValueError, match=f"launch config: mixed_precision='fp8'.*{VALID_PRECISIONS}"):
        resolve_launch_options({}, cfg)


def test_magic_flag_errors_name_the_flag():
    from IPython.core.error import UsageError
    from IPython.core.magic_arguments import parse_argstring

    from magics.accelerate_magic import AccelerateMagics
    from magics.cell.arguments import launch_options

    magic = AccelerateMagics.accelerate
    with pytest.raises(UsageError, match="flag --num-processes: num_processes=0 must be an integer >= 1"):
        launch_options(parse_argstring(magic, "-n 0"))
    with pytest.raises(UsageError, match="flag --port: use_port=0 must be an integer from 1 to 65535"):
        launch_options(parse_argstring(magic, "--port 0"))
    with pytest.raises(UsageError, match="flag --timeout"):
        launch_options(parse_argstring(magic, "--timeout -1"))


def test_cli_launch_flag_errors_name_the_flag(tmp_path, isolated, capsys):
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit('a worker ran')\n")
    assert cli.main(["launch", "--num-machines", "0", str(script)]) == 1
    err = capsys.readouterr().err
    assert "flag --num-machines: num_nodes=0 must be an integer >= 1" in err
    assert cli.main(["launch", "--max-restarts", "-1", str(script)]) == 1
    assert "flag --max-restarts" in capsys.readouterr().err


def test_panel_code_uses_the_tables_names():
    import re

    from magics.panel.fsdp import FsdpForm
    from magics.panel.state import FormState, launcher_call, magic_line
    from notebook_accel.launch.planning.request import door_options, launch_options

    state = FormState(device="cpu", num_processes=2, mixed_precision="bf16", start_method="spawn",
                      num_machines=2, machine_rank=1, main_process_ip="10.0.0.1",
                      main_process_port=29500, fsdp=FsdpForm(strategy="FSDP"))
    kwargs = set(re.findall(r"(\w+)=", launcher_call(state).split("notebook_launcher(train, ", 1)[1].split("#")[0]))
    assert kwargs and kwargs <= set(door_options("notebook_launcher"))
    single = FormState(device="cpu", num_processes=2, mixed_precision="bf16",
                       start_method="spawn", main_process_port=29500)
    flags = {w for w in magic_line(single).split() if w.startswith("-")}
    assert flags and flags <= {o.magic_flag for o in launch_options().values() if o.magic_flag} | {"-n"}


def test_magic_typo_suggestions_point_to_the_tables_flags():
    from magics.cell.flag_check import _FAMILIAR

    flags = {o.magic_flag for o in OPTIONS.values() if o.magic_flag}
    assert set(_FAMILIAR.values()) <= flags
