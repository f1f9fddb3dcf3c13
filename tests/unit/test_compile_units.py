"""torch.compile through the Accelerator, in one process: the plugin, the option's flow from
each front end to the workers' variables, compiled structure and unwrapping, and the
``compiling`` phase from the wire to the views (the 2-process runs: tests/runtime/test_compile.py)."""

from __future__ import annotations

import pytest
import torch
import yaml

from notebook_accel import Accelerator, DynamoBackend, TorchDynamoPlugin
from notebook_accel.config import LaunchConfig, load_config
from notebook_accel.launch.planning.options import fill_options
from notebook_accel.launch.planning.plan import make_plan
from notebook_accel.launch.planning.request import LaunchRequest
from notebook_accel.launch.views.record import LaunchRecord, RankStatus
from notebook_accel.launch.views.text import TextView, rank_states
from notebook_accel.runtime.compilation import compile_regions
from notebook_accel.utils import (
    extract_model_from_parallel,
    has_compiled_regions,
    is_compiled_module,
)
from notebook_accel.wire import Phase, decode, encode_data
from tests.runtime_scripts.compile_checks import Net

DYNAMO_VARS = ("ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE", "ACCELERATE_DYNAMO_USE_FULLGRAPH",
               "ACCELERATE_DYNAMO_USE_DYNAMIC", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION")


@pytest.fixture(autouse=True)
def no_dynamo_env(monkeypatch):
    for name in DYNAMO_VARS:
        monkeypatch.delenv(name, raising=False)


# ---- the plugin -----------------------------------------------------------------------------

def test_plugin_reads_the_peers_variables(monkeypatch):
    assert TorchDynamoPlugin().backend is DynamoBackend.NO and not TorchDynamoPlugin().enabled
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "inductor")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "max-autotune")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "false")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "1")
    plugin = TorchDynamoPlugin()
    assert (plugin.backend, plugin.mode, plugin.fullgraph, plugin.dynamic, plugin.use_regional_compilation) == (
        DynamoBackend.INDUCTOR, "max-autotune", True, False, True)
    # what differs from the defaults without variables, as the peer (its tests/test_kwargs_handlers.py)
    assert plugin.to_kwargs() == {"backend": "inductor", "mode": "max-autotune", "fullgraph": True,
                                  "dynamic": False}
    monkeypatch.delenv("ACCELERATE_DYNAMO_MODE")
    assert TorchDynamoPlugin(backend="EAGER", options={"x": 1}).to_kwargs() == {
        "backend": "eager", "fullgraph": True, "dynamic": False, "options": {"x": 1}}
    assert Accelerator().state.dynamo_plugin.backend is DynamoBackend.INDUCTOR


def test_bad_values_name_the_value_its_place_and_the_valid_ones(monkeypatch):
    with pytest.raises(ValueError, match=r"Accelerator\(dynamo_backend=\.\.\.\): dynamo backend 'turbo' is not one of 'no'"):
        Accelerator(dynamo_backend="turbo")
    with pytest.raises(ValueError, match="give one of them"):
        Accelerator(dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin())
    with pytest.raises(ValueError, match="mode=...\\): dynamo mode 'fast' is not one of 'default'"):
        TorchDynamoPlugin(mode="fast")
    with pytest.raises(ValueError, match="must be True, False or None"):
        TorchDynamoPlugin(fullgraph="yes")
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTR")
    with pytest.raises(ValueError, match="environment variable ACCELERATE_DYNAMO_BACKEND: .*'INDUCTR'"):
        TorchDynamoPlugin()
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "eager")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "maybe")
    with pytest.raises(ValueError, match="environment variable ACCELERATE_DYNAMO_USE_FULLGRAPH"):
        TorchDynamoPlugin()


def test_a_backend_this_torch_lacks_is_refused_at_prepare():
    accelerator = Accelerator(dynamo_backend="tensorrt")
    with pytest.raises(ValueError, match="dynamo backend 'tensorrt' is not available .*inductor"):
        accelerator.prepare(Net())


# ---- compiled structure and unwrapping --------------------------------------------------------

def test_prepare_compiles_and_unwrap_keeps_or_drops_the_compiled_wrapper():
    accelerator = Accelerator(dynamo_backend="eager")
    model = Net()
    prepared = accelerator.prepare(model)
    assert is_compiled_module(prepared) and prepared._orig_mod is model
    assert accelerator.unwrap_model(prepared) is prepared  # keep_torch_compile=True: the peer's default
    assert accelerator.unwrap_model(prepared, keep_torch_compile=False) is model
    assert set(accelerator.get_state_dict(prepared)) == set(model.state_dict())
    assert accelerator.prepare(Net()) is not prepared


