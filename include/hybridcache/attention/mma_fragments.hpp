// hybridcache/attention/mma_fragments.hpp
//
// One warp-wide tensor-core product, D = A B + C with A 16x16 and B 16x8 of 16-bit inputs
// (bf16 or fp16) and C, D 16x8 in fp32 — PTX's `mma.sync.aligned.m16n8k16.row.col` — written
// once for the device and for the host, so the kernel bodies that use it run under the CTA
// emulator too (kernel_context.hpp).
//
// Fragments. No lane holds a whole matrix: each of the 32 lanes holds a few elements in
// registers, at the positions the PTX ISA documents for m16n8k16 with .bf16/.f16 inputs
// ("Matrix Fragments for mma.m16n8k16 with floating point type"). With
// groupID = lane >> 2 and tig = lane % 4 (threadID_in_group):
//
//   A (16x16, row major)  4 registers, 2 elements each (a0..a7; the lower element in the low
//                         half): element e at row groupID + 8 [e in {2,3,6,7}],
//                         column 2 tig + (e & 1) + 8 [e >= 4].
//   B (16x8, "col")       2 registers (b0..b3): element e at row (k) 2 tig + (e & 1) + 8 [e >= 2],
//                         column groupID.
//   C, D (16x8, fp32)     4 floats (c0..c3): element e at row groupID + 8 [e >= 2],
//                         column 2 tig + (e & 1).
//
// `a_row`, `a_col`, `b_row`, `b_col`, `c_row`, `c_col` below are that table; the loaders
// and the stores use them, and tests/emulated/test_mma_fragments.cpp checks them against
// entries of the ISA's figures and a naive product.
//
// The product. On sm_80 and later `mma_m16n8k16` is the one PTX instruction. Elsewhere (the
// host, the CTA emulator, and any older device) it is emulated with the warp's shuffles in
// the same layout: lane (groupID, tig) needs rows groupID and groupID + 8 of A, which lanes
// 4 groupID .. 4 groupID + 3 hold (all four of their registers: 16 shuffles), and columns
// 2 tig and 2 tig + 1 of B, which lanes 4 (2 tig) + j and 4 (2 tig + 1) + j hold (two
// registers each: 16 shuffles). A lane mapping that disagrees with the loaders therefore
// gives a wrong product, which is what the fragment test catches. Every lane of the warp must
// call it (a warp collective, as the instruction is).
//
// Precision: the products of two bf16 (8-bit significands) or fp16 (11-bit) numbers are exact
// in fp32; the emulation adds them to C in k order, rounding once per product (fma). The
// tensor core adds its 16 products with its own order and internal width (unspecified by the
// ISA), so the device and the emulation agree to a few fp32 ulps of the row's magnitude, not
// bit for bit; both are fp32 sums of exact products.
//
// Cost: device, one instruction (m16n8k16: 4096 multiply-adds per warp); emulation, 32
// shuffles and 64 fma per lane.
#pragma once

#include <cstdint>
#include <type_traits>

#include "hybridcache/core/config.hpp"
#include "hybridcache/attention/linear_attention_common.hpp"
#include "hybridcache/attention/numeric.hpp"

namespace hybridcache::attention {

/// Shape of one tensor-core product: D (m x n) = A (m x k) B (k x n) + C.
struct mma_shape {
  static constexpr int m = 16;
  static constexpr int n = 8;
  static constexpr int k = 16;
};

/// True for the input types the tensor-core product takes (bf16, fp16).
template <class T>
inline constexpr bool is_mma_input_v = std::is_same_v<T, bfloat16_t> || std::is_same_v<T, half_t>;

/// A lane's part of A: 8 16-bit elements in 4 registers.
struct mma_fragment_a {
  std::uint32_t r[4] = {};
};
/// A lane's part of B: 4 16-bit elements in 2 registers.
struct mma_fragment_b {
  std::uint32_t r[2] = {};
};
/// A lane's part of C or D: 4 floats.
struct mma_fragment_c {
  float x[4] = {};
};

// ---- the PTX ISA's lane/fragment mapping (m16n8k16, 16-bit A/B, fp32 C/D) ----------------

/// Row of A element `e` (0..7) of lane `lane`.
HYBRIDCACHE_HD_INLINE constexpr int a_row(int lane, int e) { return (lane >> 2) + ((e & 2) != 0 ? 8 : 0); }
/// Column of A element `e` of lane `lane`.
HYBRIDCACHE_HD_INLINE constexpr int a_col(int lane, int e) { return 2 * (lane & 3) + (e & 1) + (e >= 4 ? 8 : 0); }
/// Row (the k index) of B element `e` (0..3) of lane `lane`.
HYBRIDCACHE_HD_INLINE constexpr int b_row(int lane, int e) { return 2 * (lane & 3) + (e & 1) + (e >= 2 ? 8 : 0); }
/// Column of B element `e` of lane `lane`.
HYBRIDCACHE_HD_INLINE constexpr int b_col(int lane, int) { return lane >> 2; }
/// Row of C/D element `e` (0..3) of lane `lane`.
HYBRIDCACHE_HD_INLINE constexpr int c_row(int lane, int e) { return (lane >> 2) + (e >= 2 ? 8 : 0); }
/// Column of C/D element `e` of lane `lane`.
HYBRIDCACHE_HD_INLINE constexpr int c_col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }

