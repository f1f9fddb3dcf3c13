"""The config panel, driven through the widgets' own Python API, and its rules as functions."""

from __future__ import annotations

import sys

import pytest
import yaml

from magics.panel.form import config_panel
from magics.panel.rules import gpu_supports_bf16, precision_choices
from magics.panel.state import FormState, launcher_call, magic_line, validate
from notebook_accel.machine.hardware import Hardware

CPU2 = Hardware(cpu_count=2)
T4X2 = Hardware(cpu_count=8, gpu_names=("Tesla T4", "Tesla T4"))
H100X4 = Hardware(cpu_count=32, gpu_names=("NVIDIA H100 80GB HBM3",) * 4)


@pytest.fixture
def cfg_path(tmp_path):
    """The test's default config location (tests/conftest.py isolates it; no peer file)."""
    return tmp_path / "cache" / "notebook_accel" / "default_config.yaml"


def errors(panel) -> bool:
    return "<b>Error:</b>" in panel.messages.value


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", True), ("NVIDIA A100-SXM4-40GB", True), ("NVIDIA A10G", True),
    ("NVIDIA L4", True), ("NVIDIA GeForce RTX 4090", True), ("NVIDIA RTX A6000", True),
    ("NVIDIA RTX 6000 Ada Generation", True), ("NVIDIA H200", True), ("NVIDIA B200", True),
    ("Tesla T4", False), ("Tesla V100-SXM2-16GB", False), ("Quadro RTX 8000", False),
    ("NVIDIA GeForce RTX 2080 Ti", False), ("NVIDIA TITAN RTX", False), ("Tesla K80", False),
    ("NVIDIA GPU", None),
])
def test_bf16_judged_from_the_gpu_name(name, expected):
    assert gpu_supports_bf16(name) is expected


def test_precision_choices_follow_the_hardware():
    def enabled(device, hw):
        return {c.value for c in precision_choices(device, hw) if c.enabled}

    assert enabled("auto", CPU2) == {"no", "bf16", "auto"}
    assert enabled("auto", T4X2) == {"no", "fp16", "auto"}
    assert enabled("cpu", T4X2) == {"no", "bf16", "auto"}
    assert enabled("auto", H100X4) == {"no", "fp16", "bf16", "auto"}
    tips = {c.value: c.tooltip for c in precision_choices("auto", T4X2)}
    assert "Tesla T4" in tips["bf16"] and "8.0" in tips["bf16"]
    assert tips["auto"].startswith("the best this hardware supports, decided at launch: fp16 here")
    assert "needs a GPU" in {c.value: c.tooltip for c in precision_choices("cpu", CPU2)}["fp16"]


def test_validate_rules():
    assert validate(FormState(num_processes=2), CPU2) == []
    [note] = validate(FormState(num_processes=4), CPU2)
    assert note.level == "note" and "4 processes on 2 CPU cores" in note.text
    assert note.field == "num_processes"  # shown beside Processes
    [err] = validate(FormState(device="cuda", num_processes=3), T4X2)
    assert err.level == "error" and "only 2 GPUs detected" in err.text
    [err] = validate(FormState(device="cuda"), CPU2)
    assert "no NVIDIA GPU" in err.text
    [err] = validate(FormState(mixed_precision="fp16"), CPU2)
    assert err.level == "error" and err.text == "mixed precision fp16: needs a GPU; on CPU use bf16"
    multi = validate(FormState(num_machines=2, machine_rank=2), CPU2)
    assert [m.level for m in multi] == ["error", "error", "needed"]  # an empty IP: still to give
    assert "machine rank must be 0..1" in multi[0].text
    ok = FormState(num_machines=2, machine_rank=1, main_process_ip="10.0.0.1",
                   main_process_port=29500)
    assert validate(ok, CPU2) == []


def test_code_equivalents():
    state = FormState(num_processes=2, mixed_precision="bf16", start_method="fork")
    assert ("notebook_launcher(train, num_processes=2, mixed_precision='bf16', "
            "start_method='fork')") in launcher_call(state)
    assert magic_line(state) == "%%accelerate -n 2 --mixed-precision bf16 --start-method fork"
    multi = FormState(num_machines=2, main_process_ip="10.0.0.1", main_process_port=29500)
    assert "use_port=29500, master_addr='10.0.0.1', node_rank=0, num_nodes=2" in launcher_call(multi)
    assert magic_line(multi).startswith("%%accelerate -n 1\n# multi-machine")  # the file says them


def test_panel_shows_hardware_and_defaults_without_a_file(cfg_path):
    panel = config_panel(hardware=CPU2)
    text = " ".join(getattr(w, "value", "") for w in panel.children[:2])
    assert "2 CPU cores" in text and f"Save writes {cfg_path}" in text
    assert panel.device.value == "auto" and panel.num_processes.value == 2
    assert panel.precision_buttons["fp16"].disabled and not panel.precision_buttons["bf16"].disabled
    assert panel.precision_buttons["fp8"].disabled
    assert panel.multi_node.layout.display == "none"
    assert not errors(panel) and not panel.save_button.disabled


