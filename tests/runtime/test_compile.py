"""torch.compile through the Accelerator on 2 workers (gloo, CPU, inductor), in one launch.

The launch takes its compile settings from a config file's ``dynamo_config`` (the peer's format),
so the option table, the workers' ``ACCELERATE_DYNAMO_*`` variables and ``TorchDynamoPlugin()``
are on the path. The workers (``runtime_scripts/compile_checks.py``) compare a compiled DDP run
with an eager one, round-trip checkpoints, compile by regions, compile an FSDP2-sharded model and
a DeepSpeed engine's module; the kernel's text view must say ``compiling`` while dynamo works.
"""

from __future__ import annotations

import pytest
import yaml

from notebook_accel import notebook_launcher
from tests.runtime_scripts import compile_checks

pytestmark = pytest.mark.slow

CONFIG = {"distributed_type": "MULTI_CPU", "num_processes": 2, "use_cpu": True,
          "dynamo_config": {"dynamo_backend": "INDUCTOR", "dynamo_mode": "default",
                            "dynamo_use_fullgraph": False, "dynamo_use_dynamic": False}}


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("compile")
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    capture = pytest.MonkeyPatch()
    import io
    import sys

    lines = io.StringIO()
    capture.setattr(sys, "stderr", _Tee(sys.stderr, lines))  # a script's text view writes to sys.stderr
    try:
        results = notebook_launcher(compile_checks.run, args=(str(out),), config_file=config, return_all=True)
    finally:
        capture.undo()
    return {"ranks": results, "view": lines.getvalue()}


class _Tee:
    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def test_the_config_files_dynamo_config_reaches_the_plugin(launch):
    for rank in launch["ranks"]:
        assert rank["env"]["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
        assert rank["env"]["ACCELERATE_DYNAMO_USE_FULLGRAPH"] == "false"
        assert rank["plugin"] == ["INDUCTOR", "default", False, False, False]


def test_compiled_ddp_matches_eager(launch):
    for rank in launch["ranks"]:
        assert (rank["prepared_type"], rank["wrapped_type"]) == ("OptimizedModule", "DistributedDataParallel")
        assert rank["loss_diff"] <= 1e-5, rank["losses"]
        assert rank["losses"][-1] < rank["losses"][0]  # it trained
        print(f"compiled vs eager over {len(rank['losses'])} steps: max loss difference {rank['loss_diff']:.2g}")


def test_checkpoints_of_a_compiled_model_load_into_an_uncompiled_one(launch):
    for rank in launch["ranks"]:
        check = rank["checkpoints"]
        assert check["keys_with_orig_mod"] == []
        assert check["from_save_model"] and check["from_save_state"] and check["load_state_restores"]
        assert (check["kept"], check["plain"]) == ("OptimizedModule", "Net")


def test_regional_compilation_compiles_each_block(launch):
    for rank in launch["ranks"]:
        regional = rank["regional"]
        assert regional["blocks"] == ["OptimizedModule", "OptimizedModule"]
        assert regional["block_modules"] == ["Block", "Block"] and not regional["whole_compiled"]
        assert regional["frames_compiled"] >= 3  # each block and the head, not one graph
        assert regional["loss_diff"] <= 1e-6 and regional["keys_with_orig_mod"] == []


@pytest.mark.parametrize("case", ["fsdp", "fsdp_regional"])
def test_fsdp2_sharded_then_compiled_trains(launch, case):
    for rank in launch["ranks"]:
        fsdp = rank[case]
        assert fsdp["distributed_type"] == "FSDP" and fsdp["sharded"] and fsdp["compiled_in_place"], fsdp
        assert fsdp["whole_compiled"] == (case == "fsdp"), fsdp  # regional: the blocks and the head only
        assert fsdp["loss_diff"] <= 1e-5 and fsdp["keys_with_orig_mod"] == []


def test_the_text_view_says_compiling(launch):
    assert "compiling (rank " in launch["view"], launch["view"][-3000:]


def test_deepspeed_compiles_its_engines_module_in_place(launch):
    for rank in launch["ranks"]:
        case = rank["deepspeed"]
        if case is None:
            pytest.skip("deepspeed is not installed (pip install -e '.[deepspeed]', DS_BUILD_OPS=0)")
        assert case["engine"] == "DeepSpeedEngine" and case["compiled_in_place"], case
        assert case["second_epoch"] < case["first_epoch"] and case["keys_with_orig_mod"] == [], case