// ---- packing ------------------------------------------------------------------------------

/// Two 16-bit elements in one register, `lo` in the low half (as the fragments hold them).
template <class T>
HYBRIDCACHE_HD_INLINE constexpr std::uint32_t mma_pack(T lo, T hi) {
  return static_cast<std::uint32_t>(lo.bits) | (static_cast<std::uint32_t>(hi.bits) << 16);
}
/// Element `half` (0: low, 1: high) of a packed register, widened to fp32.
template <class T>
HYBRIDCACHE_HD_INLINE float mma_unpack(std::uint32_t reg, int half) {
  return to_float(T{static_cast<std::uint16_t>(half != 0 ? reg >> 16 : reg & 0xFFFFu)});
}

/// Elements p[0], p[1] of a 16-bit array as one register; `p` is 4-byte aligned (an even
/// element of a row whose stride is even). One 32-bit load on the device.
template <class T>
HYBRIDCACHE_HD_INLINE std::uint32_t load_pair(const T* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const std::uint32_t*>(p);
#else
  return mma_pack(p[0], p[1]);
#endif
}

/// Elements (r, c) and (r, c + 1) of a row-major matrix `m` with row stride `ld` (even) into
/// `reg`, which holds 0 beforehand: those in rows >= `rows` or columns >= `cols` stay 0 and are
/// not read (the memory past them may hold anything). One 32-bit load on the device when both
/// are in. (Assigning only what is in keeps the loaders' register use as it was.)
template <class T>
HYBRIDCACHE_HD_INLINE void load_pair_bounded(std::uint32_t& reg, const T* m, int ld, int r, int c, int rows, int cols) {
  if (r < rows && c + 1 < cols) {
    reg = load_pair(m + static_cast<std::int64_t>(r) * ld + c);
  } else if (r < rows && c < cols) {
    reg = mma_pack(m[static_cast<std::int64_t>(r) * ld + c], T{});
  }
}

/// Lane `lane`'s A fragment of the 16x16 tile at (row0, col0) of a row-major matrix `m` with
/// row stride `ld` (even) elements; rows >= `rows` and columns >= `cols` read as 0 (and are
/// not read: the memory past them may hold anything).
template <class T>
HYBRIDCACHE_HD_INLINE mma_fragment_a load_fragment_a(const T* m, int ld, int row0, int col0, int rows, int cols,
                                                     int lane) {
  mma_fragment_a f;
  HYBRIDCACHE_UNROLL
  for (int reg = 0; reg < 4; ++reg)
    load_pair_bounded(f.r[reg], m, ld, row0 + a_row(lane, 2 * reg), col0 + a_col(lane, 2 * reg), rows, cols);
  return f;
}

/// Lane `lane`'s B fragment of the 16x8 tile B[k][n] = m[col0 + n][row0 + k]: B is the
/// transpose of the row-major rows [col0, col0 + 8) of `m` (B's "col" layout is m's rows), so
/// K^T needs no transposed copy. Rows of `m` >= `rows` and elements >= `cols` read as 0.
template <class T>
HYBRIDCACHE_HD_INLINE mma_fragment_b load_fragment_b_t(const T* m, int ld, int row0, int col0, int rows, int cols,
                                                       int lane) {
  mma_fragment_b f;
  HYBRIDCACHE_UNROLL
  for (int reg = 0; reg < 2; ++reg)  // B's column n is m's row, B's row k m's column
    load_pair_bounded(f.r[reg], m, ld, col0 + b_col(lane, 2 * reg), row0 + b_row(lane, 2 * reg), rows, cols);
  return f;
}

/// x0, x1 as bf16 pairs hi = (bf16(x0), bf16(x1)) and lo = the rounded remainders.
HYBRIDCACHE_HD_INLINE void split_pair(float x0, float x1, std::uint32_t& hi, std::uint32_t& lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // The same round-to-nearest-even as from_float (finite values), two per instruction.
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x1), "f"(x0));
  const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xFFFF0000u);
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(x1 - h1), "f"(x0 - h0));
#else
  const bfloat16_t h0 = from_float<bfloat16_t>(x0), h1 = from_float<bfloat16_t>(x1);
  hi = mma_pack(h0, h1);
  lo = mma_pack(from_float<bfloat16_t>(x0 - to_float(h0)), from_float<bfloat16_t>(x1 - to_float(h1)));
#endif
}