def test_panel_loads_the_current_file(cfg_path):
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
                        "num_processes: 3\nmixed_precision: bf16\nstart_method: spawn\n"
                        "use_cpu: true\ndowncast_bf16: 'no'\nmy_own_key: 1\n")
    panel = config_panel(hardware=CPU2)
    assert panel.device.value == "cpu" and panel.num_processes.value == 3
    assert panel.mixed_precision == "bf16" and panel.start_method.value == "spawn"
    assert f"{cfg_path} (loaded)" in panel.children[1].value
    assert "my_own_key" in panel.children[1].value  # the unused key is reported
    assert "3 processes on 2 CPU cores" in panel.field_notes["num_processes"].value  # beside it


def test_panel_save_writes_the_yaml_and_shows_the_path(cfg_path):
    panel = config_panel(hardware=CPU2)
    panel.device.value = "cpu"
    panel.num_processes.value = 2
    panel.precision_buttons["bf16"].value = True
    assert not panel.precision_buttons["no"].value  # one choice at a time
    panel.start_method.value = "forkserver"
    panel.save_button.click()
    assert f"Saved to <code>{cfg_path}</code>" in panel.saved.value
    data = yaml.safe_load(cfg_path.read_text())
    assert data["num_processes"] == 2 and data["mixed_precision"] == "bf16"
    assert data["start_method"] == "forkserver" and data["use_cpu"] is True
    assert data["distributed_type"] == "MULTI_GPU"  # with use_cpu: the peer starts both (its MULTI_CPU: one)
    assert config_panel(hardware=CPU2).mixed_precision == "bf16"  # round trip


def test_panel_keeps_keys_it_does_not_show(cfg_path):
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("num_processes: 2\ngpu_ids: '0,1'\nmy_own_key: 1\n")
    panel = config_panel(hardware=T4X2)
    panel.precision_buttons["fp16"].value = True
    panel.save_button.click()
    data = yaml.safe_load(cfg_path.read_text())
    assert data["my_own_key"] == 1 and data["gpu_ids"] == "0,1" and data["mixed_precision"] == "fp16"


def test_panel_errors_block_save(cfg_path):
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("mixed_precision: fp16\n")
    panel = config_panel(hardware=CPU2)  # fp16 from the file, but no GPU here
    assert panel.mixed_precision == "fp16" and errors(panel) and panel.save_button.disabled
    assert "mixed precision fp16: needs a GPU" in panel.messages.value
    assert panel.save() is None and "Not saved" in panel.saved.value
    assert cfg_path.read_text() == "mixed_precision: fp16\n"
    panel.precision_buttons["bf16"].value = True
    assert not errors(panel) and not panel.save_button.disabled


def test_panel_process_count_is_bounded_by_the_gpus(cfg_path):
    panel = config_panel(hardware=T4X2)
    assert panel.num_processes.value == 2
    panel.num_processes.value = 5
    assert panel.num_processes.value == 2  # clamped to the detected GPUs, and it says so
    assert "Processes 5 changed to 2: at most 2 on cuda" in panel.clamp_note.value
    panel.device.value = "cpu"
    panel.num_processes.value = 40
    assert panel.num_processes.value == 32
    panel.num_processes.value = 12
    assert "12 processes on 8 CPU cores" in panel.clamp_note.value and not errors(panel)
    assert not panel.precision_buttons["bf16"].disabled and panel.precision_buttons["fp16"].disabled


def test_panel_multi_node_fields_and_validation(cfg_path):
    panel = config_panel(hardware=CPU2)
    panel.num_machines.value = 2
    assert panel.multi_node.layout.display == ""
    # nothing typed wrong yet: no red error, the port offered, the IP asked for (Save waits)
    assert not errors(panel) and panel.save_button.disabled
    assert panel.main_process_port.value == 29500
    assert "<b>To do:</b> main process IP" in panel.messages.value
    panel.main_process_ip.value = "10.1.2.3"
    panel.main_process_port.value = 29500
    panel.machine_rank.value = 1
    assert not errors(panel)
    panel.save_button.click()
    data = yaml.safe_load(cfg_path.read_text())
    assert (data["num_machines"], data["machine_rank"], data["main_process_ip"],
            data["main_process_port"]) == (2, 1, "10.1.2.3", 29500)
    panel.num_machines.value = 1
    assert panel.multi_node.layout.display == "none"


def test_panel_copy_as_code_follows_the_form(cfg_path):
    panel = config_panel(hardware=CPU2)
    assert panel.code.layout.display == "none"
    panel.code_button.click()
    assert panel.code.layout.display == ""
    assert "notebook_launcher(train, num_processes=2)" in panel.code.value
    assert "%%accelerate -n 2" in panel.code.value
    panel.precision_buttons["bf16"].value = True
    assert "mixed_precision=&#x27;bf16&#x27;" in panel.code.value
    assert "%%accelerate -n 2 --mixed-precision bf16" in panel.code.value


def test_panel_shows_a_malformed_file_instead_of_failing(cfg_path):
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("num_processes: [1\n")
    panel = config_panel(hardware=CPU2)
    assert "Could not read the config file" in panel.children[1].value
    assert "malformed YAML" in panel.children[1].value


