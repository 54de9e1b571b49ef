// Lane -> element maps of the CDNA (MI200 gfx90a, MI300 gfx942) MFMA atoms, wave64.
//
// Plain C++ (no HIP header needed) so that tests/hip/cdna_layout_test.cpp checks them with g++
// against the layouts in hip/AMD.md, which were checked against AMD's matrix instruction
// calculator for CDNA2 and CDNA3. With L the lane id (0..63):
//   32x32x8 (f16, bf16_1k):  A[L%32][4*(L/32)+j], B[4*(L/32)+j][L%32], j = 0..3;
//                            D (16 fp32) [8*(r/4) + 4*(L/32) + r%4][L%32], r = 0..15
//   16x16x16 (f16, bf16_1k): A[L%16][4*(L/16)+j], B[4*(L/16)+j][L%16];
//                            D (4 fp32) [4*(L/16) + r][L%16], r = 0..3
// Both shapes follow one rule: the lanes split into kLaneGroups = 64 / kM groups of kM; group
// g = L / kM holds 4 consecutive k of the operands and, for every block of 4 accumulator
// registers, 4 consecutive rows of D. A column of D (or of B) lives on one lane per group.
#pragma once

#if defined(__HIPCC__)
// clang's own spelling of __host__ __device__, so that this header needs no HIP header first
#define FLASH_CDNA_HOST_DEVICE __attribute__((host, device))
#else
#define FLASH_CDNA_HOST_DEVICE
#endif

namespace flash {
namespace arch {
namespace cdna {

constexpr int kWaveSize = 64;
constexpr int kValuesPerOperand = 4;  // 16-bit values per lane and operand: one 8-byte register pair

template <int kM_, int kK_>
struct MfmaShape {
  static constexpr int kM = kM_;  // rows of A and D
  static constexpr int kN = kM_;  // columns of B and D (both atoms are square)
  static constexpr int kK = kK_;
  static constexpr int kLaneGroups = kWaveSize / kM;
  static constexpr int kAccRegs = kM * kN / kWaveSize;  // fp32 accumulators per lane
  static constexpr int kAccGroups = kAccRegs / 4;       // blocks of 4 consecutive rows per lane
  static_assert(kK == kLaneGroups * kValuesPerOperand, "each lane group holds 4 consecutive k");
  static_assert(kAccGroups * kK == kM, "accumulator group t spans the k rows of step t of a next product");

  // Operand value j (0..3) of `lane`.
  FLASH_CDNA_HOST_DEVICE static constexpr int a_row(int lane, int) { return lane % kM; }
  FLASH_CDNA_HOST_DEVICE static constexpr int a_col(int lane, int j) { return kValuesPerOperand * (lane / kM) + j; }
  FLASH_CDNA_HOST_DEVICE static constexpr int b_row(int lane, int j) { return kValuesPerOperand * (lane / kM) + j; }
  FLASH_CDNA_HOST_DEVICE static constexpr int b_col(int lane, int) { return lane % kN; }

  // Accumulator register r (0..kAccRegs-1) of `lane`.
  FLASH_CDNA_HOST_DEVICE static constexpr int acc_row(int lane, int r) {
    return kLaneGroups * 4 * (r / 4) + 4 * (lane / kN) + r % 4;
  }
  FLASH_CDNA_HOST_DEVICE static constexpr int acc_col(int lane, int) { return lane % kN; }

  // The lane holding column `col` of D in lane group `group`: lanes col, col + kN, ... share a
  // column, so a column reduction is log2(kLaneGroups) xor-shuffles with masks kN, 2 kN, ...
  FLASH_CDNA_HOST_DEVICE static constexpr int column_lane(int col, int group) { return group * kN + col; }

  // In a product whose k index is the row index of this tile (S^T = K.Q^T has keys on rows;
  // O^T = V^T.P^T has keys on k), accumulator register r of a lane is value acc_b_value(r) of
  // the B operand of k-step acc_b_step(r), on the same lane: P^T never leaves its registers.
  FLASH_CDNA_HOST_DEVICE static constexpr int acc_b_step(int r) { return r / 4; }
  FLASH_CDNA_HOST_DEVICE static constexpr int acc_b_value(int r) { return r % 4; }
};

// v_mfma_f32_32x32x8{f16,bf16_1k} (gfx90a) / v_mfma_f32_32x32x8_{f16,bf16} (gfx942)
using Mfma32x32x8 = MfmaShape<32, 8>;
// v_mfma_f32_16x16x16{f16,bf16_1k} (gfx90a) / v_mfma_f32_16x16x16_{f16,bf16} (gfx942)
using Mfma16x16x16 = MfmaShape<16, 16>;

// The kernels' view of an atom whose product is computed transposed (cdna_gemm.cuh): C = A.B as
// C^T = B^T.A^T, so row m of C is accumulator column m. Register r of lane L holds
// C[acc_row(L, r)][acc_col(L, r)]: one row per lane (the same for every register, kAccRows = 1),
// its columns acc_col = acc_col_lane_part(L) + acc_col_register_part(r), where the lane part is
// even and a multiple of 4, and the register part is below 4 modulo 8 (no carry past a multiple of
// 8: the dropout definition's key classes, dropout.cuh). The lanes of one row are Shape's column
// lanes; the first group (L < kAtomM) holds every row once.
template <typename Shape>
struct TransposedView {
  static constexpr int kAtomM = Shape::kN;  // rows of C: accumulator columns
  static constexpr int kAtomN = Shape::kM;  // columns of C: accumulator rows
  static constexpr int kAtomK = Shape::kK;
  static constexpr int kAccRegs = Shape::kAccRegs;
  static constexpr int kAccRows = 1;
  static constexpr int kAccValuesPerRow = kAccRegs;

  FLASH_CDNA_HOST_DEVICE static constexpr int acc_row(int lane, int r) { return Shape::acc_col(lane, r); }
  FLASH_CDNA_HOST_DEVICE static constexpr int acc_col(int lane, int r) {
    return acc_col_lane_part(lane) + acc_col_register_part(r);
  }
  FLASH_CDNA_HOST_DEVICE static constexpr int acc_col_lane_part(int lane) { return 4 * (lane / Shape::kN); }
  FLASH_CDNA_HOST_DEVICE static constexpr int acc_col_register_part(int r) {
    return Shape::kLaneGroups * 4 * (r / 4) + r % 4;
  }
  // Value j of row slot h (the only one) is register j.
  FLASH_CDNA_HOST_DEVICE static constexpr int acc_value(int, int j) { return j; }
  FLASH_CDNA_HOST_DEVICE static constexpr bool is_row_leader(int lane) { return lane < kAtomM; }
};

}  // namespace cdna
}  // namespace arch
}  // namespace flash
