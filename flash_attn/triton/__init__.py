"""The portable Triton backend (issue #9, in progress): see attention.py for what it covers."""

from .attention import backward, forward

__all__ = ["forward", "backward"]
