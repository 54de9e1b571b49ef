"""Integrations with other libraries (`flash_attn.integrations.transformers`: Hugging Face transformers)."""
