"""A small GPT-2 (learned positions, pre-norm blocks, GELU MLP, tied embeddings) whose attention is
either flash_attn's MHA module or standard attention written in plain PyTorch.

Both attentions have the same parameters (Wqkv, out_proj) and the same dropout on the attention
probabilities, so one set of weights serves both and the comparison is of the attention alone.
The plain one is the textbook computation the FlashAttention articles compare against: it
materializes the (batch, heads, seqlen, seqlen) scores, probabilities and dropout mask, which is
what makes its memory grow with the square of the context.
"""

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from flash_attn.modules.mha import MHA

ATTENTIONS = ("ours", "plain")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256  # bytes
    n_positions: int = 512
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.1  # on the attention probabilities and on each residual branch


class PlainCausalAttention(nn.Module):
    """Causal self-attention as plain PyTorch operations, with MHA's parameter names and packing."""

    def __init__(self, embed_dim, num_heads, dropout):
        super().__init__()
        self.num_heads = num_heads
        self.Wqkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        seqlen = x.shape[1]
        q, k, v = self.Wqkv(x).unflatten(-1, (3, self.num_heads, -1)).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        future = torch.ones(seqlen, seqlen, dtype=torch.bool, device=x.device).triu(1)
        probs = self.drop(scores.masked_fill(future, float("-inf")).softmax(dim=-1))
        return self.out_proj((probs @ v).transpose(1, 2).flatten(-2))


def _attention(kind, config):
    if kind == "ours":
        return MHA(config.n_embd, config.n_head, dropout=config.dropout, causal=True)
    return PlainCausalAttention(config.n_embd, config.n_head, config.dropout)


class Block(nn.Module):
    def __init__(self, kind, config):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)
        self.attn = _attention(kind, config)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * config.n_embd, config.n_embd))
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    def __init__(self, kind, config):
        super().__init__()
        if kind not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {kind!r}")
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(kind, config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self._init_weights(config)

    def _init_weights(self, config):
        """GPT-2's: N(0, 0.02), the projections into the residual stream scaled by 1 / sqrt(2 n_layer)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for residual in (block.attn.out_proj, block.mlp[2]):
                nn.init.normal_(residual.weight, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied output embedding


def build(kind, config, seed, device):
    torch.manual_seed(seed)
    return GPT(kind, config).to(device)


def build_pair(config, seed, device):
    """The two models with identical weights: ours is initialised, plain loads its state dict."""
    ours = build("ours", config, seed, device)
    plain = GPT("plain", config).to(device)
    plain.load_state_dict(ours.state_dict())
    return {"ours": ours, "plain": plain}
