// hybridcache/attention/chunk_programs.hpp
//
// The chunkwise form (UT transform) as two programs, the way flash-linear-attention's chunk
// kernels split it:
//
//   chunk_prepare_program  the intra-chunk part of ONE chunk, independent of the state: the
//                          prefixes of its log decays, the q/k normalisation factors,
//                          A = strictLower(diag(beta)(Gamma ⊙ K K^T)), T = (I + A)^{-1}
//                          diag(beta), P = (Q K^T) ⊙ Gamma. Every chunk of every sequence is
//                          prepared at once (one CTA each); results go to `chunk_tables`.
//   chunk_scan_program     the sequential state pass over the chunks of one sequence, for a
//                          block of value columns (columns are independent): per chunk
//                          U = T (V - diag(gamma) K S), O = diag(gamma) Q S + P U, then the
//                          state is rolled forward token by token with the known U (the
//                          closed-loop exact fold), writing checkpoints at any position.
//
// Both are phase functions over (thread, thread count) or over a cooperative group; the
// kernels (kernel_bodies.hpp) run them with a CTA and __syncthreads between phases, the host
// drivers (linear_attention_forms.hpp) with one thread, so the host tests run the kernels'
// arithmetic. Shared-memory rows have odd word strides (`padded_stride`): a warp whose lanes
// read one element of 32 rows hits 32 banks; the static_asserts at the end count the banks
// of every shared access of the triangular mat-vecs (<= 2-way).
//
// Tensor cores (`chunk_math`, mma_fragments.hpp): with 16-bit inputs K K^T and Q K^T (prepare,
// `gram_tiles`) and, for bf16, K S and Q S (scan, `products`; the fp32 state as bf16 hi + lo)
// are warp-wide m16n8k16 products with fp32 sums; the rest (the solve, T w, P u, the fold)
// stays in fp32 FMAs. The host drivers run the fp32 path (one thread has no warp); the CTA
// emulator runs the tensor-core path with emulated fragments.
//
// Costs per chunk of C tokens and d = d_k = d_v: prepare O(C^2 d + C^3); scan O(C d^2 + C^2 d)
// per head. Decays enter only as exp of differences of prefix sums within a reset-free span,
// so g = -inf (alpha = 0) resets the state exactly and gates down to -70 per token never
// divide underflowed products.
#pragma once

#include <cstdint>
#include <type_traits>

#include "hybridcache/core/config.hpp"
#include "hybridcache/attention/kernel_context.hpp"
#include "hybridcache/attention/linear_attention_common.hpp"
#include "hybridcache/attention/mma_fragments.hpp"

namespace hybridcache::attention {

/// How chunked prefill computes its chunk products: K K^T and Q K^T (chunk_prepare), K S and
/// Q S (chunk_scan, bf16 inputs). The choice is per call (`prefill_io::math`);
/// docs/linear-attention.md gives each path's error against the fp64 recurrence.
enum class chunk_math : unsigned char {
  /// 16-bit inputs on tensor cores (`mma.sync` m16n8k16: exact products, fp32 sums; the fp32
  /// state enters K S and Q S as two bf16 parts, hi + lo); fp32 inputs: as `fp32` (no
  /// tensor-core path takes fp32 inputs).
  tensor_cores,
  /// fp32 FMAs on CUDA cores for every input type (inputs widened exactly to fp32).
  fp32,
};

/// Whether a prefill with inputs `In` and `math` runs the Gram products on tensor cores.
template <class In>
HYBRIDCACHE_HD_INLINE constexpr bool gram_on_tensor_cores(chunk_math math) {
  return is_mma_input_v<In> && math == chunk_math::tensor_cores;
}

/// Read-only view of one head's token sequence. Token t's vectors start at `q + t*q_stride`
/// etc. (strides in elements, so [T][H][D] tensors are viewed without copies).
template <class In>
struct head_input {
  static_assert(is_io_type_v<In>, "head_input: In must be float, half_t or bfloat16_t");
  const In* q = nullptr;
  const In* k = nullptr;
  const In* v = nullptr;
  std::int64_t q_stride = 0;
  std::int64_t k_stride = 0;
  std::int64_t v_stride = 0;
  const float* log_decay = nullptr;  ///< g_t <= 0 (alpha = exp(g)); -inf resets; nullptr: no decay
  std::int64_t decay_stride = 0;
  const float* beta = nullptr;  ///< delta rule write strength; unused by linear_rule
  std::int64_t beta_stride = 0;
  int length = 0;

