// Compile-time feature switches. Every feature is a runtime flag of the kernels; a trimmed dev build
// can compile one out with FLASH_ATTN_DISABLE_{DROPOUT,SOFTCAP,ALIBI,LOCAL,VARLEN}=1 (setup.py turns
// them into these macros). The op layer then rejects calls that need it, naming the flag, and the
// tests skip them with the same reason.
//
// One compile-time split the kernels make on their own: every attention kernel (forward and
// backward, sm80 and sm90) comes in a plain variant and a score-extras variant (needs_score_extras:
// softcap, ALiBi, dropout), whose state (keep bits, modifier values) is live across the main loops.
// Varlen, windows and the deterministic order are run-time flags of both. The backward was split
// further once (varlen, windows and deterministic on the extras kernel: 116 B of spills at sm_90a
// hd 128, 0.67x, 0.70x and 0.78x of their speed on the plain kernel, the plain call ~1% faster),
// and so was the forward until v13 of benchmarks/NOTES.md: there an equal-length varlen batch ran
// 4.7% slower than the same dense batch, and with the sequence view and the window run-time in the
// plain forward ptxas spills less, not more (sm_90a bf16, warp-specialized hd 128: 20 -> 0 B, hd 64:
// 116 -> 52 B).
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

// Whether a call needs the kernels' score-extras variants. Measured on H100 (benchmarks/NOTES.md
// v5): with every option compiled in and switched off at run time, the plain forward lost 2-28%
// against the kernels before the options existed; with the split, the forward is back within noise.
inline bool needs_score_extras(const FwdParams& p) {
  return p.dropout.keep_prob < 1.f || p.score_mod.softcap > 0.f || p.score_mod.alibi_slopes != nullptr;
}

}  // namespace flash
