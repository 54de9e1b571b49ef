// Compile-time feature switches. Every feature is a runtime flag of the kernels; a trimmed dev build
// can compile one out with FLASH_ATTN_DISABLE_{DROPOUT,SOFTCAP,ALIBI,LOCAL,VARLEN}=1 (setup.py turns
// them into these macros). The op layer then rejects calls that need it, naming the flag, and the
// tests skip them with the same reason.
//
// One compile-time split the kernels make on their own: every attention kernel (forward and
// backward, sm80 and sm90) comes in a plain variant and an extras variant. The extras' state
// (sequence offsets, window bounds, keep bits, modifier values) is live across the main loops.
// Forward: the plain variant is dense, causal or not (needs_extras). Backward: the plain variant
// keeps varlen, windows and the deterministic order as run-time flags and only softcap, ALiBi and
// dropout are compiled out (needs_score_extras): with the backward split like the forward, varlen,
// windows and deterministic ran on the extras kernel (116 B of spills at sm_90a hd 128) at 0.67x,
// 0.70x and 0.78x of their speed on the plain kernel, while the plain call gained ~1%.
#pragma once

#include "params.h"

namespace flash {

#if defined(FLASH_ATTN_DISABLE_DROPOUT)
constexpr bool kDropoutCompiled = false;
#else
constexpr bool kDropoutCompiled = true;
#endif
#if defined(FLASH_ATTN_DISABLE_SOFTCAP)
constexpr bool kSoftcapCompiled = false;
#else
constexpr bool kSoftcapCompiled = true;
#endif
#if defined(FLASH_ATTN_DISABLE_ALIBI)
constexpr bool kAlibiCompiled = false;
#else
constexpr bool kAlibiCompiled = true;
#endif
#if defined(FLASH_ATTN_DISABLE_LOCAL)
constexpr bool kLocalCompiled = false;
#else
constexpr bool kLocalCompiled = true;
#endif
#if defined(FLASH_ATTN_DISABLE_VARLEN)
constexpr bool kVarlenCompiled = false;
#else
constexpr bool kVarlenCompiled = true;
#endif

// Whether a call needs the kernels' extras variants. Measured on H100 (benchmarks/NOTES.md v5): with
// every option compiled in and switched off at run time, the plain forward lost 2-28% against the
// kernels before the options existed; with the split, the forward is back within noise.
// needs_score_extras: the backward's extras (softcap, ALiBi, dropout); needs_extras: the forward's.
inline bool needs_score_extras(const FwdParams& p) {
  return p.dropout.keep_prob < 1.f || p.score_mod.softcap > 0.f || p.score_mod.alibi_slopes != nullptr;
}

inline bool needs_extras(const FwdParams& p) {
  return needs_score_extras(p) || p.varlen.cu_seqlens_q != nullptr || p.window.left >= 0 || p.window.right > 0;
}

}  // namespace flash
