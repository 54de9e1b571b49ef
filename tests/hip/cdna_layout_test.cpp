// Host check of the CDNA MFMA lane maps (csrc/flash/arch/cdna_layout.h) against the layouts in
// hip/AMD.md, which were checked against AMD's matrix instruction calculator (CDNA2 and CDNA3).
// The formulas below are transcribed from AMD.md, not from the header. Plain C++17:
//   g++ -std=c++17 -Wall -Wextra -Werror -I csrc tests/hip/cdna_layout_test.cpp -o cdna_layout_test
// Prints one line per failed check and "ALL OK" when every lane and register matches.
#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include "flash/arch/cdna_layout.h"

using flash::arch::cdna::Mfma16x16x16;
using flash::arch::cdna::Mfma32x32x8;
using flash::arch::cdna::TransposedView;

namespace {

int failures = 0;

void expect(bool ok, const char* shape, const char* what, int lane, int index) {
  if (ok) return;
  ++failures;
  std::printf("FAIL %s %s lane %d index %d\n", shape, what, lane, index);
}

// AMD.md, 32x32x8 (f16 / bf16_1k): A[L%32][4*(L/32)+j], B[4*(L/32)+j][L%32], j = 0..3;
// D[8*(r/4) + 4*(L/32) + r%4][L%32], r = 0..15.
struct Documented32x32x8 {
  static int a_row(int lane, int) { return lane % 32; }
  static int a_col(int lane, int j) { return 4 * (lane / 32) + j; }
  static int b_row(int lane, int j) { return 4 * (lane / 32) + j; }
  static int b_col(int lane, int) { return lane % 32; }
  static int acc_row(int lane, int r) { return 8 * (r / 4) + 4 * (lane / 32) + r % 4; }
  static int acc_col(int lane, int) { return lane % 32; }
};

// AMD.md, 16x16x16: A[L%16][4*(L/16)+j], B[4*(L/16)+j][L%16]; D[4*(L/16)+r][L%16], r = 0..3.
struct Documented16x16x16 {
  static int a_row(int lane, int) { return lane % 16; }
  static int a_col(int lane, int j) { return 4 * (lane / 16) + j; }
  static int b_row(int lane, int j) { return 4 * (lane / 16) + j; }
  static int b_col(int lane, int) { return lane % 16; }
  static int acc_row(int lane, int r) { return 4 * (lane / 16) + r; }
  static int acc_col(int lane, int) { return lane % 16; }
};

constexpr int kLanes = 64;
constexpr int kOperandValues = 4;

template <typename Shape, typename Documented>
void check_against_documentation(const char* name) {
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int j = 0; j < kOperandValues; ++j) {
      expect(Shape::a_row(lane, j) == Documented::a_row(lane, j), name, "A row", lane, j);
      expect(Shape::a_col(lane, j) == Documented::a_col(lane, j), name, "A col", lane, j);
      expect(Shape::b_row(lane, j) == Documented::b_row(lane, j), name, "B row", lane, j);
      expect(Shape::b_col(lane, j) == Documented::b_col(lane, j), name, "B col", lane, j);
    }
    for (int r = 0; r < Shape::kAccRegs; ++r) {
      expect(Shape::acc_row(lane, r) == Documented::acc_row(lane, r), name, "D row", lane, r);
      expect(Shape::acc_col(lane, r) == Documented::acc_col(lane, r), name, "D col", lane, r);
    }
  }
}

// Every element of a (rows x cols) matrix is held by exactly one (lane, index).
template <typename RowOf, typename ColOf>
void check_each_element_once(const char* name, const char* what, int rows, int cols, int per_lane, RowOf row_of,
                             ColOf col_of) {
  std::vector<int> owners(rows * cols, 0);
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < per_lane; ++i) {
      const int row = row_of(lane, i), col = col_of(lane, i);
      const bool inside = row >= 0 && row < rows && col >= 0 && col < cols;
      expect(inside, name, what, lane, i);
      if (inside) ++owners[row * cols + col];
    }
  for (int e = 0; e < rows * cols; ++e) expect(owners[e] == 1, name, what, -1, e);
}

