"""A tiny decoder-only transformer, GPT-2 style, for exactness tests on a real model shape: token and
position embeddings, causal multi-head attention with a padding mask, pre-norm blocks, and batches of
variable sequence length. Its ``forward`` has a data-dependent branch (on the padding) and, when asked,
a graph break in user code."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - torch's own convention

VOCAB, WIDTH, HEADS, LAYERS, MAX_LENGTH = 64, 32, 4, 2, 32


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).split(WIDTH, dim=-1)
        q, k, v = (t.view(batch, length, HEADS, WIDTH // HEADS).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(WIDTH // HEADS)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        mask = causal & ~padding[:, None, None, :]
        scores = scores.masked_fill(~mask, float("-inf"))
        attended = F.softmax(scores, dim=-1).nan_to_num() @ v
        return self.out(attended.transpose(1, 2).reshape(batch, length, WIDTH))


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attention = Attention()
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), padding)
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(MAX_LENGTH, WIDTH)
        self.blocks = nn.ModuleList(TransformerBlock() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.graph_break = graph_break

    def forward(self, ids: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        if padding.any():  # data-dependent: a padded batch takes this path
            x = x * (~padding)[..., None]
        for block in self.blocks:
            x = block(x, padding)
        if self.graph_break:
            print("", end="")  # a user's debugging line
        return self.head(self.norm(x))


class LanguageModel(pl.LightningModule):
    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = TinyGPT(graph_break)
        self.losses: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, padding = batch
        logits = self.model(ids[:, :-1], padding[:, :-1])
        targets = ids[:, 1:].masked_fill(padding[:, 1:], -100)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def variable_length_batches(lengths: list[int], batch_size: int = 4) -> list[Any]:
    """Batches of token ids padded to their longest sequence; the lengths change from batch to batch."""
    generator = torch.Generator().manual_seed(7)
    batches = []
    for longest in lengths:
        ids = torch.randint(1, VOCAB, (batch_size, longest), generator=generator)
        real = torch.randint(longest // 2, longest + 1, (batch_size,), generator=generator)
        real[0] = longest
        padding = torch.arange(longest)[None, :] >= real[:, None]
        batches.append((ids.masked_fill(padding, 0), padding))
    return batches
