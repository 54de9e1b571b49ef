"""The portable Triton backend (issue #9, in progress): see attention.py for what it covers."""

from .attention import backward, forward
from .fp8 import forward_fp8

__all__ = ["forward", "backward", "forward_fp8"]