  HYBRIDCACHE_HD_INLINE const In* q_at(int t) const { return q + t * q_stride; }
  HYBRIDCACHE_HD_INLINE const In* k_at(int t) const { return k + t * k_stride; }
  HYBRIDCACHE_HD_INLINE float v_at(int t, int c) const { return to_float(v[t * v_stride + c]); }
  HYBRIDCACHE_HD_INLINE float g_at(int t) const { return log_decay ? log_decay[t * decay_stride] : 0.0f; }
  HYBRIDCACHE_HD_INLINE float beta_at(int t) const { return beta ? beta[t * beta_stride] : 1.0f; }
};

/// Where one head's outputs go: o_t[c] at `o + t*stride + c`; optionally the value each token
/// adds to the state, u_t[c] (delta rule: the corrected delta; linear: v), at
/// `u + t*u_stride + c` — what a KV-only request buffers after its prefill.
template <class Out>
struct head_output {
  Out* o = nullptr;
  std::int64_t stride = 0;
  float* u = nullptr;
  std::int64_t u_stride = 0;
};

/// Where one head's checkpoints go: the state after `positions[i]` tokens (absolute
/// positions, ascending) is written to `states + i*state_stride` in the state's layout.
struct checkpoint_sink {
  const std::int64_t* positions = nullptr;
  int count = 0;
  float* states = nullptr;
  std::int64_t state_stride = 0;
};

/// Tokens of the chunk that starts at token `t` of a sequence of `length` tokens whose token
/// 0 sits at absolute position `start`: chunks are aligned to absolute multiples of `chunk`,
/// so the first one is shorter when `start` is not aligned.
HYBRIDCACHE_HD_INLINE int aligned_chunk_len(std::int64_t start, int t, int length, int chunk) {
  const std::int64_t abs = start + t;
  const std::int64_t to_boundary = (abs / chunk + 1) * chunk - abs;
  const std::int64_t left = length - t;
  return static_cast<int>(left < to_boundary ? left : to_boundary);
}

/// Number of (aligned) chunks of a sequence.
HYBRIDCACHE_HD_INLINE int chunk_count(std::int64_t start, int length, int chunk) {
  if (length <= 0) return 0;
  const int first = aligned_chunk_len(start, 0, length, chunk);
  return 1 + (length - first + chunk - 1) / chunk;
}

/// First token of chunk `i` of a sequence.
HYBRIDCACHE_HD_INLINE int chunk_first_token(std::int64_t start, int length, int chunk, int i) {
  return i == 0 ? 0 : aligned_chunk_len(start, 0, length, chunk) + (i - 1) * chunk;
}

/// What the prepare phase leaves for the scan, per (chunk, value head): prefixes of the log
/// decays (cum, seg), the k and q factors, T and P (rows of `stride` floats). One contiguous
/// block of `floats(C)` floats, the same layout in shared and in global memory.
struct chunk_tables {
  float* cum = nullptr;
  float* seg = nullptr;
  float* kfac = nullptr;
  float* qfac = nullptr;
  float* t = nullptr;
  float* p = nullptr;
  int stride = 0;

  HYBRIDCACHE_HD_INLINE static constexpr int stride_for(int c) { return padded_stride(c, 4); }
  HYBRIDCACHE_HD_INLINE static constexpr std::int64_t floats(int c) {
    return 4 * static_cast<std::int64_t>(c) + 2 * static_cast<std::int64_t>(c) * stride_for(c);
  }
  HYBRIDCACHE_HD_INLINE static chunk_tables at(float* base, int c) {
    chunk_tables tb;
    tb.stride = stride_for(c);
    tb.cum = base;
    tb.seg = base + c;
    tb.kfac = base + 2 * c;
    tb.qfac = base + 3 * c;
    tb.t = base + 4 * c;
    tb.p = tb.t + static_cast<std::int64_t>(c) * tb.stride;
    return tb;
  }
};

/// The intra-chunk phases of one chunk [t0, t0 + len) of `in` (capacity C >= len). Phases,
/// in order, a barrier between them: `stage` (threads) with `decays` (one group), `gram` and
/// `weights` (a warp per row, lanes over columns), `solve` (a thread per column),
/// `export_tables` (threads).
template <class Rule, int DK, class In>
struct chunk_prepare_program {
  static constexpr int key_stride = padded_stride(DK, sizeof(In));

  head_input<In> in;
  qk_options opt;
  int t0 = 0;
  int len = 0;
  int capacity = 0;
  In* kraw = nullptr;  ///< [C][key_stride] raw keys of the chunk (until `gram` ends)
  In* qraw = nullptr;  ///< [C][key_stride] raw queries (until `gram` ends)
  float* beta = nullptr;
  float* a = nullptr;  ///< [C][stride] A, from `weights` on: the bytes of kraw and qraw
  chunk_tables tab{};  ///< tab.t holds the raw K K^T from `gram` to `weights`, then T