def test_regional_compilation_compiles_the_repeated_blocks_and_shares_the_weights():
    model = Net(depth=3)
    regional = compile_regions(model, backend="eager")
    assert [type(b).__name__ for b in regional.blocks] == ["OptimizedModule"] * 3
    assert is_compiled_module(regional.head) and not is_compiled_module(regional)
    assert has_compiled_regions(regional) and not has_compiled_regions(model)
    assert regional.blocks[0]._orig_mod.lin.weight is model.blocks[0].lin.weight
    assert any("_orig_mod" in key for key in regional.state_dict())
    assert extract_model_from_parallel(regional, keep_torch_compile=False) is model
    assert extract_model_from_parallel(regional) is regional
    x = torch.randn(2, 16)
    assert torch.equal(regional(x), model(x))


def test_regions_inside_data_parallel_unwrap_as_the_peers_tests_expect():
    model = Net()  # the peer's tests/test_compile.py, on this model instead of gpt2
    regional = compile_regions(model, backend="eager")
    assert regional._orig_mod is model and regional.head._orig_mod is model.head
    wrapped = compile_regions(torch.nn.DataParallel(model), backend="eager")
    assert extract_model_from_parallel(wrapped, keep_torch_compile=True)._orig_mod is model
    assert extract_model_from_parallel(wrapped, keep_torch_compile=False) is model


def test_compiled_around_ddp_unwraps_without_changing_the_prepared_model():
    class FakeDdp(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, module):  # no process group: only the wrapping matters here
            torch.nn.Module.__init__(self)
            self.module = module

    model = Net()
    compiled = torch.compile(FakeDdp(model), backend="eager")
    kept = extract_model_from_parallel(compiled)
    assert is_compiled_module(kept) and kept._orig_mod is model
    assert isinstance(compiled._orig_mod, FakeDdp)  # left as it was: it still trains through DDP
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model


# ---- the option, from each front end to the workers -------------------------------------------

PEER_DYNAMO = {"distributed_type": "MULTI_CPU", "dynamo_config": {
    "dynamo_backend": "INDUCTOR", "dynamo_mode": "reduce-overhead", "dynamo_use_fullgraph": True,
    "dynamo_use_dynamic": False, "dynamo_use_regional_compilation": True}}


def test_the_peers_dynamo_config_loads_and_saves_in_its_format(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(PEER_DYNAMO))
    config = load_config(path)
    assert config.dynamo_backend == "inductor"
    assert config.to_dict()["dynamo_config"] == {**PEER_DYNAMO["dynamo_config"], "dynamo_backend": "INDUCTOR"}
    assert "dynamo_backend" not in config.to_dict()


@pytest.mark.parametrize(("section", "message"), [
    ({"dynamo_backend": "fast"}, "dynamo_backend='fast' is not one of 'no', 'eager'"),
    ({"dynamo_mode": "fastest"}, "dynamo_mode='fastest' is not one of 'default'"),
    ({"dynamo_use_fullgraph": "sometimes"}, "dynamo_use_fullgraph='sometimes' must be true or false"),
    ({"dynamo_speed": 1}, "unknown key 'dynamo_speed'; valid keys: dynamo_backend"),
])
def test_a_bad_dynamo_config_names_the_file_the_key_and_the_valid_values(tmp_path, section, message):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"dynamo_config": section}))
    with pytest.raises(ValueError, match=str(path)) as error:
        load_config(path)
    assert message in str(error.value)