template <typename Shape>
void check_ownership(const char* name) {
  check_each_element_once(name, "A element owned once", Shape::kM, Shape::kK, kOperandValues, Shape::a_row,
                          Shape::a_col);
  check_each_element_once(name, "B element owned once", Shape::kK, Shape::kN, kOperandValues, Shape::b_row,
                          Shape::b_col);
  check_each_element_once(name, "D element owned once", Shape::kM, Shape::kN, Shape::kAccRegs, Shape::acc_row,
                          Shape::acc_col);
}

// A lane's 4 operand values are 4 consecutive k of one row (A) or column (B): one 8-byte read from
// a k-contiguous tile.
template <typename Shape>
void check_operands_are_contiguous(const char* name) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int j = 0; j < kOperandValues; ++j) {
      expect(Shape::a_row(lane, j) == Shape::a_row(lane, 0) && Shape::a_col(lane, j) == Shape::a_col(lane, 0) + j, name,
             "A values consecutive in k", lane, j);
      expect(Shape::b_col(lane, j) == Shape::b_col(lane, 0) && Shape::b_row(lane, j) == Shape::b_row(lane, 0) + j, name,
             "B values consecutive in k", lane, j);
      expect(Shape::a_col(lane, 0) % kOperandValues == 0, name, "A read 8-byte aligned", lane, j);
    }
}

// Accumulator register r of an S^T tile (keys on rows) is B value acc_b_value(r) of k-step
// acc_b_step(r) of O^T = V^T.P^T (keys on k): P^T stays in registers.
template <typename Shape>
void check_accumulator_is_next_b_operand(const char* name) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int r = 0; r < Shape::kAccRegs; ++r) {
      const int step = Shape::acc_b_step(r), value = Shape::acc_b_value(r);
      expect(step >= 0 && step < Shape::kAccGroups && value >= 0 && value < kOperandValues, name,
             "acc -> B index in range", lane, r);
      expect(Shape::acc_row(lane, r) == step * Shape::kK + Shape::b_row(lane, value), name, "acc row = B k", lane, r);
      expect(Shape::acc_col(lane, r) == Shape::b_col(lane, value), name, "acc col = B col", lane, r);
    }
}

// The lanes holding one accumulator column are column_lane(col, g), and the xor-shuffles with
// masks kN, 2 kN, ... < 64 (column_max / column_sum) reach exactly them.
template <typename Shape>
void check_column_lanes(const char* name) {
  for (int lane = 0; lane < kLanes; ++lane) {
    std::set<int> same_column;
    for (int other = 0; other < kLanes; ++other)
      if (Shape::acc_col(other, 0) == Shape::acc_col(lane, 0)) same_column.insert(other);
    std::set<int> listed;
    for (int g = 0; g < Shape::kLaneGroups; ++g) listed.insert(Shape::column_lane(Shape::acc_col(lane, 0), g));
    expect(listed == same_column, name, "column_lane lists the column's lanes", lane, 0);
    std::set<int> reached = {lane};
    for (int mask = Shape::kN; mask < kLanes; mask *= 2) {
      std::set<int> next = reached;
      for (int l : reached) next.insert(l ^ mask);
      reached = next;
    }
    expect(reached == same_column, name, "xor masks reach the column's lanes", lane, 0);
  }
}

