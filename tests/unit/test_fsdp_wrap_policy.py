"""Which layers FSDP2 shards as their own groups, chosen without processes: ``TRANSFORMER_BASED_WRAP``
with the plugin's class names, else the model's own ``_no_split_modules`` (real transformers models,
built from configs); torch's FSDP1 policy functions, bare or partial, from us or from the peer's plugin."""

from __future__ import annotations

import functools

import pytest
import torch

from notebook_accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin, resolve_plugin
from notebook_accel.strategies.fsdp.sharding import _wrap_predicate, block_class_names

transformers = pytest.importorskip("transformers")


def gpt2() -> torch.nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=32,
                                                                n_positions=8))


def plugin(names: list[str] | None = None) -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                          transformer_cls_names_to_wrap=names)


def test_given_names_win_over_the_default():
    assert block_class_names(plugin(["GPT2MLP"]), gpt2()) == ["GPT2MLP"]


def test_a_wrong_name_is_refused_naming_it_and_the_block_classes():
    with pytest.raises(ValueError, match=r"transformer_cls_names_to_wrap .*names \['GPT2Blok'\].*"
                                         r"block classes \(_no_split_modules\) are \['GPT2Block'\]"):
        block_class_names(plugin(["GPT2Blok"]), gpt2())


def test_a_model_without_block_classes_needs_names():
    with pytest.raises(ValueError, match=r"give transformer_cls_names_to_wrap.*Sequential declares no "
                                         r"_no_split_modules; its module classes are \['Linear', 'Sequential'\]"):
        block_class_names(plugin(), torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_a_default_class_the_model_lacks_is_refused_naming_the_source():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model._no_split_modules = ["DecoderLayer"]
    with pytest.raises(ValueError, match=r"Sequential._no_split_modules names \['DecoderLayer'\]"):
        block_class_names(plugin(), model)


def wrapped(plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module) -> list[str]:
    wants = _wrap_predicate(plugin, model)
    return [type(m).__name__ for m in model.modules() if wants(m)]


def test_torchs_fsdp1_policies_work_bare_or_partial():
    from torch.distributed.fsdp.wrap import (
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    partial = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={GPT2Block})
    assert wrapped(FullyShardedDataParallelPlugin(auto_wrap_policy=partial), gpt2()) == ["GPT2Block"] * 2
    bare = FullyShardedDataParallelPlugin(auto_wrap_policy=transformer_auto_wrap_policy)
    assert bare.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" and wrapped(bare, gpt2()) == ["GPT2Block"] * 2
    sized = functools.partial(size_based_auto_wrap_policy, min_num_params=3000)
    assert wrapped(FullyShardedDataParallelPlugin(auto_wrap_policy=sized), gpt2()) == [
        "GPT2LMHeadModel", "GPT2Model", "GPT2Block", "GPT2Block"]


def test_the_peers_plugin_after_set_auto_wrap_policy_is_accepted():
    accelerate = pytest.importorskip("accelerate")
    model = gpt2()
    peer = accelerate.FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    peer.set_auto_wrap_policy(model)  # now a functools.partial(transformer_auto_wrap_policy, ...)
    assert isinstance(peer.auto_wrap_policy, functools.partial)
    assert wrapped(resolve_plugin(peer), model) == ["GPT2Block"] * 2


def test_subclasses_of_a_named_class_are_wrapped_too():
    class MyLinear(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(MyLinear(2, 2), torch.nn.ReLU())
    wants = _wrap_predicate(plugin(["Linear"]), model)
    assert [wants(m) for m in model] == [True, False]
