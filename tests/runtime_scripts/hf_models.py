"""The tiny transformers models, synthetic token data and training loop the Hugging Face client
checks share (``hf_checks.py`` under torchrun; ``test_hf_clients.py`` under notebook_launcher).

Models are built from configs and data is made here: nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from notebook_accel import Accelerator

VOCAB, SEQ, PER_RANK, STEPS = 128, 16, 4, 8


def gpt2() -> GPT2LMHeadModel:
    """Two GPT2Blocks, embeddings tied to the head, no dropout (so runs compare exactly)."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def llama() -> LlamaForCausalLM:
    """Two LlamaDecoderLayers, untied head."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                        num_attention_heads=2, num_key_value_heads=2, vocab_size=VOCAB,
                                        max_position_embeddings=SEQ))


def tokens(n: int = 2 * PER_RANK * STEPS) -> TensorDataset:
    """Arithmetic sequences modulo VOCAB (a learnable pattern), random starts and strides."""
    g = torch.Generator().manual_seed(123)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    return TensorDataset((start + stride * torch.arange(SEQ)) % VOCAB)


def train(model: torch.nn.Module, acc: Accelerator | None, lr: float = 1e-2) -> tuple[torch.nn.Module, Any, list, list]:
    """``STEPS`` steps of AdamW on the causal-LM loss, global batch ``2 * PER_RANK`` either way.

    Returns the model, optimizer, losses and gradient norms (AdamW would hide a wrongly scaled
    gradient; the norms do not).
    """
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    loader = DataLoader(tokens(), batch_size=PER_RANK if acc else 2 * PER_RANK)
    if acc is not None:
        model, opt, loader = acc.prepare(model, opt, loader)
    clip = acc.clip_grad_norm_ if acc else torch.nn.utils.clip_grad_norm_
    losses, norms = [], []
    for (ids,) in loader:
        loss = model(input_ids=ids, labels=ids).loss
        (acc.backward(loss) if acc else loss.backward())
        norms.append(float(clip([p for p in model.parameters() if p.requires_grad], 1e6)))
        opt.step()
        opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean") if acc else loss.detach()))
    return model, opt, losses, norms


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def lora_llama(seed: int) -> torch.nn.Module:
    """The Llama model with a LoRA adapter (r=4) on its attention q and v projections."""
    from peft import LoraConfig, get_peft_model

    base = llama()
    torch.manual_seed(seed)  # the adapter's own initialisation
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    return get_peft_model(base, config)


def adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in weights(model).items() if "lora_" in k}


def lora_for_the_notebook() -> tuple[torch.nn.Module, dict[str, torch.Tensor], list[float]]:
    """Train the LoRA model under DDP in a launched worker; return to the notebook the unwrapped
    PeftModel, its adapter as it started, and the losses."""
    acc = Accelerator()
    model = lora_llama(seed=1)
    start = adapter(model)
    model, _, losses, _ = train(model, acc, lr=5e-2)
    return acc.unwrap_model(model), start, losses
