"""One forward call, for a profiler to attach to: bf16, hidden 2048, batch x seqlen = 16k.

    python benchmarks/experiments/one_forward.py HEADDIM SEQLEN CAUSAL(0|1)
"""

import sys

import torch

import flash_attn

headdim, seqlen, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
q, k, v = (torch.randn(16384 // seqlen, seqlen, 2048 // headdim, headdim, device="cuda", dtype=torch.bfloat16)
           for _ in range(3))
flash_attn.flash_attn_func(q, k, v, causal=causal)
torch.cuda.synchronize()
