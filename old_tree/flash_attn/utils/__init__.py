"""Helpers with FlashAttention 2's module paths (`flash_attn.utils.generation`)."""
