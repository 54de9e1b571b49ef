"""The ROCm side of the build: hipify step, CDNA probe kernel and its CI check (see hipify_sources.py)."""