  /// The raw keys and queries are read only by `gram`; the raw K K^T waits in T's rows (the
  /// solve writes T after `weights` has read it) and A is written over the raw keys and
  /// queries (dead by then): one C x C float matrix less than three separate arrays.
  HYBRIDCACHE_HD_INLINE void carve(workspace_carver& w) {
    const std::size_t raw_bytes = (static_cast<std::size_t>(capacity) * key_stride * sizeof(In) + 15) / 16 * 16;
    const std::size_t a_bytes = static_cast<std::size_t>(capacity) * chunk_tables::stride_for(capacity) * sizeof(float);
    std::byte* shared = w.take<std::byte>(static_cast<std::int64_t>(2 * raw_bytes > a_bytes ? 2 * raw_bytes : a_bytes));
    kraw = shared != nullptr ? reinterpret_cast<In*>(shared) : nullptr;
    qraw = shared != nullptr ? reinterpret_cast<In*>(shared + raw_bytes) : nullptr;
    a = shared != nullptr ? reinterpret_cast<float*>(shared) : nullptr;
    beta = w.take<float>(capacity);
    float* t = w.take<float>(chunk_tables::floats(capacity));
    if (t != nullptr) tab = chunk_tables::at(t, capacity);
  }
  /// Bytes of workspace (shared memory) for chunk capacity `c`.
  HYBRIDCACHE_HD_INLINE static std::size_t workspace_bytes(int c) {
    chunk_prepare_program p;
    p.capacity = c;
    return carved_bytes(p);
  }

  HYBRIDCACHE_HD_INLINE void stage(int tid, int nthreads) const {
    for (int x = tid; x < len * DK; x += nthreads) {
      const int r = x / DK, i = x % DK;
      kraw[r * key_stride + i] = in.k_at(t0 + r)[i];
      qraw[r * key_stride + i] = in.q_at(t0 + r)[i];
    }
  }
  template <class Group>
  HYBRIDCACHE_HD_INLINE void decays(const Group& g) const {
    scan_log_decays(len, [&](int j) { return in.g_at(t0 + j); }, tab.cum, tab.seg, g);
    for (int j = g.rank(); j < len; j += Group::size) beta[j] = in.beta_at(t0 + j);
  }
  /// Rows r = row0, row0 + row_step, ... (a warp each), lanes over j <= r (lane, lane + lanes,
  /// ...): raw k_r.k_j (j < r, into T's rows), q_r.k_j (j <= r, into P), and at j = r the norms.
  /// k_j rows of 32 lanes sit in 32 banks; k_r and q_r are broadcasts.
  HYBRIDCACHE_HD_INLINE void gram(int row0, int row_step, int lane, int lanes) const {
    const int ts = tab.stride;
    for (int r = row0; r < len; r += row_step) {
      const In* kr = kraw + r * key_stride;
      const In* qr = qraw + r * key_stride;
      for (int j = lane; j <= r; j += lanes) {  // Gram entries
        const In* kj = kraw + j * key_stride;
        float kk = 0.0f, qk = 0.0f;
        for (int i = 0; i < DK; ++i) {
          const float kji = to_float(kj[i]);
          kk = fma_rn(to_float(kr[i]), kji, kk);
          qk = fma_rn(to_float(qr[i]), kji, qk);
        }
        tab.p[r * ts + j] = qk;
        if (j < r) {
          tab.t[r * ts + j] = kk;
        } else {
          float qq = 0.0f;
          for (int i = 0; i < DK; ++i) qq = fma_rn(to_float(qr[i]), to_float(qr[i]), qq);
          tab.kfac[r] = prep_factor(kk, opt.l2_normalize, 1.0f, opt.eps);
          tab.qfac[r] = prep_factor(qq, opt.l2_normalize, opt.scale, opt.eps);
        }
      }
    }
  }
  /// The raw Gram products of `gram` on tensor cores (16-bit inputs; mma_fragments.hpp): the
  /// 16x8 tiles of K K^T and Q K^T that touch the lower triangle, a warp per tile (tiles
  /// `warp`, `warp + warps`, ...), DK / 16 products per tile and matrix, both matrices sharing
  /// the K^T fragment. Rows past `len` and key elements past DK enter as zeros; only j <= r is
  /// stored. The norms are `norms`' (run in the same phase).
  template <class Ctx>
  HYBRIDCACHE_HD_INLINE void gram_tiles(const Ctx& ctx, int warp, int warps) const {
    static_assert(is_mma_input_v<In>, "gram_tiles: 16-bit inputs only");
    const int lane = ctx.lane_id(), ts = tab.stride;
    const int row_tiles = (len + mma_shape::m - 1) / mma_shape::m;
    // Row tile mt has 2 mt + 2 column tiles of 8 that reach its lower triangle.
    for (int tile = warp, mt = 0, first = 0; tile < row_tiles * (row_tiles + 1); tile += warps) {
      while (first + 2 * mt + 2 <= tile) first += 2 * mt + 2, ++mt;
      const int r0 = mma_shape::m * mt, n0 = mma_shape::n * (tile - first);
      if (n0 >= len) continue;  // the same for every lane of the warp
      mma_fragment_c kk, qk;
      for (int k0 = 0; k0 < DK; k0 += mma_shape::k) {
        const mma_fragment_b kt = load_fragment_b_t(kraw, key_stride, k0, n0, len, DK, lane);
        mma_m16n8k16<In>(ctx, kk, load_fragment_a(kraw, key_stride, r0, k0, len, DK, lane), kt);
        mma_m16n8k16<In>(ctx, qk, load_fragment_a(qraw, key_stride, r0, k0, len, DK, lane), kt);
      }
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + c_row(lane, e), j = n0 + c_col(lane, e);
        if (r >= len || j > r) continue;
        tab.p[r * ts + j] = qk.x[e];
        if (j < r) tab.t[r * ts + j] = kk.x[e];
      }
    }
  }
  /// The k and q factors of rows row0, row0 + row_step, ... (a group each: fp32 sums of
  /// squares over the group's slices), for `gram_tiles`.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void norms(int row0, int row_step, const Group& g) const {
    for (int r = row0; r < len; r += row_step) {
      const float kk = group_sum_sq<DK>(kraw + r * key_stride, g);
      const float qq = group_sum_sq<DK>(qraw + r * key_stride, g);
      if (g.rank() == 0) {
        tab.kfac[r] = prep_factor(kk, opt.l2_normalize, 1.0f, opt.eps);
        tab.qfac[r] = prep_factor(qq, opt.l2_normalize, opt.scale, opt.eps);
      }
    }
  }
  /// Same rows and lanes: A = beta_r Gamma_rj k_r.k_j (factors applied), P = Gamma_rj q_r.k_j.
  HYBRIDCACHE_HD_INLINE void weights(int row0, int row_step, int lane, int lanes) const {
    const int ts = tab.stride;
    for (int r = row0; r < len; r += row_step) {
      const decay_prefix pr = prefix_at(tab.cum, tab.seg, r);
      for (int j = lane; j <= r; j += lanes) {
        const float dec = decay_between(pr, tab.cum[j], j);
        tab.p[r * ts + j] = dec * tab.p[r * ts + j] * tab.qfac[r] * tab.kfac[j];
        if (j < r) a[r * ts + j] = beta[r] * dec * tab.t[r * ts + j] * tab.kfac[r] * tab.kfac[j];
      }
    }
  }
  /// Columns c (one per thread) of T: T[r][c] = beta_r [r == c] - sum_{c <= j < r} A[r][j] T[j][c]
  /// (the j loop is the same for every lane: A[r][j] is a broadcast, T[j][c] consecutive).
  HYBRIDCACHE_HD_INLINE void solve(int tid, int nthreads) const {
    if constexpr (Rule::delta) {
      const int ts = tab.stride;
      for (int c = tid; c < len; c += nthreads)
        for (int r = 0; r < len; ++r) {
          float x = r == c ? beta[r] : 0.0f;
          for (int j = 0; j < r; ++j)
            if (j >= c) x = fma_rn(-a[r * ts + j], tab.t[j * ts + c], x);
          tab.t[r * ts + c] = r < c ? 0.0f : x;
        }
    }
  }
  HYBRIDCACHE_HD_INLINE void export_tables(float* dst, int tid, int nthreads) const {
    for (std::int64_t x = tid; x < chunk_tables::floats(capacity); x += nthreads) dst[x] = tab.cum[x];
  }
};