def test_the_file_and_the_argument_become_the_workers_variables(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(PEER_DYNAMO))
    filled = fill_options({"dynamo_backend": None}, path)
    assert filled["dynamo_backend"] == "inductor"
    assert filled["worker_env"] == {"ACCELERATE_DYNAMO_MODE": "reduce-overhead",
                                    "ACCELERATE_DYNAMO_USE_FULLGRAPH": "true",
                                    "ACCELERATE_DYNAMO_USE_DYNAMIC": "false",
                                    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "true"}
    assert fill_options({"dynamo_backend": "eager"}, path)["dynamo_backend"] == "eager"  # argument > file
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "aot_eager")
    assert fill_options({"dynamo_backend": None}, path)["dynamo_backend"] == "aot_eager"  # environment > file
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "warp")
    with pytest.raises(ValueError, match="environment variable ACCELERATE_DYNAMO_BACKEND: dynamo_backend='warp'"):
        fill_options({"dynamo_backend": None}, path)
    monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND")
    plan = make_plan(num_processes=2, mixed_precision=None, use_port=None, master_addr="127.0.0.1",
                     node_rank=0, num_nodes=1, start_method="auto", timeout=None, output="all",
                     return_all=False, max_restarts=0, device="cpu", dynamo_backend="inductor",
                     worker_env=filled["worker_env"])
    assert plan.worker_env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert plan.worker_env["ACCELERATE_DYNAMO_MODE"] == "reduce-overhead"
    with pytest.raises(ValueError, match="dynamo_backend='jit' is not one of 'no'"):  # its door
        LaunchRequest.from_keywords("notebook_launcher", {"dynamo_backend": "jit"})


def test_the_magic_the_cli_and_the_pool_take_the_option():
    from magics.accelerate_magic import AccelerateMagics
    from magics.cell.arguments import launch_options
    from notebook_accel.cli.command import _build_parser
    from notebook_accel.launch.planning.request import door_options

    args = AccelerateMagics.accelerate.parser.parse_args(["--dynamo-backend", "inductor"])
    assert launch_options(args)["dynamo_backend"] == "inductor"
    parsed = _build_parser().parse_args(["launch", "--dynamo-backend", "aot_eager", "train.py"])
    assert parsed.dynamo_backend == "aot_eager"
    assert "dynamo_backend" in door_options("WorkerPool")  # %accelerate start --dynamo-backend: a warm pool takes it


def test_the_panel_saves_the_backend_in_dynamo_config(tmp_path):
    pytest.importorskip("ipywidgets")
    from magics.panel.state import config_from_state, launcher_call, magic_line, state_from_config
    from notebook_accel.machine.hardware import Hardware

    state = state_from_config(LaunchConfig(), Hardware(cpu_count=2))
    assert state.dynamo_backend == "no"
    assert "dynamo_config" not in config_from_state(state, LaunchConfig()).to_dict()
    state.dynamo_backend = "inductor"
    assert config_from_state(state, LaunchConfig()).to_dict()["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}
    assert "dynamo_backend='inductor'" in launcher_call(state)
    assert "--dynamo-backend inductor" in magic_line(state)


# ---- the compiling phase, from the wire to the views -------------------------------------------

def _record() -> LaunchRecord:
    record = LaunchRecord(world_size=2, num_processes=2, device_type="cpu", start_method="fork",
                          mixed_precision="no")
    record.ranks = {0: RankStatus(0, state="running"), 1: RankStatus(1, state="running")}
    return record


def test_a_phase_event_shows_as_compiling_with_its_duration():
    from magics.view.status import status_parts

    record = _record()
    message = decode(encode_data("phase", {"name": "compiling"}))
    assert isinstance(message, Phase) and message.name == "compiling"
    message.timestamp -= 12.0  # it began 12 s ago
    record.apply(0, message)
    assert record.ranks[0].state == "compiling"
    assert rank_states(record) == "1 compiling (rank 0 for 12.0 s), 1 running"
    text, html = status_parts(record)
    assert "rank 0: compiling (12.0 s)" in text and "compiling (12.0 s)" in html
    record.apply(0, Phase(None))
    assert record.ranks[0].state == "running" and rank_states(record) == "2 running"
    record.ranks[1].state = "finished"
    record.apply(1, Phase("compiling"))  # late: an ended rank keeps its state
    assert record.ranks[1].state == "finished"


def test_the_text_view_prints_a_lasting_compile_not_a_blip():
    import io
    import time

    record, stream = _record(), io.StringIO()
    record.started -= 5
    view = TextView(record, stream=stream, every=1e9)
    view.update(record)
    record.apply(0, Phase("compiling", timestamp=time.time() - 0.2))  # a small recompile
    view.update(record)
    assert stream.getvalue().count("\n") == 1
    record.apply(0, Phase(None))
    record.apply(0, Phase("compiling", timestamp=time.time() - 3.0))
    view.update(record)
    assert "1 compiling (rank 0 for 3.0 s), 1 running" in stream.getvalue().splitlines()[-1]
