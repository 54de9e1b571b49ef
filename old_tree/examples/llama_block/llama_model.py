"""A stack of LLaMA-style decoder blocks (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU
MLP) whose attention core is one of three implementations:

- "ours": flash_attn's MHA module (our kernels, through flash_attn_kvpacked_func);
- "plain": attention as textbook PyTorch operations, as transformers' eager Llama computes it (K/V
  heads repeated to the query heads, (batch, heads, seqlen, seqlen) scores, causal mask, fp32
  softmax, probabilities @ V);
- "sdpa": torch.nn.functional.scaled_dot_product_attention(is_causal=True, enable_gqa=True), PyTorch
  choosing its backend.

All three have MHA's parameters (Wqkv packed as MHA packs it: q, then k and v; out_proj) and the same
rotary code (flash_attn.layers.rotary, LLaMA's non-interleaved halves, pure PyTorch), so one state
dict serves them all and what differs between them is the attention alone.
"""

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from flash_attn.layers.rotary import RotaryEmbedding
from flash_attn.modules.mha import MHA

ATTENTIONS = ("ours", "plain", "sdpa")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Defaults: LLaMA-3-8B's block (4096 wide, 32 query and 8 KV heads of 128, SwiGLU 14336, rotary
    base 500000), but 4 blocks instead of 32 and LLaMA-2's 32000-token vocabulary instead of 128256,
    so that weights, gradients and AdamW state (~18 GB) leave room on one 80 GB GPU for the plain
    attention's scores at 4k context."""

    vocab_size: int = 32000
    n_layer: int = 4
    n_embd: int = 4096
    n_head: int = 32
    n_kv_head: int = 8
    intermediate_size: int = 14336
    rope_base: float = 500000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self):
        return self.n_embd // self.n_head


def plain_attention(q, k, v):
    """Causal attention on q (batch, heads, seqlen, head_dim), k and v (batch, kv_heads, ...). It
    materializes the scores and probabilities of every head, which is what makes its memory grow
    with the square of the context. The softmax runs in fp32, or fp64 for fp64 inputs."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    seqlen = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    future = torch.ones(seqlen, seqlen, dtype=torch.bool, device=q.device).triu(1)
    softmax_dtype = torch.promote_types(q.dtype, torch.float32)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1, dtype=softmax_dtype).to(q.dtype)
    return probs @ v


def sdpa_attention(q, k, v):
    """PyTorch's fused attention with its default backend choice; GQA without repeating K/V."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


CORES = {"plain": plain_attention, "sdpa": sdpa_attention}


class TorchAttention(nn.Module):
    """MHA's projections and rotary step (same parameter names and packing) around an attention core
    written in PyTorch."""

    def __init__(self, kind, config):
        super().__init__()
        self.core = CORES[kind]
        self.num_heads, self.num_heads_kv, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.Wqkv = nn.Linear(config.n_embd, (config.n_head + 2 * config.n_kv_head) * config.head_dim, bias=False)
        self.out_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.rotary_emb = RotaryEmbedding(config.head_dim, base=config.rope_base)

    def forward(self, x):
        qkv = self.Wqkv(x).unflatten(-1, (self.num_heads + 2 * self.num_heads_kv, self.head_dim))
        qkv = self.rotary_emb(qkv, num_heads_q=self.num_heads)
        q, k, v = qkv.transpose(1, 2).split((self.num_heads, self.num_heads_kv, self.num_heads_kv), dim=1)
        return self.out_proj(self.core(q, k, v).transpose(1, 2).flatten(-2))


def _attention(kind, config):
    if kind == "ours":
        return MHA(config.n_embd, config.n_head, num_heads_kv=config.n_kv_head, qkv_proj_bias=False,
                   out_proj_bias=False, causal=True, rotary_emb_dim=config.head_dim, rotary_emb_base=config.rope_base)
    return TorchAttention(kind, config)


class SwiGLU(nn.Module):
    """LLaMA's MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """LLaMA's pre-norm decoder block."""

    def __init__(self, kind, config):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = _attention(kind, config)
        self.mlp_norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class LlamaStack(nn.Module):
    """Token embedding, n_layer blocks, final RMSNorm and an untied output projection (as LLaMA)."""

    def __init__(self, kind, config):
        super().__init__()
        if kind not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {kind!r}")
        self.embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(kind, config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self):
        """transformers' Llama initialisation: N(0, 0.02) for every linear and embedding weight."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def build(kind, config, device, state=None):
    """The model built on `device` (no copy through the host), with `state`'s weights when given."""
    with torch.device(device):
        model = LlamaStack(kind, config)
    if state is not None:
        model.load_state_dict(state)
    return model


def initial_state(config, seed, device):
    """Seeded weights, kept on the host so that no implementation's peak memory includes them."""
    torch.manual_seed(seed)
    model = build("ours", config, device)
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}


def parameter_count(state):
    return sum(tensor.numel() for tensor in state.values())


def sdpa_backend(config, batch, seqlen, device, dtype):
    """The backend PyTorch's dispatcher picks for sdpa_attention's call at this shape and layout, from
    torch._fused_sdp_choice (private: the function SDPA itself consults); None where it is missing."""
    heads = config.n_head + 2 * config.n_kv_head
    qkv = torch.empty(batch, seqlen, heads, config.head_dim, device=device, dtype=dtype, requires_grad=True)
    q, k, v = qkv.transpose(1, 2).split((config.n_head, config.n_kv_head, config.n_kv_head), dim=1)
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=True)).name
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