/// The state pass of one sequence and value head over its chunks, for value columns
/// [col_begin, col_end): `load_columns` (groups), then per chunk `select_chunk` + `stage`
/// (threads) and `columns` (groups), then `store_columns` (groups). The columns' states live
/// in the workspace between chunks.
template <class Rule, class State, class In, class Out>
struct chunk_scan_program {
  static constexpr int DK = State::key_dim;
  static constexpr int DV = State::value_dim;
  static constexpr int key_stride = padded_stride(DK, sizeof(In));
  /// Value columns per CTA: a CTA per (sequence, value head, 8 columns) — one 8-wide column
  /// tile of the tensor-core products, and twice the CTAs of 16 (Qwen3-Next, 1 x 8192 tokens:
  /// 512 CTAs, about two waves of 2 CTAs per SM on 132 SMs, where 16 gave 0.97).
  static constexpr int block_columns = 8;

  head_input<In> in;
  head_output<Out> out;
  State state;
  checkpoint_sink ck;
  std::int64_t start = 0;  ///< absolute position of token 0 of `in`
  int chunk = 0;           ///< C
  const float* tables = nullptr;  ///< chunk_tables of chunk 0; chunk i at tables + i * table_stride
  std::int64_t table_stride = 0;
  int col_begin = 0;
  int col_end = 0;
  int t0 = 0;
  int len = 0;
  /// How K S and Q S are computed (`prefill_io::math`; the host driver keeps fp32).
  chunk_math math = chunk_math::fp32;

