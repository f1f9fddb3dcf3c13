"""Hugging Face clients on our Accelerator: transformers models and a peft LoRA adapter on 2
processes (gloo, CPU), started by ``torchrun``; tiny models from configs, nothing downloaded.

One launch of ``runtime_scripts/hf_checks.py`` covers GPT-2 under DDP, GPT-2 and Llama under
FSDP2 wrapping their own ``_no_split_modules`` blocks, a wrong block name's error, and a LoRA
adapter under DDP with ``save_state`` / ``load_state`` and ``save_pretrained`` round trips.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.runtime_support import torchrun

pytest.importorskip("transformers")
pytest.importorskip("peft")

SCRIPT = Path(__file__).parents[1] / "runtime_scripts" / "hf_checks.py"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf")


@pytest.fixture(scope="module")
def ranks(out: Path) -> list[dict]:
    return torchrun(SCRIPT, out, "train", timeout=240)


def test_gpt2_trains_under_ddp_like_one_process_and_ranks_agree(ranks):
    for rank in ranks:
        ddp = rank["ddp"]
        assert (ddp["distributed_type"], ddp["wrapper"], ddp["unwrapped"]) == (
            "MULTI_CPU", "DistributedDataParallel", "GPT2LMHeadModel")
        assert ddp["losses"][-1] < ddp["losses"][0] - 0.3, ddp["losses"]
        assert ddp["loss_diff"] <= 1e-5 and ddp["norm_rel"] <= 1e-4, ddp  # gradients averaged, not summed
        assert ddp["param_diff"] <= 1e-3, ddp  # AdamW amplifies summation-order noise in tiny gradients
        assert ddp["rank_disagreement"] == 0.0
        print(f"GPT-2 DDP vs one process: loss {ddp['loss_diff']:.2g}, gradient norm (relative) "
              f"{ddp['norm_rel']:.2g}, parameters {ddp['param_diff']:.2g}")


def test_gpt2_saved_under_ddp_loads_back_with_from_pretrained(ranks):
    assert [r["ddp"]["save_model_file"] for r in ranks] == ["model.safetensors", None]  # the main process writes
    for rank in ranks:
        ddp = rank["ddp"]
        assert ddp["from_pretrained_diff"] == 0.0 and ddp["from_pretrained_tied"], ddp
        assert ddp["save_model_diff"] == 0.0  # save_model's file (tied weights stored once) + the config


@pytest.mark.parametrize("model, block", [("gpt2", "GPT2Block"), ("llama", "LlamaDecoderLayer")])
def test_fsdp2_wraps_the_models_own_blocks_and_trains_like_one_process(ranks, model, block):
    ddp_losses = ranks[0]["ddp"]["losses"]
    for rank in ranks:
        case = rank[f"fsdp_{model}"]
        assert (case["distributed_type"], case["block_class"]) == ("FSDP", block)
        assert case["blocks_sharded"] == [True, True] and case["root_sharded"], case  # each block is fully_shard-ed
        assert case["loss_diff"] <= 1e-5 and case["norm_rel"] <= 1e-4, case  # global norm over the shards
        assert case["unwrapped"] == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[model]
        assert case["unwrapped_diff"] <= 1e-3, case
    if model == "gpt2":  # the same model, data and optimizer as the DDP run
        assert max(abs(a - b) for a, b in zip(ranks[0]["fsdp_gpt2"]["losses"], ddp_losses, strict=True)) <= 1e-5


def test_fsdp2_lands_on_the_same_weights_as_ddp(ranks, out):
    ddp = torch.load(out / "ddp_weights.pt", weights_only=True)
    fsdp = torch.load(out / "fsdp_gpt2_weights.pt", weights_only=True)
    assert ddp.keys() == fsdp.keys()
    assert max(float((ddp[k] - fsdp[k]).abs().max()) for k in ddp) <= 1e-6  # bit-identical here on gloo/CPU


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_fsdp2_full_state_dict_loads_into_a_fresh_transformers_model(ranks, model):
    case = ranks[0][f"fsdp_{model}"]
    assert case["full_state_dict_load"] == {"missing": [], "unexpected": []}
    assert case["full_state_dict_diff"] == case["unwrapped_diff"]  # exactly the trained weights
    assert "full_state_dict_load" not in ranks[1][f"fsdp_{model}"]  # gathered on the main process only
    assert [r[f"fsdp_{model}"]["save_model_diff"] for r in ranks] == [0.0, 0.0]  # save_model -> from_pretrained


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_fsdp2_sharded_checkpoint_merges_in_the_notebook_into_from_pretrained(ranks, out, model):
    import transformers

    from notebook_accel import merge_fsdp_weights

    merged = out / f"fsdp_{model}_merged"  # the config is there already
    merge_fsdp_weights(out / f"fsdp_{model}_state", merged)  # this process has no process group
    loaded = transformers.AutoModelForCausalLM.from_pretrained(merged)
    trained = torch.load(out / f"fsdp_{model}_weights.pt", weights_only=True)
    state = loaded.state_dict()
    assert state.keys() == trained.keys() and all(torch.equal(state[k], trained[k]) for k in trained)


def test_a_wrong_block_name_is_refused_naming_it_and_the_models_blocks(ranks):
    for rank in ranks:
        message = rank["wrong_block_name"]
        assert message and "['GPT2Blok']" in message and "(_no_split_modules) are ['GPT2Block']" in message


def test_lora_under_ddp_trains_only_the_adapter(ranks):
    for rank in ranks:
        peft = rank["peft"]
        assert (peft["wrapper"], peft["unwrapped"]) == ("DistributedDataParallel", "PeftModel")
        assert peft["trainable_all_lora"] and peft["base_changed"] == 0.0 and peft["adapter_changed"] > 0.01, peft
        assert peft["losses"][-1] < peft["losses"][0], peft["losses"]


def test_lora_save_state_load_state_restores_adapter_and_optimizer_exactly(ranks):
    for rank in ranks:
        peft = rank["peft"]
        assert peft["fresh_adapter_differs"] > 0.01  # the fresh adapter started elsewhere
        assert peft["load_state_adapter_diff"] == 0.0 and peft["load_state_optimizer_diff"] == 0.0, peft


def test_lora_save_pretrained_writes_the_adapter_and_peft_loads_it(ranks):
    for rank in ranks:
        peft = rank["peft"]
        assert {"adapter_config.json", "adapter_model.safetensors"} <= set(peft["adapter_files"])
        assert peft["from_pretrained_adapter_diff"] == 0.0


def test_an_adapter_only_checkpoint_loads_with_strict_false(ranks):
    for rank in ranks:
        peft = rank["peft"]
        assert "Missing key(s)" in peft["strict_refusal"] and "base_layer.weight" in peft["strict_refusal"]
        assert peft["adapter_only_diff"] == 0.0


@pytest.mark.parametrize("policy", ["transformer_based_wrap", "peft"])
def test_lora_under_fsdp2_wraps_the_base_models_blocks_and_trains_like_ddp(ranks, policy):
    for rank in ranks:
        case = rank[f"peft_fsdp_{policy}"]
        assert case["blocks_sharded"] == [True, True] and case["unwrapped"] == "PeftModel", case
        assert case["loss_diff_to_ddp"] <= 1e-5 and case["base_changed"] == 0.0, case
        assert case["from_pretrained_adapter_diff"] == 0.0
    lora_layers_sharded = "FSDPLinear" in ranks[0][f"peft_fsdp_{policy}"]["sharded"]
    assert lora_layers_sharded == (policy == "peft")  # peft's policy also wraps each trainable LoRA layer


def test_a_lora_model_trained_in_workers_comes_back_to_the_notebook():
    from notebook_accel import notebook_launcher
    from tests.runtime_scripts import hf_models

    model, start, losses = notebook_launcher(hf_models.lora_for_the_notebook, num_processes=2)
    assert type(model).__name__ == "PeftModel" and losses[-1] < losses[0]
    trained = hf_models.adapter(model)
    assert trained.keys() == start.keys() and hf_models.max_diff(trained, start) > 0.01
    ids = hf_models.tokens()[:2][0]
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape == (2, hf_models.SEQ, hf_models.VOCAB)
