"""`python -m flash_attn.benchmark`: see flash_attn/benchmark/cli.py and benchmarks/README.md."""

from .cli import main

raise SystemExit(main())