  In* kraw = nullptr;  ///< [C][key_stride] this chunk's raw keys
  In* qraw = nullptr;
  float* alpha = nullptr;  ///< [C] exp(g)
  chunk_tables tab{};
  float* cols = nullptr;     ///< [block_columns][DK] the columns' states
  float* dots = nullptr;  ///< [2][block_columns][C]: k_r . s_c (then w_r), q_r . s_c (then gamma_r q_r . s_c)
  float* ubuf = nullptr;  ///< [block_columns][C]: the chunk's U columns

  HYBRIDCACHE_HD_INLINE void carve(workspace_carver& w) {
    kraw = w.take<In>(static_cast<std::int64_t>(chunk) * key_stride);
    qraw = w.take<In>(static_cast<std::int64_t>(chunk) * key_stride);
    alpha = w.take<float>(chunk);
    float* t = w.take<float>(chunk_tables::floats(chunk));
    if (t != nullptr) tab = chunk_tables::at(t, chunk);
    cols = w.take<float>(static_cast<std::int64_t>(block_columns) * DK);
    dots = w.take<float>(2 * static_cast<std::int64_t>(block_columns) * chunk);
    ubuf = w.take<float>(static_cast<std::int64_t>(block_columns) * chunk);
  }
  HYBRIDCACHE_HD_INLINE static std::size_t workspace_bytes(int c) {
    chunk_scan_program p;
    p.chunk = c;
    return carved_bytes(p);
  }
  /// Whether `products` computes K S and Q S (bf16 inputs on chunk_math::tensor_cores: the
  /// state splits into two bf16 fragments; fp16 inputs would need the state in fp16's range,
  /// so they keep the fp32 dots).
  HYBRIDCACHE_HD_INLINE bool dots_on_tensor_cores() const {
    return std::is_same_v<In, bfloat16_t> && math == chunk_math::tensor_cores;
  }
  /// Whether the whole chunk step but the fold runs on tensor cores (`products`, `columns_w`,
  /// `u_products`, `o_products`, `fold_columns` instead of `columns`): the same condition.
  HYBRIDCACHE_HD_INLINE bool scan_on_tensor_cores() const { return dots_on_tensor_cores(); }

