"""A decoder-only transformer language model, GPT-2 style (Radford et al. 2019, "Language Models are
Unsupervised Multitask Learners"; the layout of Karpathy's nanoGPT).

Token and learned position embeddings, pre-norm blocks (LayerNorm -> causal self-attention ->
residual, LayerNorm -> 4x GELU MLP -> residual), a final LayerNorm and a head that shares the
token embedding's weight. Attention goes through ``scaled_dot_product_attention`` with
``is_causal=True``, so a GPU runs its fused flash or memory-efficient kernels. GPT-2's
initialization: normal(0, 0.02), residual projections scaled by 1/sqrt(2 * layers).

The registry's builder contract holds for it: (input shape, classes) -> module, where the input
shape is ``(context,)`` (tokens per sample) and the classes are the vocabulary. ``forward`` takes
int64 tokens (B, T) and returns logits (B, T, vocabulary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTSize:
    """One size of the model."""

    layers: int
    heads: int
    width: int
    """The embedding width; ``heads`` divides it."""


# nano trains in minutes on 2 CPU cores; gpt2 is GPT-2 small (124M parameters at its 50,257-token
# vocabulary and 1,024-token context), the size published data-parallel LM runs start from.
SIZES = {
    "gpt-nano": GPTSize(layers=2, heads=4, width=128),
    "gpt-mini": GPTSize(layers=6, heads=6, width=384),
    "gpt2": GPTSize(layers=12, heads=12, width=768),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, size: GPTSize) -> None:
        super().__init__()
        self.heads = size.heads
        self.qkv = nn.Linear(size.width, 3 * size.width)
        self.proj = nn.Linear(size.width, size.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (B, T, C) -> (B, heads, T, C / heads)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, size: GPTSize) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(size.width)
        self.attn = CausalSelfAttention(size)
        self.ln2 = nn.LayerNorm(size.width)
        self.fc = nn.Linear(size.width, 4 * size.width)
        self.proj = nn.Linear(4 * size.width, size.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, size: GPTSize, context: int, vocabulary: int) -> None:
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocabulary, size.width)
        self.positions = nn.Embedding(context, size.width)
        self.blocks = nn.ModuleList(Block(size) for _ in range(size.layers))
        self.ln = nn.LayerNorm(size.width)
        self.head = nn.Linear(size.width, vocabulary, bias=False)
        self.head.weight = self.tokens.weight  # weight tying (Press & Wolf 2017)
        self.apply(self._init)
        residual_std = 0.02 / math.sqrt(2 * size.layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, std=residual_std)
            nn.init.normal_(block.proj.weight, std=residual_std)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.context:
            raise ValueError(f"a sequence of {t} tokens is longer than the model's context "
                             f"({self.context}); make the data set's context at most that")
        x = self.tokens(tokens) + self.positions(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def gpt(size: str, input_shape: tuple[int, ...], vocabulary: int) -> GPT:
    """The registry's builder: ``size`` from SIZES, a context of ``input_shape[0]`` tokens."""
    return GPT(SIZES[size], input_shape[0], vocabulary)