/// Lane `lane`'s A fragments (bf16 hi and lo, as `split_pair`) of the 16x16 tile at (row0,
/// col0) of the lower triangle (diagonal included) of a row-major fp32 matrix `m` with row
/// stride `ld`: elements above the diagonal, in rows >= `n` or in columns >= `n` read as 0
/// (and are not read).
HYBRIDCACHE_HD_INLINE void load_fragment_a_lower_split(const float* m, int ld, int row0, int col0, int n, int lane,
                                                       mma_fragment_a& hi, mma_fragment_a& lo) {
  HYBRIDCACHE_UNROLL
  for (int reg = 0; reg < 4; ++reg) {
    const int r = row0 + a_row(lane, 2 * reg), c = col0 + a_col(lane, 2 * reg);
    const float* row = m + static_cast<std::int64_t>(r) * ld;
    const float x0 = r < n && c <= r ? row[c] : 0.0f;
    const float x1 = r < n && c + 1 <= r ? row[c + 1] : 0.0f;
    split_pair(x0, x1, hi.r[reg], lo.r[reg]);
  }
}

/// `load_fragment_b_t` of an fp32 matrix split into two bf16 fragments, `hi` = bf16(x) and
/// `lo` = bf16(x - hi): hi + lo carries 16 of fp32's 24 significand bits (bf16 keeps 8, lo
/// the next 8: relative error <= 2^-16), so two products against bf16 A recover an fp32 B to
/// that error — how the state enters the tensor-core products without being rounded to bf16.
HYBRIDCACHE_HD_INLINE void load_fragment_b_t_split(const float* m, int ld, int row0, int col0, int rows, int cols,
                                                   int lane, mma_fragment_b& hi, mma_fragment_b& lo) {
  HYBRIDCACHE_UNROLL
  for (int reg = 0; reg < 2; ++reg) {
    const int n = col0 + b_col(lane, 2 * reg), k = row0 + b_row(lane, 2 * reg);
    const float* row = m + static_cast<std::int64_t>(n) * ld;
    const float x0 = n < rows && k < cols ? row[k] : 0.0f;
    const float x1 = n < rows && k + 1 < cols ? row[k + 1] : 0.0f;
    split_pair(x0, x1, hi.r[reg], lo.r[reg]);
  }
}

namespace detail {

/// The product on the warp's shuffles (host, emulator, devices before sm_80); see the header.
template <class T, class Ctx>
HYBRIDCACHE_HD_INLINE void mma_m16n8k16_shuffled(const Ctx& ctx, mma_fragment_c& d, const mma_fragment_a& a,
                                                 const mma_fragment_b& b) {
  const int lane = ctx.lane_id(), group = lane >> 2, tig = lane & 3;
  // Rows group and group + 8 of A: arow[h][k] (h = 0: row group, 1: row group + 8).
  float arow[2][16];
  HYBRIDCACHE_UNROLL
  for (int j = 0; j < 4; ++j)
    HYBRIDCACHE_UNROLL
    for (int reg = 0; reg < 4; ++reg) {
      const std::uint32_t x = ctx.shfl(a.r[reg], 4 * group + j);
      // Register reg of lane (group, j) holds elements 2 reg, 2 reg + 1.
      const int h = a_row(j, 2 * reg) >= 8 ? 1 : 0, k = a_col(j, 2 * reg);
      arow[h][k] = mma_unpack<T>(x, 0);
      arow[h][k + 1] = mma_unpack<T>(x, 1);
    }
  // Columns 2 tig and 2 tig + 1 of B: bcol[h][k].
  float bcol[2][16];
  HYBRIDCACHE_UNROLL
  for (int h = 0; h < 2; ++h)
    HYBRIDCACHE_UNROLL
    for (int j = 0; j < 4; ++j)
      HYBRIDCACHE_UNROLL
      for (int reg = 0; reg < 2; ++reg) {
        const std::uint32_t x = ctx.shfl(b.r[reg], 4 * (2 * tig + h) + j);
        const int k = b_row(j, 2 * reg);
        bcol[h][k] = mma_unpack<T>(x, 0);
        bcol[h][k + 1] = mma_unpack<T>(x, 1);
      }
  HYBRIDCACHE_UNROLL
  for (int e = 0; e < 4; ++e) {
    const float* ar = arow[e >= 2 ? 1 : 0];
    const float* bc = bcol[e & 1];
    float acc = d.x[e];
    for (int k = 0; k < 16; ++k) acc = fma_rn(ar[k], bc[k], acc);
    d.x[e] = acc;
  }
}

}  // namespace detail

/// d = a b + d over the warp (every lane calls it with its fragments; see the header).
/// `T` is the input type: bfloat16_t or half_t.
template <class T, class Ctx>
HYBRIDCACHE_HD_INLINE void mma_m16n8k16(const Ctx& ctx, mma_fragment_c& d, const mma_fragment_a& a,
                                        const mma_fragment_b& b) {
  static_assert(is_mma_input_v<T>, "mma_m16n8k16: T must be bfloat16_t or half_t");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  (void)ctx;
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  }
#else
  detail::mma_m16n8k16_shuffled<T>(ctx, d, a, b);
#endif
}

}  // namespace hybridcache::attention