def test_panel_test_button_streams_the_sanity_check(cfg_path, monkeypatch):
    import notebook_accel.cli.sanity as sanity

    calls = []

    def fake(**options):
        calls.append(options)
        print("[rank 0] step 1\n[rank 1] step 1")
        print("  PASS  fake check", end="")
        return True

    monkeypatch.setattr(sanity, "run_sanity_check", fake)
    panel = config_panel(hardware=CPU2)
    panel.precision_buttons["bf16"].value = True
    panel.test_button.click()
    assert calls == [{"num_processes": 2, "mixed_precision": "bf16", "start_method": "auto",
                      "device": "cpu", "num_nodes": 1, "node_rank": 0,
                      "master_addr": "127.0.0.1"}]
    texts = [o["text"] for o in panel.test_output.outputs]
    assert all(t.endswith("\n") for t in texts[:-1])  # whole lines, as they come
    assert "".join(texts) == "[rank 0] step 1\n[rank 1] step 1\n  PASS  fake check"
    assert "Test passed" in panel.status.value and not panel.test_button.disabled

    monkeypatch.setattr(sanity, "run_sanity_check", lambda **o: 1 / 0)
    panel.test_button.click()
    assert "Test failed" in panel.status.value
    assert panel.test_output.outputs[-1]["text"] == "ZeroDivisionError: division by zero\n"


def test_panel_test_button_without_the_sanity_module(cfg_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "notebook_accel.cli.sanity", None)
    panel = config_panel(hardware=CPU2)
    assert panel.test() is None and "notebook_accel.cli.sanity is missing" in panel.status.value


def test_panel_loads_the_peers_file_and_saves_ours(cfg_path, tmp_path):
    peer = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    peer.parent.mkdir(parents=True)
    peer.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
                    "num_processes: 2\nmixed_precision: bf16\nuse_cpu: true\n")
    panel = config_panel(hardware=CPU2)
    assert f"{peer} (loaded)" in panel.children[1].value
    assert panel.device.value == "cpu" and panel.mixed_precision == "bf16"
    assert panel.save() == cfg_path and yaml.safe_load(cfg_path.read_text())["use_cpu"] is True
    assert "num_processes: 2\n" in peer.read_text() and "start_method" not in peer.read_text()


def test_panel_says_which_environment_variables_override_the_file(cfg_path, monkeypatch):
    monkeypatch.setenv("NOTEBOOK_ACCEL_NUM_PROCESSES", "4")
    panel = config_panel(hardware=CPU2)
    assert "NOTEBOOK_ACCEL_NUM_PROCESSES=4 is set: it overrides the file&#x27;s num_processes" in (
        panel.children[1].value)


def test_panel_shows_a_device_the_machine_lacks_as_an_error(cfg_path):
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    panel = config_panel(hardware=CPU2)
    assert panel.device.value == "cuda" and ("cuda (not detected)", "cuda") in panel.device.options
    assert "no NVIDIA GPU" in panel.messages.value and panel.save_button.disabled
    panel.device.value = "auto"
    assert not errors(panel)


def test_panel_says_when_the_file_asks_for_more_gpus_than_detected(cfg_path):
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("distributed_type: MULTI_GPU\nnum_processes: 4\n")
    panel = config_panel(hardware=T4X2)
    assert panel.num_processes.value == 2
    assert "The file asks for 4 processes; at most 2 here" in panel.children[1].value


def test_panel_on_this_machine_never_initialises_cuda(cfg_path):
    import torch

    from notebook_accel.machine.hardware import detect

    panel = config_panel()  # the real detection
    assert panel.hardware == detect() and detect().summary() in panel.children[0].value
    assert not torch.cuda.is_initialized()


def test_panel_says_what_it_changed_and_what_was_saved(cfg_path):
    panel = config_panel(hardware=CPU2)
    panel.device.value = "cpu"
    panel.num_processes.value = 999
    assert panel.num_processes.value == 8  # 4 per core, at least 8 (panel_rules)
    assert "Processes 999 changed to 8: at most 8 on cpu here (2 CPU cores)" in \
        panel.clamp_note.value
    panel.num_processes.value = 0  # refused, in words: never changed without a word
    assert panel.num_processes.value == 0 and panel.save_button.disabled and errors(panel)
    assert "number of processes must be at least 1, not 0" in panel.messages.value
    panel.num_processes.value = 2
    assert panel.clamp_note.value == ""  # a fresh choice clears the note
    assert "none yet" in panel.notes.value
    panel.precision_buttons["bf16"].value = True
    assert panel.precision_buttons["bf16"].button_style == "primary"
    assert panel.precision_buttons["no"].button_style == ""
    panel.save_button.click()
    assert f"Config file: {cfg_path} (saved" in panel.notes.value  # the header follows
    panel.status.value = "Test passed"  # what the Test button writes
    assert f"Saved to <code>{cfg_path}</code>" in panel.saved.value  # and does not replace
    assert panel.code_button.description == "Show as code"
    assert "ⓘ" not in panel.messages.value and "✗" not in panel.messages.value


DEEPSPEED_YAML = ("distributed_type: DEEPSPEED\nnum_processes: 2\nuse_cpu: true\ndeepspeed_config:\n"
                  "  zero_stage: 3\n  offload_optimizer_device: cpu\n  offload_param_device: cpu\n"
                  "  gradient_clipping: 0.5\n  zero3_save_16bit_model: true\n  zero3_init_flag: true\n")


