"""The small tied-weights language model and data the sharding check scripts train (FSDP, ZeRO)."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

VOCAB, DIM, SEQ = 32, 16, 8


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(DIM, 2 * DIM)
        self.down = torch.nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class TinyLM(torch.nn.Module):
    """Embedding, two blocks, a head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def make_model() -> TinyLM:
    torch.manual_seed(7)
    return TinyLM()


def data(n: int = 160) -> TensorDataset:
    g = torch.Generator().manual_seed(123)
    return TensorDataset(torch.randint(0, VOCAB, (n, SEQ), generator=g), torch.randint(0, VOCAB, (n, SEQ), generator=g))


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, float_logits: bool = False) -> torch.Tensor:
    """Next-token cross entropy (``float_logits``: computed in fp32 from half-precision logits)."""
    logits = model(x).reshape(-1, VOCAB)
    return torch.nn.functional.cross_entropy(logits.float() if float_logits else logits, y.reshape(-1))


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
