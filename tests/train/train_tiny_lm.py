"""A tiny deterministic language model for step-level tests (no dependency on gptrain.models)."""

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 11, width: int = 8, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(vocab, width)
        self.proj = nn.Linear(width, width)
        self.out = nn.Linear(width, vocab, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)

    def forward(self, tokens):
        return self.out(torch.tanh(self.proj(self.emb(tokens))))


def random_batch(batch: int, seq: int, vocab: int = 11, seed: int = 0, masked: float = 0.3):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    mask = (torch.rand(batch, seq, generator=gen) > masked).float()
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": mask}


def split(batch, micro: int):
    n = batch["tokens"].shape[0]
    return [{k: v[i : i + micro] for k, v in batch.items()} for i in range(0, n, micro)]