def _deepspeed_values(panel) -> tuple:
    ds = panel.deepspeed
    return (panel.strategy.strategy.value, ds.zero_stage.value, ds.offload_optimizer.value,
            ds.offload_param.value, ds.clipping.value, ds.save16.value)


def test_panel_round_trips_a_deepspeed_file(cfg_path):
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text(DEEPSPEED_YAML)
    panel = config_panel(hardware=CPU2)
    assert _deepspeed_values(panel) == ("DEEPSPEED", 3, "cpu", "cpu", "0.5", True)
    assert panel.deepspeed.box.layout.display == "" and panel.strategy.options.layout.display == "none"
    assert not panel.deepspeed.offload_param.disabled and not panel.deepspeed.save16.disabled
    assert "not used by notebook_accel" not in panel.notes.value
    assert not errors(panel) and not panel.save_button.disabled
    panel.deepspeed.clipping.value = "1.5"
    panel.code_button.click()
    assert "DeepSpeed ZeRO-3 from the saved file" in panel.code.value
    assert "# DeepSpeed settings are read from the saved file" in panel.code.value
    assert panel.save() == cfg_path
    data = yaml.safe_load(cfg_path.read_text())
    assert (data["distributed_type"], data["use_cpu"], data["num_processes"]) == ("DEEPSPEED", True, 2)
    assert data["deepspeed_config"] == {
        "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu",
        "gradient_clipping": 1.5, "zero3_save_16bit_model": True,
        "zero3_init_flag": True}  # a key the panel does not show: kept
    assert "fsdp_config" not in data
    assert _deepspeed_values(config_panel(hardware=CPU2)) == ("DEEPSPEED", 3, "cpu", "cpu", "1.5", True)

    from notebook_accel.config import load_config
    from notebook_accel.launch.planning.options import worker_strategy_environment

    env = worker_strategy_environment(load_config(cfg_path))  # what the launcher makes of it
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3" and env["ACCELERATE_GRADIENT_CLIPPING"] == "1.5"


def test_panel_flags_a_bad_deepspeed_combination_and_does_not_save(cfg_path):
    cfg_path.parent.mkdir(parents=True)
    text = DEEPSPEED_YAML.replace("zero_stage: 3", "zero_stage: 2")
    cfg_path.write_text(text)
    panel = config_panel(hardware=CPU2)
    assert _deepspeed_values(panel)[:4] == ("DEEPSPEED", 2, "cpu", "cpu")  # the file's values, as they are
    assert errors(panel) and panel.save_button.disabled
    assert "offload_param_device &#x27;cpu&#x27; needs zero_stage 3, not 2" in panel.messages.value
    assert not panel.deepspeed.offload_param.disabled  # enabled, so the bad value can be undone
    assert panel.save() is None and "Not saved" in panel.saved.value
    assert cfg_path.read_text() == text
    panel.deepspeed.offload_param.value = "none"
    assert not errors(panel) and panel.deepspeed.offload_param.disabled  # stage 3 only
    panel.deepspeed.clipping.value = "big"
    assert "gradient clipping &#x27;big&#x27; is not a number" in panel.messages.value
    panel.deepspeed.clipping.value = ""
    panel.deepspeed.offload_optimizer.value = "nvme"
    assert panel.deepspeed.optimizer_nvme_path.layout.display == ""
    assert "offload_optimizer_device &#x27;nvme&#x27; needs offload_optimizer_nvme_path" in panel.messages.value
    panel.deepspeed.optimizer_nvme_path.value = "/local_nvme"
    assert not errors(panel)
    panel.deepspeed.zero_stage.value = 0
    assert "needs zero_stage 1-3" in panel.messages.value and panel.save_button.disabled
    panel.deepspeed.zero_stage.value = 1
    data = yaml.safe_load(panel.save().read_text())["deepspeed_config"]
    assert (data["zero_stage"], data["offload_optimizer_device"], data["offload_optimizer_nvme_path"]) == (
        1, "nvme", "/local_nvme")
    assert "gradient_clipping" not in data  # cleared in the form


