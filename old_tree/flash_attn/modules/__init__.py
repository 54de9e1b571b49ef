"""Model modules with FlashAttention 2's module paths (`flash_attn.modules.mha`)."""
