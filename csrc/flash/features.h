// Compile-time feature switches. Every feature is a runtime flag of the kernels; a trimmed dev build
// can compile one out with FLASH_ATTN_DISABLE_{DROPOUT,SOFTCAP,ALIBI,LOCAL,VARLEN}=1 (setup.py turns
// them into these macros). The op layer then rejects calls that need it, naming the flag, and the
// tests skip them with the same reason.
//
// One compile-time split the kernels make on their own: every attention kernel (forward and
// backward, sm80 and sm90) comes in a plain variant (dense, causal or not) and an extras variant
// (needs_extras below). The extras' state (sequence offsets, window bounds, keep bits, modifier
// values) is live across the main loops: compiled into one kernel and switched off at run time, it
// cost the plain call 2-28% (measured, see needs_extras), so the plain call keeps the code it had.
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

// Whether a call needs the attention kernels' extras variant (kExtras / kScoreExtras = true): varlen,
// a window other than plain causal, softcap, ALiBi or dropout (the backward adds the deterministic
// order). The plain variant compiles those out. Measured on H100 (benchmarks/NOTES.md v5): with
// them compiled in and switched off at run time, the plain forward lost 2-28% and the backward
// 4-11% against the kernels before the features existed.
inline bool needs_extras(const FwdParams& p) {
  return p.dropout.keep_prob < 1.f || p.score_mod.softcap > 0.f || p.score_mod.alibi_slopes != nullptr ||
         p.varlen.cu_seqlens_q != nullptr || p.window.left >= 0 || p.window.right > 0;
}

}  // namespace flash
