"""Model layers with FlashAttention 2's module paths (`flash_attn.layers.rotary`)."""
