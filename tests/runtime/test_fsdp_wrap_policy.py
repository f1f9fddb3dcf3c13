"""Which layers FSDP2 shards by default: a real transformers model's own ``_no_split_modules``
(building the model takes seconds; tests/unit/test_fsdp_wrap_policy.py has the rest)."""

from __future__ import annotations

import pytest

from notebook_accel.strategies.fsdp.sharding import block_class_names
from tests.unit.test_fsdp_wrap_policy import gpt2, plugin

transformers = pytest.importorskip("transformers")


def test_default_is_the_models_no_split_modules():
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2, vocab_size=32))
    assert block_class_names(plugin(), gpt2()) == ["GPT2Block"]
    assert block_class_names(plugin(), llama) == ["LlamaDecoderLayer"]
