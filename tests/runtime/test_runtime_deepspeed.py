"""DeepSpeed ZeRO on 2 processes (gloo, CPU, real collectives and checkpoints), started by ``torchrun``.

Two launches of ``runtime_scripts/deepspeed_checks.py``: ``train`` (ZeRO 1/2/3 against a
1-process reference in fp32 and bf16, accumulation + clipping, the plugin built from the
launcher's variables, ZeRO-3 weight consolidation, a ZeRO-2 checkpoint reloaded in place after
more training, and an uninterrupted run that saves a checkpoint half way) and ``resume`` (fresh
processes that load it and must land bit for bit on the uninterrupted run). Skipped, saying why, where deepspeed is not installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.runtime_support import torchrun

SCRIPT = Path(__file__).parents[1] / "runtime_scripts" / "deepspeed_checks.py"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                       reason="deepspeed is not installed (pip install -e '.[deepspeed]', DS_BUILD_OPS=0)"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("deepspeed")
    train = torchrun(SCRIPT, out, "train", timeout=280)
    resume = torchrun(SCRIPT, out, "resume", timeout=200)  # fresh processes
    return {"train": train, "resume": resume, "out": out}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_match_one_process(runs, stage):
    for rank in runs["train"]:
        case = rank[f"zero{stage}"]
        assert case["type"] == "DEEPSPEED" and case["engine"] == "DeepSpeedEngine", case
        # "auto" filled from the loader; no clipping unless asked (DeepSpeed's own default clips at 1.0)
        assert case["micro_batch"] == 4 and case["clipping"] == 0.0, case
        assert case["loss_rel"] <= 1e-4 and case["param_diff"] <= 1e-5, case
        # ZeRO-3 partitions the parameters: each rank holds half; stages 1-2 keep full weights
        assert case["param_fraction"] == (0.5 if stage == 3 else 1.0), case
    case = runs["train"][0][f"zero{stage}"]
    print(f"ZeRO-{stage} fp32: loss rel {case['loss_rel']:.2e}, params {case['param_diff']:.2e}, "
          f"holds {case['param_fraction']:.2f} of the parameters")


def test_zero3_unwrap_gives_a_plain_full_module_with_its_tie(runs):
    case = runs["train"][0]["zero3"]
    assert case["plain_type"] == "TinyLM" and case["plain_tied"]


@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_trains_on_fp32_master_weights(runs, stage):
    for rank in runs["train"]:
        case = rank[f"bf16_zero{stage}"]
        # bf16's own rounding: the first step is bit-identical to the 1-process reference; later
        # steps differ by ~1-2e-3 relative (half-batch bf16 gradients vs full-batch ones)
        assert case["loss_rel"] <= 3e-3, case
        assert case["param_dtypes"] == ["torch.bfloat16"], case
        if stage == 2:
            assert case["master_dtypes"] == ["torch.float32"], case
    print(f"ZeRO-{stage} bf16: loss rel {runs['train'][0][f'bf16_zero{stage}']['loss_rel']:.2e}")


def test_accumulation_and_clipping_match_one_process(runs):
    for rank in runs["train"]:
        case = rank["accumulate_clip"]
        assert case["accumulation"] == 2
        assert case["loss_rel"] <= 1e-4 and case["param_diff"] <= 1e-5, case
        assert min(case["norms"]) > 0.5, case  # the norms exceeded the threshold: clipping was active
    case = runs["train"][0]["accumulate_clip"]
    print(f"ZeRO-2 accumulation 2 + clipping 0.5: loss rel {case['loss_rel']:.2e}, params {case['param_diff']:.2e}")


def test_plugin_from_the_launchers_variables_and_zero3_consolidation(runs):
    main, other = runs["train"]
    case = main["from_env"]
    assert case["stage"] == 3 and case["type"] == "DEEPSPEED" and case["loss_rel"] <= 1e-4, case
    assert "head.weight" in case["full_keys"] and case["full_diff"] == 0.0, case
    assert case["saved"] == "model.safetensors" and other["from_env"]["saved"] is None
    assert (runs["out"] / "zero3_model" / "model.safetensors").is_file()
    assert "zero3_save_16bit_model=True" in main["no_16bit_message"]


def test_checkpoint_resumes_bit_for_bit(runs):
    files = runs["train"][0]["files"]
    assert {f"pytorch_model/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} <= set(files)
    assert {"scheduler.bin", "random_states_0.pkl", "random_states_1.pkl", "dataloader.pt"} <= set(files)
    for before, after in zip(runs["train"], runs["resume"], strict=True):
        full, resumed = before["uninterrupted"], after["resumed"]
        assert resumed["losses"] == full["losses"][5:]
        assert resumed["params"] == full["params"] and resumed["lr"] == full["lr"]


def test_load_state_in_place_after_more_training_restores_the_checkpoint(runs):
    # what the peer's deepspeed_with_config_support does with --load_best_model, on ZeRO-2 as it uses
    for rank in runs["train"]:
        case = rank["reload_zero2"]
        assert case["moved"] > 1e-3, case  # the 3 steps after the save did change the weights
        assert case["after_load"] == 0.0 and case["again"] == 0.0, case


def test_zero3_init_builds_in_the_mixed_precision_and_the_checkpoint_merges_offline(runs):
    for rank in runs["train"]:
        case = rank["zero3_init"]
        assert case["built_dtypes"] == ["torch.bfloat16"], case  # zero.Init saw mixed_precision
        # DeepSpeed swaps torch's F.linear for its own under ZeRO-3; free_memory puts torch's back
        assert "deepspeed" in case["linear_while_engine"] and case["linear_after_free"] == "torch._C._nn", case
    merged = runs["train"][0]["zero3_init"]["merged_keys"]
    assert "blocks.0.up.weight" in merged and "embed.weight" in merged  # zero_to_fp32 found 'latest'
