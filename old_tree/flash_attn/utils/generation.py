"""InferenceParams: the decoding state FlashAttention 2's modules read (`flash_attn.utils.generation`).

One object is shared by every layer of a model during generation: each MHA keeps its KV cache in
key_value_memory_dict under its layer_idx, and the caller advances seqlen_offset (or the per-sample
lengths_per_sample) after each step. The fields and their meaning are FA2's, so code written
against FA2's generation loop drives our MHA unchanged.
"""

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class InferenceParams:
    """max_seqlen / max_batch_size: the capacity of the caches allocated on first use.
    seqlen_offset: tokens already in the cache (0 on the prompt). batch_size_offset: the first cache
    row of the current batch. key_value_memory_dict: layer_idx -> (max_batch_size, max_seqlen, 2,
    nheads_kv, headdim) cache. lengths_per_sample: optional (batch,) int32 tokens already in the
    cache per sample (it replaces seqlen_offset where given)."""

    max_seqlen: int
    max_batch_size: int
    seqlen_offset: int = 0
    batch_size_offset: int = 0
    key_value_memory_dict: dict = field(default_factory=dict)
    lengths_per_sample: Optional[torch.Tensor] = None

    def reset(self, max_seqlen, max_batch_size):
        """Start a new generation with the caches kept (their contents are overwritten)."""
        self.max_seqlen = max_seqlen
        self.max_batch_size = max_batch_size
        self.seqlen_offset = 0
        if self.lengths_per_sample is not None:
            self.lengths_per_sample.zero_()
