// Compile-time feature switches. Every feature is a runtime flag of the kernels; a trimmed dev build
// can compile one out with FLASH_ATTN_DISABLE_{DROPOUT,SOFTCAP,ALIBI,LOCAL,VARLEN}=1 (setup.py turns
// them into these macros). The op layer then rejects calls that need it, naming the flag, and the
// tests skip them with the same reason.
//
// One compile-time split the kernels make on their own: the backward kernels come in a plain
// variant and a "score extras" variant (dropout, softcap or ALiBi on). The registers of the extras
// (keep bits, the modifier state) are live across the Hopper backward's wgmmas and raised its
// ptxas spills from 16 to 100 bytes per thread at hd 128 when compiled into one kernel, so the
// plain call keeps the kernel it had. The forwards showed no such cost (sm_90a hd 128: 0 bytes of
// spills with the extras compiled in) and stay single.
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

constexpr bool kScoreExtrasCompiled = kDropoutCompiled || kSoftcapCompiled || kAlibiCompiled;

// Whether a call needs the kernels' score-extras variant.
inline bool needs_score_extras(const FwdParams& p) {
  return p.dropout.keep_prob < 1.f || p.score_mod.softcap > 0.f || p.score_mod.alibi_slopes != nullptr;
}

}  // namespace flash