  /// The columns' initial states into the workspace; checkpoints at the start position.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void load_columns(int group, int ngroups, const Group& g) const {
    constexpr int N = slice_len<DK, Group::size>;
    for (int c = col_begin + group; c < col_end; c += ngroups) {
      float s[N];
      load_state_row(state, c, s, g);
      for (int i = 0; i < ck.count; ++i)
        if (ck.positions[i] == start) store_state_row(State{ck.states + i * ck.state_stride}, c, s, g);
      put_column(c, s, g);
    }
  }
  template <class Group>
  HYBRIDCACHE_HD_INLINE void store_columns(int group, int ngroups, const Group& g) const {
    constexpr int N = slice_len<DK, Group::size>;
    for (int c = col_begin + group; c < col_end; c += ngroups) {
      float s[N];
      get_column(c, s, g);
      store_state_row(state, c, s, g);
    }
  }

  HYBRIDCACHE_HD_INLINE void select_chunk(int i) {
    t0 = chunk_first_token(start, in.length, chunk, i);
    len = aligned_chunk_len(start, t0, in.length, chunk);
  }
  /// Chunk `i`'s tables, raw keys and queries, and alphas into the workspace.
  HYBRIDCACHE_HD_INLINE void stage(int i, int tid, int nthreads) const {
    const float* src = tables + i * table_stride;
    for (std::int64_t x = tid; x < chunk_tables::floats(chunk); x += nthreads) tab.cum[x] = src[x];
    for (int x = tid; x < len * DK; x += nthreads) {
      const int r = x / DK, e = x % DK;
      kraw[r * key_stride + e] = in.k_at(t0 + r)[e];
      qraw[r * key_stride + e] = in.q_at(t0 + r)[e];
    }
    for (int j = tid; j < len; j += nthreads) alpha[j] = expf(in.g_at(t0 + j));
  }

  /// K S and Q S of this chunk for the block's columns on tensor cores (when
  /// `dots_on_tensor_cores()`; between `stage` and `columns`, a barrier on each side): a warp
  /// per 16 rows (tiles `warp`, `warp + warps`, ...), the 8 columns as one n tile, the state
  /// split into bf16 hi + lo fragments (load_fragment_b_t_split), 2 d_k / 16 products per
  /// matrix. Raw dots (before the factors and decays) into `dots`.
  template <class Ctx>
  HYBRIDCACHE_HD_INLINE void products(const Ctx& ctx, int warp, int warps) const {
    if constexpr (std::is_same_v<In, bfloat16_t>) {
      static_assert(block_columns == mma_shape::n, "products: the block's columns are one n tile");
      const int lane = ctx.lane_id(), ncols = col_end - col_begin;
      for (int tile = warp; tile * mma_shape::m < len; tile += warps) {  // K S and Q S
        const int r0 = tile * mma_shape::m;
        mma_fragment_c kc, qc;
        for (int k0 = 0; k0 < DK; k0 += mma_shape::k) {
          mma_fragment_b hi, lo;
          load_fragment_b_t_split(cols, DK, k0, 0, ncols, DK, lane, hi, lo);
          const mma_fragment_a qa = load_fragment_a(qraw, key_stride, r0, k0, len, DK, lane);
          mma_m16n8k16<In>(ctx, qc, qa, hi);
          mma_m16n8k16<In>(ctx, qc, qa, lo);
          if constexpr (Rule::delta) {
            const mma_fragment_a ka = load_fragment_a(kraw, key_stride, r0, k0, len, DK, lane);
            mma_m16n8k16<In>(ctx, kc, ka, hi);
            mma_m16n8k16<In>(ctx, kc, ka, lo);
          }
        }
        for (int e = 0; e < 4; ++e) {
          const int r = r0 + c_row(lane, e), n = c_col(lane, e);
          if (r >= len || n >= ncols) continue;
          dots[static_cast<std::int64_t>(n) * chunk + r] = kc.x[e];
          dots[static_cast<std::int64_t>(block_columns + n) * chunk + r] = qc.x[e];
        }
      }
    } else {
      (void)ctx, (void)warp, (void)warps;
    }
  }

  /// One chunk for the group's columns (col_begin + group, + ngroups, ...), all in fp32 FMAs
  /// but K S / Q S when `products` ran.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void columns(int group, int ngroups, const Group& g) const {
    const int ts = tab.stride;
    for (int c = col_begin + group; c < col_end; c += ngroups) {
      const float* ks = dots + static_cast<std::int64_t>(c - col_begin) * chunk;  // w_r
      const float* qs = ks + static_cast<std::int64_t>(block_columns) * chunk;    // gamma_r q_r . s
      float* u = ubuf + static_cast<std::int64_t>(c - col_begin) * chunk;         // the chunk's U column
      column_dots(c, g);
      g.sync();
      // U = T w (delta) or V (linear); then O = diag(gamma) Q S + P U. Lanes over r: T[r][j]
      // and P[r][j] of 32 rows are in 32 banks, w[j] and u[j] are broadcasts.
      if constexpr (Rule::delta) {
        for (int r = g.rank(); r < len; r += Group::size) {
          float x = 0.0f;
          for (int j = 0; j <= r; ++j) x = fma_rn(tab.t[r * ts + j], ks[j], x);
          u[r] = x;
        }
        g.sync();
      }
      for (int r = g.rank(); r < len; r += Group::size) {
        float o = qs[r];
        for (int j = 0; j <= r; ++j) o = fma_rn(tab.p[r * ts + j], u[j], o);
        out.o[(t0 + r) * out.stride + c] = from_float<Out>(o);
        if (out.u != nullptr) out.u[(t0 + r) * out.u_stride + c] = u[r];
      }
      column_fold(c, g);
    }
  }

  /// Tensor-core path (`scan_on_tensor_cores()`), phases in order with a barrier between
  /// them: `products`, `columns_w` (groups), `u_products` (warps; delta rule), `o_products`
  /// (warps) and `fold_columns` (groups). U = T W and O = diag(gamma) Q S + P U run as
  /// m16n8k16 products over the lower-triangular 16x16 tiles of T and P, with T, P, W and U
  /// each split into bf16 hi + lo (hi hi + hi lo + lo hi: 16 significand bits each side).
  template <class Group>
  HYBRIDCACHE_HD_INLINE void columns_w(int group, int ngroups, const Group& g) const {
    for (int c = col_begin + group; c < col_end; c += ngroups) column_dots(c, g);
  }
  template <class Ctx>
  HYBRIDCACHE_HD_INLINE void u_products(const Ctx& ctx, int warp, int warps) const {
    if constexpr (Rule::delta) triangular_product(ctx, warp, warps, tab.t, dots, ubuf, false);
  }
  template <class Ctx>
  HYBRIDCACHE_HD_INLINE void o_products(const Ctx& ctx, int warp, int warps) const {
    triangular_product(ctx, warp, warps, tab.p, ubuf, dots + static_cast<std::int64_t>(block_columns) * chunk, true);
  }
  template <class Group>
  HYBRIDCACHE_HD_INLINE void fold_columns(int group, int ngroups, const Group& g) const {
    for (int c = col_begin + group; c < col_end; c += ngroups) column_fold(c, g);
  }

 private:
  /// Column c's k_r . s -> w_r = v_r - gamma_r k_r . s and q_r . s -> gamma_r q_r . s in
  /// `dots` (the dots from `products`, or here in fp32: lanes over r, a lane walks its own
  /// rows, stride key_stride, 32 rows in 32 banks, while s[i] is a broadcast); for the linear
  /// rule U = V into `ubuf`.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void column_dots(int c, const Group& g) const {
    const bool tensor = dots_on_tensor_cores();
    const float* col = cols + static_cast<std::int64_t>(c - col_begin) * DK;
    float* ks = dots + static_cast<std::int64_t>(c - col_begin) * chunk;
    float* qs = ks + static_cast<std::int64_t>(block_columns) * chunk;
    float* u = ubuf + static_cast<std::int64_t>(c - col_begin) * chunk;
    for (int r = g.rank(); r < len; r += Group::size) {
      float a = 0.0f, b = 0.0f;
      if (tensor) {
        a = ks[r];
        b = qs[r];
      } else {
        const In* kr = kraw + r * key_stride;
        const In* qr = qraw + r * key_stride;
        for (int i = 0; i < DK; ++i) {
          a = fma_rn(to_float(kr[i]), col[i], a);
          b = fma_rn(to_float(qr[i]), col[i], b);
        }
      }
      const float gamma = decay_from_start(prefix_at(tab.cum, tab.seg, r));
      ks[r] = Rule::delta ? fma_rn(-gamma, tab.kfac[r] * a, in.v_at(t0 + r, c)) : 0.0f;
      qs[r] = mul_rn(gamma, tab.qfac[r] * b);
      if constexpr (!Rule::delta) u[r] = in.v_at(t0 + r, c);
    }
  }
  /// Rolls column c through the chunk with its U column (lanes over d_k); a checkpoint inside
  /// the chunk is the boundary state rolled forward, the one at its end the next boundary.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void column_fold(int c, const Group& g) const {
    constexpr int N = slice_len<DK, Group::size>;
    const float* u = ubuf + static_cast<std::int64_t>(c - col_begin) * chunk;
    const std::int64_t chunk_start = start + t0;
    float s[N];
    get_column(c, s, g);
    int next = 0;
    while (next < ck.count && ck.positions[next] <= chunk_start) ++next;
    for (int j = 0; j < len; ++j) {
      float k[N];
      load_slice<DK>(kraw + j * key_stride, tab.kfac[j], k, g);
      fold_row(s, alpha[j], k, u[j]);
      while (next < ck.count && ck.positions[next] == chunk_start + j + 1) {
        store_state_row(State{ck.states + next * ck.state_stride}, c, s, g);
        ++next;
      }
    }
    put_column(c, s, g);
    g.sync();
  }
  /// D = L X (+ Y) for the block's columns: L the lower triangle of a [C][tab.stride] table (T
  /// or P), X and Y [block_columns][C] column-major in shared memory, a warp per 16 rows. With
  /// `to_output` D is O (Y = the scaled q . s, stored to out.o and out.u with U = X), else U
  /// (stored to `d`).
  template <class Ctx>
  HYBRIDCACHE_HD_INLINE void triangular_product(const Ctx& ctx, int warp, int warps, const float* l, const float* x,
                                                float* d, bool to_output) const {
    if constexpr (std::is_same_v<In, bfloat16_t>) {
      const int lane = ctx.lane_id(), ncols = col_end - col_begin, ts = tab.stride;
      for (int tile = warp; tile * mma_shape::m < len; tile += warps) {  // T W or P U
        const int r0 = tile * mma_shape::m;
        mma_fragment_c acc;
        if (to_output)
          for (int e = 0; e < 4; ++e) {
            const int r = r0 + c_row(lane, e), n = c_col(lane, e);
            acc.x[e] = r < len && n < ncols ? d[static_cast<std::int64_t>(n) * chunk + r] : 0.0f;
          }
        for (int k0 = 0; k0 <= r0; k0 += mma_shape::k) {
          mma_fragment_a lh, ll;
          mma_fragment_b xh, xl;
          load_fragment_a_lower_split(l, ts, r0, k0, len, lane, lh, ll);
          load_fragment_b_t_split(x, chunk, k0, 0, ncols, len, lane, xh, xl);
          mma_m16n8k16<bfloat16_t>(ctx, acc, lh, xh);
          mma_m16n8k16<bfloat16_t>(ctx, acc, lh, xl);
          mma_m16n8k16<bfloat16_t>(ctx, acc, ll, xh);  // lo lo (<= 2^-16 of a term): 10 % of the error, left out
        }
        for (int e = 0; e < 4; ++e) {
          const int r = r0 + c_row(lane, e), n = c_col(lane, e);
          if (r >= len || n >= ncols) continue;
          if (to_output) {
            const int c = col_begin + n;
            out.o[(t0 + r) * out.stride + c] = from_float<Out>(acc.x[e]);
            if (out.u != nullptr) out.u[(t0 + r) * out.u_stride + c] = x[static_cast<std::int64_t>(n) * chunk + r];
          } else {
            d[static_cast<std::int64_t>(n) * chunk + r] = acc.x[e];
          }
        }
      }
    } else {
      (void)ctx, (void)warp, (void)warps, (void)l, (void)x, (void)d, (void)to_output;
    }
  }

  template <class Group>
  HYBRIDCACHE_HD_INLINE void put_column(int c, const float (&s)[slice_len<DK, Group::size>], const Group& g) const {
    float* col = cols + static_cast<std::int64_t>(c - col_begin) * DK;
    for (int e = 0; e < slice_len<DK, Group::size>; ++e) {
      const int i = slice_index<DK, Group::size>(g.rank(), e);
      if (i < DK) col[i] = s[e];
    }
  }
  template <class Group>
  HYBRIDCACHE_HD_INLINE void get_column(int c, float (&s)[slice_len<DK, Group::size>], const Group& g) const {
    const float* col = cols + static_cast<std::int64_t>(c - col_begin) * DK;
    for (int e = 0; e < slice_len<DK, Group::size>; ++e) {
      const int i = slice_index<DK, Group::size>(g.rank(), e);
      s[e] = i < DK ? col[i] : 0.0f;
    }
  }
};

