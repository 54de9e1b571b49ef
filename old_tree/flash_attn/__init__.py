"""flash_attn: fast, memory-efficient, exact attention with hand-written GPU kernels.

Drop-in for FlashAttention 2's functions of the same names."""

__version__ = "0.1.0"

from . import flash_attn_interface  # noqa: E402
from .flash_attn_interface import *  # noqa: E402,F401,F403 - the public functions, listed there once

__all__ = [*flash_attn_interface.__all__, "__version__"]
