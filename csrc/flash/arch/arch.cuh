// Selects the arch layer. Kernels include this and call only `arch::` functions, so a port is a
// new arch file (AMD CDNA: MFMA, wave64, LDS) rather than a rewrite of the kernels.
#pragma once

#if defined(__HIP_PLATFORM_AMD__)
#include "cdna.cuh"
#include "cdna_mfma.cuh"
#else
#include "sm80.cuh"
#include "sm80_gemm.cuh"
#endif