namespace detail {

/// Worst bank conflict of the shared accesses of the chunk programs for chunk capacity `c`,
/// `len` tokens, d_k `dk`, input elements of `eb` bytes, with warps of 32 threads: the
/// triangular mat-vecs of the scan (T w, P u: lanes over rows r at step j), its k.s / q.s
/// dots (lanes over rows at step i), the Gram and weight items of the prepare phase (an item
/// per thread, j fastest, at step i), and the solve (a thread per column c reading T[j][c] at
/// step j; A[r][j] is the same word for every lane). Steps i run over `i_steps` elements of
/// d_k (all of them in the exhaustive test; 2 cover both parities of a 16-bit row). The row
/// strides are the programs' own unless given (`t_stride`, `k_stride` > 0: to show what an
/// unpadded layout costs).
constexpr int chunk_bank_ways(int c, int len, int dk, int eb, int i_steps, int t_stride = 0, int k_stride = 0) {
  const int ts = t_stride > 0 ? t_stride : chunk_tables::stride_for(c);
  const int ks = k_stride > 0 ? k_stride : padded_stride(dk, eb);
  int worst = 0;
  auto keep = [&](int w) { worst = w > worst ? w : worst; };
  for (int k = 0; k * 32 < len; ++k) {  // scan: lanes over r = 32 k + lane
    for (int j = 0; j < len; ++j)
      keep(bank_ways([&](int l) -> std::int64_t {
        const int r = 32 * k + l;
        return r < len && j <= r ? std::int64_t{4} * (r * ts + j) : -1;  // T[r][j], P[r][j]
      }));
    for (int i = 0; i < i_steps; ++i)
      keep(bank_ways([&](int l) -> std::int64_t {
        const int r = 32 * k + l;
        return r < len ? std::int64_t{eb} * (r * ks + i) : -1;  // kraw[r][i], qraw[r][i]
      }));
  }
  for (int r = 0; r < len; ++r)  // prepare: a warp per row r, lanes over j = 32 k + lane <= r
    for (int k = 0; 32 * k <= r; ++k) {
      auto live = [&](int l) { return 32 * k + l <= r; };
      for (int i = 0; i < i_steps; ++i)
        keep(bank_ways([&](int l) -> std::int64_t { return live(l) ? std::int64_t{eb} * ((32 * k + l) * ks + i) : -1; }));
      keep(bank_ways([&](int l) -> std::int64_t { return live(l) ? std::int64_t{4} * (r * ts + 32 * k + l) : -1; }));
    }
  for (int c0 = 0; c0 < len; c0 += 32)  // solve: thread c = c0 + lane reads T[j][c] when c <= j
    for (int j = 0; j < len; ++j)
      keep(bank_ways([&](int l) -> std::int64_t {
        const int cc = c0 + l;
        return cc < len && cc <= j ? std::int64_t{4} * (j * ts + cc) : -1;
      }));
  return worst;
}

}  // namespace detail

// Full chunks of the shipped sizes, fp32 and 16-bit inputs (tests/emulated checks every
// chunk capacity 1..64, every tail length, every step and more head dims at run time).
static_assert(detail::chunk_bank_ways(64, 64, 128, 2, 2) <= 2, "chunk programs: shared-memory bank conflicts");
static_assert(detail::chunk_bank_ways(64, 64, 128, 4, 2) <= 2, "chunk programs: shared-memory bank conflicts");
static_assert(detail::chunk_bank_ways(16, 16, 64, 4, 2) <= 2, "chunk programs: shared-memory bank conflicts");

}  // namespace hybridcache::attention
