"""The KV cache of one MHA layer during generation, in FlashAttention 2's layout: one
(max_batch_size, max_seqlen, 2, nheads_kv, headdim) tensor per layer_idx in
inference_params.key_value_memory_dict, allocated on first use, so that FA2's generation code and
models that preallocate with allocate_inference_cache find it where they expect.

The prompt (seqlen_offset 0, no lengths_per_sample) is written into the cache and attended densely,
which runs the training kernels; later steps append and attend in one flash_attn_with_kvcache call,
which runs the split-KV decode kernels and can rotate q and the new keys itself."""

import torch

from ..kvcache import flash_attn_with_kvcache


def layer_cache(inference_params, layer_idx, kv):
    """The cache of layer_idx, allocated in kv's dtype and device if the layer has none yet."""
    caches = inference_params.key_value_memory_dict
    if layer_idx not in caches:
        nheads_kv, headdim = kv.shape[-2:]
        caches[layer_idx] = torch.empty(inference_params.max_batch_size, inference_params.max_seqlen, 2, nheads_kv,
                                        headdim, dtype=kv.dtype, device=kv.device)
    return caches[layer_idx]


def batch_rows(cache, inference_params, batch):
    """The cache rows of the current batch (batch_size_offset onwards), checked against the cache."""
    start = inference_params.batch_size_offset
    if start + batch > cache.shape[0]:
        raise ValueError(f"MHA: batch_size_offset ({start}) + batch ({batch}) exceeds the cache's "
                         f"{cache.shape[0]} rows (inference_params.max_batch_size)")
    return cache[start:start + batch]


def is_prompt(inference_params):
    """The first step with one shared offset of 0: attended without reading the cache."""
    return inference_params.seqlen_offset == 0 and inference_params.lengths_per_sample is None


def check_room(cache, inference_params, seqlen):
    """The new tokens fit (flash_attn_with_kvcache would drop those past the end). A tensor
    lengths_per_sample is not read, to keep decoding free of device syncs."""
    end = inference_params.seqlen_offset + seqlen
    if inference_params.lengths_per_sample is None and end > cache.shape[1]:
        raise ValueError(f"MHA: seqlen_offset ({inference_params.seqlen_offset}) + seqlen ({seqlen}) exceeds the "
                         f"cache's {cache.shape[1]} positions (inference_params.max_seqlen)")


def write_prompt(rows, kv):
    """Store the prompt's keys and values at positions 0 .. seqlen - 1."""
    rows[:, :kv.shape[1]] = kv.detach()


def cache_seqlens(inference_params, batch):
    """Tokens already in the cache: per sample (int32, as the kernels take them) or one int."""
    lengths = inference_params.lengths_per_sample
    if lengths is None:
        return inference_params.seqlen_offset
    start = inference_params.batch_size_offset
    return lengths[start:start + batch].to(torch.int32)


def append_and_attend(q, kv, rows, inference_params, options, rotary):
    """Append kv (batch, seqlen, 2, nheads_kv, headdim) to the cache rows and attend q over the
    cached and new keys. rotary: None, or (cos, sin, interleaved) for the kernel to rotate q and
    the new keys at their positions."""
    cos, sin, interleaved = rotary if rotary is not None else (None, None, False)
    return flash_attn_with_kvcache(
        q, rows[:, :, 0], rows[:, :, 1], k=kv[:, :, 0], v=kv[:, :, 1], rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=cache_seqlens(inference_params, q.shape[0]), softmax_scale=options.softmax_scale,
        causal=options.causal, window_size=options.window_size, rotary_interleaved=interleaved,
        alibi_slopes=options.alibi_slopes)