def test_panel_switching_strategies_drops_the_other_section(cfg_path):
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("distributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\nfsdp_config:\n"
                        "  fsdp_version: 2\n  fsdp_transformer_layer_cls_to_wrap: Block\n")
    panel = config_panel(hardware=CPU2)
    assert panel.strategy.strategy.value == "FSDP" and panel.deepspeed.box.layout.display == "none"
    assert panel.strategy.strategy.options[2] == ("DeepSpeed", "DEEPSPEED")
    panel.strategy.strategy.value = "DEEPSPEED"
    assert panel.deepspeed.box.layout.display == "" and panel.strategy.options.layout.display == "none"
    assert panel.deepspeed.zero_stage.value == 2 and panel.deepspeed.offload_param.disabled  # the defaults
    data = yaml.safe_load(panel.save().read_text())
    assert data["distributed_type"] == "DEEPSPEED" and "fsdp_config" not in data
    assert data["deepspeed_config"] == {"zero_stage": 2, "offload_optimizer_device": "none",
                                        "offload_param_device": "none", "zero3_save_16bit_model": False}
    panel.strategy.strategy.value = "FSDP"
    data = yaml.safe_load(panel.save().read_text())
    assert data["distributed_type"] == "FSDP" and "deepspeed_config" not in data
    assert data["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "Block"
    panel.strategy.strategy.value = "DDP"
    data = yaml.safe_load(panel.save().read_text())
    assert data["distributed_type"] == "MULTI_GPU"  # DDP on 2 CPU processes (use_cpu: true)
    assert "fsdp_config" not in data and "deepspeed_config" not in data


def test_panel_shows_a_deepspeed_json_read_only(cfg_path, tmp_path):
    ds_json = tmp_path / "ds.json"
    ds_json.write_text('{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, '
                       '"gradient_clipping": 2.0}')
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text(f"distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                        f"  deepspeed_config_file: {ds_json}\n  zero3_init_flag: true\n")
    panel = config_panel(hardware=CPU2)
    assert _deepspeed_values(panel)[:5] == ("DEEPSPEED", 3, "none", "cpu", "2.0")  # the JSON's
    assert all(w.disabled for w in panel.deepspeed.fields)
    assert f"deepspeed_config_file {ds_json}" in panel.messages.value and not errors(panel)
    data = yaml.safe_load(panel.save().read_text())
    assert data["deepspeed_config"] == {"deepspeed_config_file": str(ds_json), "zero3_init_flag": True}
    ds_json.unlink()
    panel.num_processes.value = 1
    assert "no such file" in panel.messages.value and panel.save_button.disabled


def test_deepspeed_rules_as_functions():
    from magics.panel.deepspeed import DeepSpeedForm
    from magics.panel.fsdp import FsdpForm

    state = FormState(num_processes=1, fsdp=FsdpForm(strategy="DEEPSPEED"), deepspeed=DeepSpeedForm())
    assert [m.text for m in validate(state, CPU2)][0].startswith("DeepSpeed with 1 process")
    [err] = validate(FormState(device="xla", fsdp=FsdpForm(strategy="DEEPSPEED")), Hardware(cpu_count=2, tpu=True))[:1]
    assert err.level == "error" and "DeepSpeed does not run on TPU" in err.text
    assert validate(FormState(num_processes=2, deepspeed=DeepSpeedForm(zero_stage=0,
                                                                      offload_param_device="cpu")), CPU2) == []
    assert magic_line(FormState(num_processes=2, fsdp=FsdpForm(strategy="DEEPSPEED"))) == (
        "%%accelerate -n 2 --deepspeed\n# DeepSpeed settings are read from the saved file")


# --- issue 36: what is offered, how it is drawn ---------------------------------------------

@pytest.fixture
def packages(monkeypatch):
    """The compile backends' packages installed here (none, unless a test adds some) and the
    backends torch registers; asking torch fails the test unless a test allows it."""
    from magics.panel import rules

    present: set[str] = set()
    registered: set[str] = set()
    asked: list[bool] = []
    monkeypatch.setattr(rules, "_package_present", lambda name: name in present)

    def registered_backends():
        asked.append(True)
        return frozenset(registered)

    monkeypatch.setattr(rules, "_registered_backends", registered_backends)
    return present, registered, asked


def _offered(panel) -> list[str]:
    return [value for _, value in panel.dynamo_backend.options]


def test_compile_backends_offered_are_those_that_run_here(cfg_path, packages):
    present, registered, asked = packages
    panel = config_panel(hardware=CPU2)
    assert _offered(panel) == ["no", "eager", "aot_eager", "inductor"]  # no tensorrt, tvm, neuron...
    assert not asked  # nothing installed: torch._dynamo is not imported to decide
    gpu = config_panel(hardware=T4X2)
    assert _offered(gpu) == ["no", "eager", "aot_eager", "inductor", "cudagraphs"]
    gpu.device.value = "cpu"  # cudagraphs needs CUDA: the list follows the device
    assert _offered(gpu) == ["no", "eager", "aot_eager", "inductor"]

    present.update({"tvm", "onnxruntime"})
    registered.add("tvm")  # a torch that registers tvm but no longer onnxrt
    assert _offered(config_panel(hardware=CPU2)) == ["no", "eager", "aot_eager", "inductor", "tvm"]
    from magics.panel.rules import compile_backend_choices

    why = {c.value: c.tooltip for c in compile_backend_choices("auto", CPU2) if not c.enabled}
    assert "needs a CUDA GPU" in why["tensorrt"] and "needs a CUDA GPU" in why["cudagraphs"]
    assert "not registered in this torch" in why["onnxrt"]
    assert "torch_neuronx package" in why["neuron"] and "before PyTorch 2.0" in why["ofi"]


def test_compile_backends_cover_the_vocabulary():
    from magics.panel import rules
    from notebook_accel.contract import DYNAMO_BACKENDS

    known = {"no", *rules._BUILT_IN_BACKENDS, *rules._PACKAGE_BACKENDS, *rules._GONE_BACKENDS}
    assert known == set(DYNAMO_BACKENDS)


def test_a_file_naming_a_backend_that_cannot_run_here_loads_with_a_note(cfg_path, packages):
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("num_processes: 2\ndynamo_config:\n  dynamo_backend: TENSORRT\n")
    panel = config_panel(hardware=CPU2)
    assert panel.dynamo_backend.value == "tensorrt"
    assert ("tensorrt (not available here)", "tensorrt") in panel.dynamo_backend.options
    beside = panel.field_notes["dynamo_backend"]
    assert "<b>Note:</b> torch.compile backend &#x27;tensorrt&#x27; cannot run here" in beside.value
    assert "needs a CUDA GPU" in beside.value and not panel.save_button.disabled
    panel.num_processes.value = 1  # a refresh keeps the value and its mark
    assert panel.dynamo_backend.value == "tensorrt"
    data = yaml.safe_load(panel.save().read_text())
    assert data["dynamo_config"] == {"dynamo_backend": "TENSORRT"}  # kept: it may be for another machine
    panel.dynamo_backend.value = "inductor"
    assert "cannot run here" not in beside.value
    assert ("tensorrt (not available here)", "tensorrt") not in panel.dynamo_backend.options


def _labelled_rows(panel) -> dict[str, object]:
    """Every description in the panel's tree: text -> the widget's style."""
    out, todo = {}, [panel]
    while todo:
        widget = todo.pop()
        todo.extend(getattr(widget, "children", ()))
        if getattr(widget, "description", "") and hasattr(widget.style, "description_width"):
            out[widget.description] = widget.style
    return out


def test_row_labels_share_the_label_column(cfg_path):
    import ipywidgets as widgets

    panel = config_panel(hardware=CPU2)
    rows = _labelled_rows(panel)
    for text in ("Device", "Processes", "Mixed precision", "Start method", "torch.compile",
                 "Machines", "Strategy"):
        assert rows[text].description_width == "150px", text
    # the two button rows label themselves as the fields do (a description), not with a Label
    assert isinstance(panel.precision.label, widgets.HTML) and panel.precision.label.value == ""
    assert panel.precision.children[0] is panel.precision.label
    assert panel.strategy.strategy.children[0].description == "Strategy"
    assert not any(isinstance(w, widgets.Label) for w in (*panel.children, *panel.precision.children,
                                                           *panel.strategy.strategy.children))


def test_the_chosen_strategy_and_precision_read_as_chosen(cfg_path):
    panel = config_panel(hardware=CPU2)
    strategy = panel.strategy.strategy
    styles = {v: (b.button_style, b.icon, b.value) for v, b in strategy.buttons.items()}
    assert styles == {"DDP": ("primary", "check", True), "FSDP": ("", "", False),
                      "DEEPSPEED": ("", "", False)}
    strategy.buttons["FSDP"].value = True  # a click
    assert strategy.value == "FSDP" and panel.state().strategy == "FSDP"
    assert (strategy.buttons["FSDP"].button_style, strategy.buttons["DDP"].button_style) == ("primary", "")
    assert not strategy.buttons["DDP"].value and panel.strategy.options.layout.display == ""
    strategy.buttons["FSDP"].value = False  # un-pressing the chosen one keeps it
    assert strategy.value == "FSDP" and strategy.buttons["FSDP"].value
    strategy.value = "DDP"
    assert strategy.buttons["DDP"].button_style == "primary" and panel.strategy.options.layout.display == "none"
    assert panel.precision_buttons["no"].button_style == "primary"
    assert panel.precision_buttons["no"].icon == "check"
    with pytest.raises(Exception, match="not one of"):
        strategy.value = "MEGATRON"


def test_show_as_code_is_a_monospace_code_block(cfg_path):
    panel = config_panel(hardware=CPU2)
    panel.code_button.click()
    code = panel.code.value
    assert "<pre style=" in code and "<code" in code and "</code></pre>" in code
    pre_style = code.split("<pre style='")[1].split("'")[0]
    assert "font-family:" in pre_style and "monospace" in pre_style and "white-space:pre" in pre_style
    inner = code.split("<code")[1].split(">", 1)[1].split("</code>")[0]
    assert "notebook_launcher(train, num_processes=2)" in inner
    assert "<" not in inner.replace("&lt;", "")  # the code is escaped text, no markup


def test_saving_auto_with_several_processes_names_the_device(cfg_path):
    panel = config_panel(hardware=CPU2)
    assert panel.device.value == "auto" and panel.num_processes.value == 2
    panel.save()
    data = yaml.safe_load(cfg_path.read_text())
    assert (data["distributed_type"], data["use_cpu"]) == ("MULTI_GPU", True)  # not NO: 1 process to the peer
    assert "device auto written as cpu" in panel.saved.value
    assert config_panel(hardware=CPU2).device.value == "cpu"
    panel.num_processes.value = 1
    panel.save()
    data = yaml.safe_load(cfg_path.read_text())
    assert (data["distributed_type"], data["use_cpu"]) == ("NO", False)  # one process: auto stays
    assert "written as" not in panel.saved.value
    gpu = config_panel(cfg_path, hardware=T4X2)
    gpu.device.value, gpu.num_processes.value = "auto", 2
    gpu.save()
    data = yaml.safe_load(cfg_path.read_text())
    assert (data["distributed_type"], data["use_cpu"]) == ("MULTI_GPU", False)


def _code_boxes(panel) -> list[str]:
    import html

    panel.code_button.click()
    return [html.unescape(part.split(">", 1)[1].split("</code>")[0])
            for part in panel.code.value.split("<code")[1:]]


@pytest.mark.parametrize("strategy", ["DDP", "FSDP", "DEEPSPEED"])
def test_show_as_code_gives_two_boxes_each_a_valid_cell_alone(cfg_path, strategy):
    """Copying one box gives a cell that runs: the Python call (no ``args=()`` noise), and the
    %%accelerate line (a cell magic must be a cell's first line: it cannot share a box)."""
    import ast

    from IPython.core.magic_arguments import parse_argstring

    from magics.accelerate_magic import AccelerateMagics

    panel = config_panel(hardware=CPU2)
    panel.strategy.strategy.value = strategy
    panel.precision_buttons["bf16"].value = True
    python, magic = _code_boxes(panel)
    ast.parse(python)  # valid Python as it is
    assert "args=()" not in python and "%%" not in python
    assert magic.startswith("%%accelerate ") and "notebook_launcher" not in magic
    first, *rest = magic.splitlines()
    assert all(line.startswith("#") for line in rest)  # a body of comments only: still a cell
    parse_argstring(AccelerateMagics.accelerate, first.removeprefix("%%accelerate "))  # flags parse


def test_notes_sit_beside_their_field_and_the_tests_verdict_above_its_log(cfg_path):
    import ipywidgets as widgets

    panel = config_panel(hardware=CPU2)
    panel.num_processes.value = 6  # oversubscribed: a note
    row = next(w for w in panel.children if isinstance(w, widgets.HBox)
               and panel.num_processes in w.children)
    assert row.children == (panel.num_processes, panel.field_notes["num_processes"])
    assert "6 processes on 2 CPU cores" in row.children[1].value
    assert "6 processes" not in panel.messages.value  # not at the bottom, above the buttons
    order = list(panel.children)
    assert order.index(panel.code) < order.index(panel.status) == order.index(panel.test_output) - 1


def test_words_without_repeats_brackets_or_markup_characters(cfg_path):
    panel = config_panel(hardware=CPU2)
    panel.precision_buttons["fp16"].value = True  # not on a CPU
    assert "fp16: fp16" not in panel.messages.value and "fp16: needs a GPU" in panel.messages.value
    assert "fp16: needs a GPU" in panel.precision_note.value
    assert "(s)" not in " ".join(m.text for m in validate(FormState(num_processes=5), CPU2))
    assert "1 CPU core," in Hardware(cpu_count=1, gpu_names=("Tesla T4",)).summary() + ","
    panel.precision_buttons["no"].value = True
    panel.num_processes.value = 2
    panel.save()
    assert "`" not in panel.saved.value and "<code>accelerate launch</code>" in panel.saved.value


def test_every_field_is_wide_enough_and_checkboxes_sit_in_the_control_column(cfg_path):
    """No choice or placeholder is clipped: every field has the panel's width (a dropdown left
    at ipywidgets' default keeps 150 px for TRANSFORMER_BASED_WRAP); a checkbox's box is
    indented by the label column, so it lines up with the fields' controls."""
    import ipywidgets as widgets

    from magics.panel.controls import FIELD_WIDTH, LABEL_WIDTH

    panel = config_panel(hardware=CPU2)
    fields = [panel.strategy.wrap, panel.strategy.state_dict_type, panel.strategy.classes,
              panel.strategy.min_num_params, panel.deepspeed.clipping, panel.deepspeed.zero_stage,
              panel.deepspeed.offload_optimizer, panel.deepspeed.offload_param, panel.device]
    assert all(w.layout.width == FIELD_WIDTH for w in fields), [w.description for w in fields
                                                                if w.layout.width != FIELD_WIDTH]
    boxes = [panel.strategy.reshard, panel.strategy.offload, panel.deepspeed.save16]
    assert all(isinstance(b, widgets.Checkbox) and b.indent
               and b.style.description_width == LABEL_WIDTH for b in boxes)


def test_the_tables_other_rows_are_fields_snapshots_and_heal_among_them(cfg_path, tmp_path):
    """Every row the config file holds that no field of the panel's own shows gets a field made
    from the row (issue 45: snapshot_every and snapshot_dir); it loads, checks, saves and shows
    as code."""
    from magics.panel.table_options import table_rows
    from notebook_accel.contract import OPTIONS

    shown = {o.name for o in OPTIONS.values() if o.panel_field}
    in_file = {o.name for o in OPTIONS.values() if o.file_key and o.config_flag}
    assert {o.name for o in table_rows()} == in_file - shown >= {"snapshot_every", "snapshot_dir", "heal"}
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("snapshot_every: 200\nheal: false\n")
    panel = config_panel(hardware=CPU2)
    fields = panel.table.fields
    assert set(fields) == in_file - shown and all(field in panel.table.box.children for field in fields.values())
    assert fields["snapshot_every"].value == "200" and fields["snapshot_dir"].value == ""
    assert fields["heal"].value is False and fields["snapshot_every"].description == "Snapshot every"
    assert "every N optimizer steps" in (getattr(fields["snapshot_every"], "tooltip", None)
                                         or fields["snapshot_every"].description_tooltip)
    fields["snapshot_every"].value = "0"
    assert errors(panel) and panel.save_button.disabled
    assert "Snapshot every: snapshot_every=0 must be an integer &gt;= 1" in panel.messages.value
    fields["snapshot_every"].value = "50"
    drive = str(tmp_path / "drive" / "run 7")
    fields["snapshot_dir"].value = drive
    fields["heal"].value = True  # the file said false: true is written
    assert not errors(panel)
    panel.code_button.click()
    assert "snapshot_every=50" in panel.code.value and "snapshot_dir=" in panel.code.value
    assert "--snapshot-every 50 --snapshot-dir" in panel.code.value and "heal" not in panel.code.value  # a pool's
    panel.save_button.click()
    data = yaml.safe_load(cfg_path.read_text())
    assert data["snapshot_every"] == 50 and data["snapshot_dir"] == drive and data["heal"] is True
    again = config_panel(hardware=CPU2).table.fields  # round trip
    assert again["snapshot_every"].value == "50" and again["snapshot_dir"].value == drive
    state = FormState(options={"snapshot_every": "", "snapshot_dir": "", "heal": True, "gpu_ids": ""})
    assert "snapshot" not in launcher_call(state) and "snapshot" not in magic_line(state)  # unset: not shown


def test_every_row_is_on_the_panel_and_its_code_is_the_rows(cfg_path):
    """Each row the panel's own fields show (``panel_field``) has its field, its FormState value
    and, set to a value other than its default, its keyword in the ``notebook_launcher`` code and
    its flag in the ``%%accelerate`` line, both read from the row (``own_fields``); the strategy
    selector's choice is its registry row's. A row added with a ``panel_field`` and no field, or
    whose code the panel leaves out, fails here."""
    import dataclasses

    from magics.panel.fsdp import FsdpForm
    from magics.panel.own_fields import MULTI_MACHINE, attribute, own_rows
    from magics.panel.table_options import table_rows
    from notebook_accel.contract import OPTIONS

    panel = config_panel(hardware=CPU2)
    for option in OPTIONS.values():
        if option.file_key and option.config_flag and not option.panel_field:
            assert option.name in panel.table.fields, option.name
    assert {o.name for o in own_rows()} | {o.name for o in table_rows()} >= {
        o.name for o in OPTIONS.values() if o.file_key and o.config_flag}
    assert {o.name for o in own_rows()} >= {"num_processes", "mixed_precision", "device", "use_port"}
    others = {"choices": "", "int": 2, "str": "10.0.0.7"}
    for option in own_rows():
        assert hasattr(panel, option.panel_field), option.name
        if option.choices:
            value = next(c for c in option.choices if c not in (option.default, "auto"))
        else:
            value = others["int" if option.kind is int else "str"]
        state = dataclasses.replace(FormState(num_machines=2), **{attribute(option): value})
        if attribute(option) != "num_machines":
            assert f"{option.name}={value!r}" in launcher_call(state), option.name
        single = dataclasses.replace(FormState(), **{attribute(option): value})
        flag = option.short_flag or option.magic_flag
        if flag and attribute(option) not in MULTI_MACHINE:
            assert f"{flag} {value}" in magic_line(single), option.name
    fsdp = FormState(fsdp=FsdpForm(strategy="FSDP"))
    assert "fsdp=True" in launcher_call(fsdp) and magic_line(fsdp).endswith(" --fsdp")


def test_the_panels_code_follows_its_rows(monkeypatch):
    """A row's flag changed in the table is the flag the panel's code shows (nothing by hand)."""
    import dataclasses

    from notebook_accel import contract

    row = contract.OPTIONS["start_method"]
    monkeypatch.setitem(contract.OPTIONS, "start_method", dataclasses.replace(row, magic_flag="--begin"))
    assert magic_line(FormState(num_processes=2, start_method="spawn")) == "%%accelerate -n 2 --begin spawn"


def test_a_new_row_in_the_file_reaches_the_panel_with_no_panel_edit(cfg_path, monkeypatch):
    """The recipe of tests/runtime/test_option_doors.py, at the panel's door: one row the config
    file holds (here an existing file key, ``compute_environment``) and nothing else gives a
    field that loads the file's value and saves the one typed."""
    from notebook_accel import contract
    from notebook_accel.contract import LaunchOption

    row = LaunchOption("compute_environment", str, "where the job runs", argument=False,
                       file_key="compute_environment", config_flag=True)
    monkeypatch.setitem(contract.OPTIONS, "compute_environment", row)
    cfg_path.parent.mkdir(parents=True)
    cfg_path.write_text("compute_environment: LOCAL_MACHINE\n")
    panel = config_panel(hardware=CPU2)
    field = panel.table.fields["compute_environment"]
    assert field.value == "LOCAL_MACHINE" and field.description == "Compute environment"
    field.value = "AMAZON_SAGEMAKER"  # the file's own check refuses it: the value did reach the file's config
    panel.save_button.click()
    assert "compute_environment" in panel.saved.value and "AMAZON_SAGEMAKER" in panel.saved.value
    field.value = "local_machine"
    panel.save_button.click()
    assert yaml.safe_load(cfg_path.read_text())["compute_environment"] == "LOCAL_MACHINE"
