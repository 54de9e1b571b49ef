"""The fp8 e4m3 pieces of the Triton forward kernel (flash_attn/triton/fp8.py has the host side).

FlashAttention 3's FP8 forward: q, k, v are float8_e4m3fn with per-(batch, KV head) float32
descale factors (the real tensors are q * q_descale, ...). Both products run on fp8 operands:
S = (q8 . k8) * softmax_scale * q_descale * k_descale, and P, rounded to e4m3, times v8, the sum
scaled by v_descale at the end. P is 2^8 * exp(s - row max) (E4M3_P_SCALE_LOG2), in [0, 256], as in
FlashAttention 3's fp8 forward (and ours on Hopper, csrc/flash/softmax.cuh): with P in [0, 1], every
probability below 2^-10 of its row's largest rounded to 0 in e4m3, and a row whose mass lies in
many such keys lost it from P . V while its row sum kept it (tests/test_triton_fp8.py's long-tail
test). The row sums of the softmax use P before that rounding, as FlashAttention's Triton AMD
backend does.
"""

import triton
import triton.language as tl

E4M3_P_SCALE_LOG2 = tl.constexpr(8)  # P's scale, the module docstring: its largest value 256, below e4m3's 448
E4M3_MIN_NORMAL = tl.constexpr(0.015625)  # 2^-6; below it e4m3 steps by 2^-9
SUBNORMAL_ROUNDER = tl.constexpr(16384.0)  # 2^14: fp32's step there is 2^-9


@triton.jit
def _descaled_scales(Descales, batch, kv_head, stride_descale_t, stride_descale_b, scale, keep_scale):
    """(score scale, output scale) of (batch, kv_head): softmax_scale * q_descale * k_descale and
    keep_scale * v_descale, from Descales, the stacked (3, batch, heads_k) q / k / v descales."""
    base = Descales + batch * stride_descale_b + kv_head
    q_descale = tl.load(base)
    k_descale = tl.load(base + stride_descale_t)
    v_descale = tl.load(base + 2 * stride_descale_t)
    return scale * q_descale * k_descale, keep_scale * v_descale


@triton.jit
def _round_to_e4m3_grid(p):
    """p (>= 0, below 448; here a probability) rounded to the nearest e4m3 value, ties to even, still
    in fp32: normal values keep 3 of fp32's 23 mantissa bits (round at bit 20), values below 2^-6
    snap to multiples of 2^-9 by adding and removing 2^14 (fp32 addition rounds to nearest even)."""
    bits = p.to(tl.int32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & -1048576).to(tl.float32, bitcast=True)  # -1048576: ~0xFFFFF
    subnormal = (p + SUBNORMAL_ROUNDER) - SUBNORMAL_ROUNDER
    return tl.where(p < E4M3_MIN_NORMAL, subnormal, normal)


@triton.jit
def _round_to_bf16_grid(x):
    """x rounded to the nearest bfloat16 value, ties to even, still in fp32 (round at bit 16)."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)  # -65536: ~0xFFFF


@triton.jit
def _pv_operand(p, dtype: tl.constexpr, INTERPRETER_ROUNDING: tl.constexpr):
    """P in the dtype of V (e4m3 here) for the P . V product. INTERPRETER_ROUNDING (fp8 under
    Triton's interpreter only) rounds to the e4m3 grid first, so that the cast is exact: Triton 3.9's
    interpreter converts fp32 to fp8 with a rounding carry that lands in the wrong bit (0.4978
    becomes 0.25); a GPU's conversion rounds to nearest even, which this rounding reproduces
    (tests/test_triton_fp8.py checks both against torch)."""
    if INTERPRETER_ROUNDING:
        p = _round_to_e4m3_grid(p)
    return p.to(dtype)


@triton.jit
def _output(out, dtype: tl.constexpr, INTERPRETER_ROUNDING: tl.constexpr):
    """The output tile in the stored dtype (bfloat16 for fp8 inputs). INTERPRETER_ROUNDING rounds to
    the bfloat16 grid first: the interpreter truncates fp32 to bfloat16 (up to one unit of the last
    place, twice a GPU's error), a GPU rounds to nearest even."""
    if INTERPRETER_ROUNDING:
        out = _round_to_bf16_grid(out)
    return out.to(dtype)


@triton.jit
def keys_contiguous_kernel(V, Out, seqlen, stride_vb, stride_vs, stride_vh, stride_ob, stride_oh, stride_od,
                           HEADDIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):
    """Out[batch, head, d, key] = V[batch, key, head, d] for BLOCK_K keys of one (batch, head): V's
    rows in, their transpose out (Triton stages it through shared memory), both sides coalesced.
    The head dim of V is contiguous, as are the keys of Out. Offsets in int64: a long varlen V passes
    2^31 bytes."""
    key_block, head, batch = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    keys = key_block * BLOCK_K + tl.arange(0, BLOCK_K)
    dims = tl.arange(0, BLOCK_D)
    inside = (keys[:, None] < seqlen) & (dims[None, :] < HEADDIM)
    rows = tl.load(V + batch * stride_vb + head * stride_vh + keys[:, None] * stride_vs + dims[None, :], mask=inside)
    columns = Out + batch * stride_ob + head * stride_oh + dims[:, None] * stride_od + keys[None, :]
    tl.store(columns, tl.trans(rows), mask=tl.trans(inside))