// The kernels' transposed view (cdna_gemm.cuh): register r of lane L holds C[acc_row][acc_col] =
// D[acc_col][acc_row] of the atom; one C row per lane, value j of its one row slot is register j;
// each C element is held once; the row leaders (L < kAtomM) hold each row once; acc_col is an
// even lane part plus a register part that never carries past a multiple of 8 or of 16, so a
// value's dropout key class (key % 8) / 2 and 16-key dropout tile are the lane's plus the
// register's (drop_probs_fwd_mapped).
template <typename Shape>
void check_transposed_view(const char* name) {
  using View = TransposedView<Shape>;
  constexpr int kDropoutTile = 16;
  for (int lane = 0; lane < kLanes; ++lane)
    for (int r = 0; r < View::kAccRegs; ++r) {
      const int lane_part = View::acc_col_lane_part(lane), register_part = View::acc_col_register_part(r);
      expect(View::acc_row(lane, r) == Shape::acc_col(lane, r), name, "view row = D column", lane, r);
      expect(View::acc_col(lane, r) == Shape::acc_row(lane, r), name, "view column = D row", lane, r);
      expect(View::acc_row(lane, r) == View::acc_row(lane, 0), name, "one view row per lane", lane, r);
      expect(View::acc_value(0, r) == r, name, "value j of the row is register j", lane, r);
      expect(View::acc_col(lane, r) == lane_part + register_part, name, "column = lane part + register part", lane, r);
      expect(lane_part % 2 == 0 && lane_part % 8 + register_part % 8 < 8, name, "no carry past a multiple of 8", lane,
             r);
      expect(lane_part % kDropoutTile + register_part % kDropoutTile < kDropoutTile, name,
             "no carry past a multiple of 16", lane, r);
      expect(View::kAtomN % kDropoutTile == 0, name, "whole dropout tiles per atom", lane, r);
      for (int atom = 0; atom < 2; ++atom) {
        const int key = atom * View::kAtomN + View::acc_col(lane, r);
        expect(key % 8 / 2 == lane_part % 8 / 2 + register_part % 8 / 2, name, "dropout key class", lane, r);
        expect(key / kDropoutTile == atom * View::kAtomN / kDropoutTile + lane_part / kDropoutTile +
                                         register_part / kDropoutTile,
               name, "dropout tile", lane, r);
      }
    }
  check_each_element_once(name, "view element owned once", View::kAtomM, View::kAtomN, View::kAccRegs, View::acc_row,
                          View::acc_col);
  std::vector<int> leaders(View::kAtomM, 0);
  for (int lane = 0; lane < kLanes; ++lane)
    if (View::is_row_leader(lane)) ++leaders[View::acc_row(lane, 0)];
  for (int row = 0; row < View::kAtomM; ++row) expect(leaders[row] == 1, name, "one row leader per row", -1, row);
}

template <typename Shape, typename Documented>
void check_shape(const char* name) {
  check_against_documentation<Shape, Documented>(name);
  check_ownership<Shape>(name);
  check_operands_are_contiguous<Shape>(name);
  check_accumulator_is_next_b_operand<Shape>(name);
  check_column_lanes<Shape>(name);
  check_transposed_view<Shape>(name);
}

// The maps are usable in constant expressions (tile configs, static_asserts).
static_assert(Mfma32x32x8::kAccRegs == 16 && Mfma32x32x8::kAccGroups == 4 && Mfma32x32x8::kLaneGroups == 2, "");
static_assert(Mfma16x16x16::kAccRegs == 4 && Mfma16x16x16::kAccGroups == 1 && Mfma16x16x16::kLaneGroups == 4, "");
static_assert(Mfma32x32x8::acc_row(37, 13) == 8 * 3 + 4 * 1 + 1 && Mfma32x32x8::acc_col(37, 13) == 5, "");
static_assert(Mfma16x16x16::acc_row(50, 2) == 4 * 3 + 2 && Mfma16x16x16::b_row(50, 1) == 13, "");

}  // namespace

int main() {
  check_shape<Mfma32x32x8, Documented32x32x8>("32x32x8");
  check_shape<Mfma16x16x16, Documented16x16x16>("16x16x16");
  if (failures != 0) {
    std::printf("%d checks failed\n", failures);
    return 1;
  }
  std::printf("ALL OK\n");
  return 0;
}
