// Host side of sm90_tma.cuh: builds the tensor map of a (batches, rows, heads, headdim) tensor of
// 16-bit elements for 64-column x box_rows boxes in the 128-byte swizzle. The driver's encoder is
// fetched through the runtime (no link against libcuda); where it is missing or refuses the tensor
// (strides and base must be 16-byte multiples, which the op already checks), the caller falls back
// to a kernel that needs no tensor map.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace flash {
namespace arch {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // the failed query leaves no error behind for the caller's launch check
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// Strides in elements (each a multiple of 8); batches == 1 may pass any batch stride.
struct RowTensor {
  const void* ptr;
  int64_t cols, rows, heads, batches;
  int64_t row_stride, head_stride, batch_stride;
};

// True when `map` now describes `t` with boxes of 64 columns x box_rows rows, 128-byte swizzled.
inline bool encode_swizzled_row_map(CUtensorMap* map, const RowTensor& t, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  constexpr int64_t kElementBytes = 2;
  const int64_t batch_stride = t.batches > 1 ? t.batch_stride : t.row_stride * t.rows;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.cols), static_cast<cuuint64_t>(t.rows),
                              static_cast<cuuint64_t>(t.heads), static_cast<cuuint64_t>(t.batches)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(t.row_stride * kElementBytes),
                                 static_cast<cuuint64_t>(t.head_stride * kElementBytes),
                                 static_cast<cuuint64_t>(batch_stride * kElementBytes)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(t.ptr), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS;
}

}  // namespace arch
}  // namespace flash
