// hybridcache/attention/decode_programs.hpp
//
// Batched decode-time programs, one per (batch entry, value head), shared by the kernels and
// the host reference:
//   - `recurrent_program`: the baseline recurrent decode of n tokens; optionally writes the
//     state after every token to a per-draft buffer (what SGLang/vLLM `target_verify` do);
//   - `kv_step_program`: KVBuffer decode (n = 1: output from the state at the last flush plus
//     the buffer, fold every B tokens) and speculative verification of n drafts (outputs for
//     all drafts, drafts appended past the cursor, no state write);
//   - `kv_commit_program`: after verification, folds the buffer into the state when the
//     accepted prefix fills it (one state write); otherwise nothing (the cursor moves on the host).
// KV-only requests (no state yet) run the same programs with a zero state that is never read.
//
// Tensor layouts (contiguous): q, k [batch][n][H][d_k]; v, o [batch][n][HV][d_v];
// log_decay, beta [batch][n][HV] fp32; state pool [slot][HV][d_k*d_v] in `Layout`.
// A negative slot skips the entry: its outputs, state and buffer are not touched.
//
// Phases (a barrier between consecutive phases): `dots` items (per-head key/query dot
// products, norms, cumulative decays; also appends raw keys/decays), `weights` items (decay
// weighting), then `rows` (value columns; the only phase that touches the state).
// Math: anchors/linear_attention.md §1.2, §1.5, §2.4.
//
// Costs per (entry, head), m buffered tokens, n new: state read d_k d_v (skipped in KV-only
// mode), written only on a fold; buffer read m (d_k + d_v); O(n (m+n) d_k + d_k d_v n) flops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/attention/kernel_context.hpp"
#include "hybridcache/attention/kv_buffer.hpp"
#include "hybridcache/attention/linear_attention_common.hpp"

namespace hybridcache::attention {

/// Common inputs of a batched decode-time step.
template <class In, class Out>
struct step_io {
  const std::int32_t* slots = nullptr;  ///< [batch] state/buffer slot per entry; < 0 = skip
  int batch = 0;
  int new_tokens = 1;                   ///< n tokens per entry (1 = decode)
  int num_k_heads = 0;                  ///< H
  int num_v_heads = 0;                  ///< HV (multiple of H)
  const In* q = nullptr;
  const In* k = nullptr;
  const In* v = nullptr;
  const float* log_decay = nullptr;  ///< nullptr: no decay
  const float* beta = nullptr;       ///< delta rule only
  Out* o = nullptr;
  float* states = nullptr;  ///< state pool
  qk_options qk{};
  /// Optional fused Qwen3-Next gating: when `gate_a` is set, g and beta are computed from the
  /// raw projections a, b [batch][n][HV] and the per-head A_log, dt_bias [HV] (log_decay and
  /// beta are then ignored), with the same functions `launch_qwen3_next_gates` uses.
  const In* gate_a = nullptr;
  const In* gate_b = nullptr;
  const float* a_log = nullptr;
  const float* dt_bias = nullptr;

  HYBRIDCACHE_HD_INLINE std::int64_t tok(int b, int r) const { return static_cast<std::int64_t>(b) * new_tokens + r; }
  template <int DK>
  HYBRIDCACHE_HD_INLINE const In* q_at(int b, int r, int h) const { return q + (tok(b, r) * num_k_heads + h) * DK; }
  template <int DK>
  HYBRIDCACHE_HD_INLINE const In* k_at(int b, int r, int h) const { return k + (tok(b, r) * num_k_heads + h) * DK; }
  template <int DV>
  HYBRIDCACHE_HD_INLINE std::int64_t v_index(int b, int r, int hv, int c) const {
    return (tok(b, r) * num_v_heads + hv) * DV + c;
  }
  HYBRIDCACHE_HD_INLINE float g_at(int b, int r, int hv) const {
    const std::int64_t i = tok(b, r) * num_v_heads + hv;
    if (gate_a != nullptr) return qwen3_next_log_decay(a_log[hv], to_float(gate_a[i]), dt_bias[hv]);
    return log_decay ? log_decay[i] : 0.0f;
  }
  HYBRIDCACHE_HD_INLINE float beta_at(int b, int r, int hv) const {
    const std::int64_t i = tok(b, r) * num_v_heads + hv;
    if (gate_a != nullptr) return qwen3_next_beta(to_float(gate_b[i]));
    return beta ? beta[i] : 1.0f;
  }
};

/// State rows a warp loads before it computes any of them in recurrent decode: 4 rows'
/// loads in flight per warp (4 x 512 B at d_k = 128, one 128-bit load per lane per row).
inline constexpr int decode_rows_in_flight = 4;

/// Recurrent decode of n tokens per entry (n = 1: plain decode). With `intermediate` set,
/// the state after token r goes to `intermediate[((b*n + r)*HV + hv) * d_k*d_v]` and the pool
/// is left unchanged (speculative verification with per-draft states, the baseline).
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
struct recurrent_program {
  using state_type = state_ref<Layout, DK, DV>;
  static constexpr int key_dim = DK;
  static constexpr int value_dim = DV;
  step_io<In, Out> io;
  float* intermediate = nullptr;
  int b = 0, hv = 0, h = 0, slot = -1;
  float kfac1 = 1.0f, qfac1 = 1.0f;  ///< plain decode: the token's key and query factors (`prepare`)

  HYBRIDCACHE_HD_INLINE bool init(int entry, int value_head) {
    b = entry;
    hv = value_head;
    h = key_head_of(hv, io.num_k_heads, io.num_v_heads);
    slot = io.slots[b];
    return slot >= 0;
  }

  /// Plain decode (one token, no per-draft states): the token's key and query normalization
  /// factors, summed by `g`. The kernel passes a whole warp whatever group its rows use, as
  /// kv_step's dots phase does, so both kernels prepare the token bit for bit alike (B = 1
  /// buffered decode is bit-identical to recurrent decode). Call after `init`, before `rows`.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void prepare(const Group& g) {
    if (io.new_tokens != 1 || intermediate != nullptr) return;
    kfac1 = prep_factor(group_sum_sq<DK>(io.template k_at<DK>(b, 0, h), g), io.qk.l2_normalize, 1.0f, io.qk.eps);
    qfac1 = prep_factor(group_sum_sq<DK>(io.template q_at<DK>(b, 0, h), g), io.qk.l2_normalize, io.qk.scale, io.qk.eps);
  }

  /// Rows row_begin, row_begin + row_step, ..., `decode_rows_in_flight` at a time: their
  /// loads are issued back to back before the first row's math. Plain decode (one token, no
  /// per-draft states) has a loop of its own with q and k prepared once, not once per row.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void rows(int row_begin, int row_step, const Group& g) const {
    if (io.new_tokens == 1 && intermediate == nullptr) rows_of<true>(row_begin, row_step, g);
    else rows_of<false>(row_begin, row_step, g);
  }

  template <bool Decode, class Group>
  HYBRIDCACHE_HD_INLINE void rows_of(int row_begin, int row_step, const Group& g) const {
    constexpr int N = slice_len<DK, Group::size>;
    // Rows in flight per group: a half warp holds each row in twice the registers, so it
    // keeps half as many rows in flight (a warp still has decode_rows_in_flight).
    constexpr int R = Group::size >= 32 ? decode_rows_in_flight : (decode_rows_in_flight * Group::size + 31) / 32;
    const state_type pool{io.states + (static_cast<std::int64_t>(slot) * io.num_v_heads + hv) * state_type::elements};
    float k1[N] = {}, q1[N] = {}, alpha1 = 1.0f, beta1 = 0.0f;
    if constexpr (Decode) {  // the token's prepared key and query, decay and beta: the same for every row
      load_slice<DK>(io.template k_at<DK>(b, 0, h), kfac1, k1, g);
      load_slice<DK>(io.template q_at<DK>(b, 0, h), qfac1, q1, g);
      alpha1 = expf(io.g_at(b, 0, hv));
      beta1 = io.beta_at(b, 0, hv);
    }
    const int new_tokens = Decode ? 1 : io.new_tokens;
    for (int c0 = row_begin; c0 < DV; c0 += R * row_step) {  // recurrent row loop
      float s[R][N];
      HYBRIDCACHE_UNROLL
      for (int i = 0; i < R; ++i)
        if (c0 + i * row_step < DV) load_state_row(pool, c0 + i * row_step, s[i], g);
      HYBRIDCACHE_UNROLL
      for (int i = 0; i < R; ++i) {
        const int c = c0 + i * row_step;
        if (c >= DV) break;
        for (int r = 0; r < new_tokens; ++r) {
          float k[N], q[N];
          if constexpr (Decode) {
            for (int e = 0; e < N; ++e) {
              k[e] = k1[e];
              q[e] = q1[e];
            }
          } else {
            load_prepared<DK>(io.template k_at<DK>(b, r, h), io.qk, false, k, g);
            load_prepared<DK>(io.template q_at<DK>(b, r, h), io.qk, true, q, g);
          }
          const float v = to_float(io.v[io.template v_index<DV>(b, r, hv, c)]);
          const float o = Decode ? recurrent_row_step_alpha<Rule>(s[i], k, q, v, alpha1, beta1, g)
                                 : recurrent_row_step<Rule>(s[i], k, q, v, io.g_at(b, r, hv), io.beta_at(b, r, hv), g);
          if (g.rank() == 0) io.o[io.template v_index<DV>(b, r, hv, c)] = from_float<Out>(o);
          if (!Decode && intermediate != nullptr)
            store_state_row(state_type{intermediate + (io.tok(b, r) * io.num_v_heads + hv) * state_type::elements}, c,
                            s[i], g);
        }
        if (Decode || intermediate == nullptr) store_state_row(pool, c, s[i], g);
      }
    }
  }
};

/// KVBuffer decode (n = 1, `decode`) or verification of n drafts (`!decode`).
///
/// Phases: `positions` (one group: the pool token of every position, the log-decay prefixes
/// restarting at g = -inf, alphas, betas) with the `dots` items (dot products, norms, the raw
/// keys staged in the workspace), then `weights` items, then `rows` (value columns; the only
/// phase that touches the state). The rows phase reads keys, alphas and
/// pool tokens from the workspace, never through the block table.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out, class ValueT>
struct kv_step_program {
  using state_type = state_ref<Layout, DK, DV>;
  static constexpr int key_dim = DK;
  static constexpr int value_dim = DV;
  step_io<In, Out> io;
  kv_buffer_ref<In, ValueT> buf;
  int flush_interval = 16;
  int crossover = 0;
  bool decode = true;

  int b = 0, hv = 0, h = 0, slot = -1, m = 0, n = 0, total = 0;
  bool valid = false, fold = false;
  std::int64_t* tok = nullptr;                                          ///< [total] pool token of each position
  float *cum = nullptr, *seg = nullptr, *alpha = nullptr, *kfac = nullptr;  ///< [total]
  float *qfac = nullptr, *beta = nullptr;                               ///< [n]
  float *kk = nullptr, *qk = nullptr;                                   ///< [n][total]
  In* keys = nullptr;                                                   ///< [total][d_k] raw keys
  float *colx = nullptr, *coly = nullptr;                               ///< [n][DV] (columns)
  float* row_ws = nullptr;                                              ///< [groups][total + 2n]

  /// Bytes of workspace for `total_tokens` = m + n positions, `n_new` new tokens, `groups` row groups.
  HYBRIDCACHE_HD_INLINE static std::size_t workspace_bytes(int total_tokens, int n_new, int groups) {
    kv_step_program p;
    p.total = total_tokens;
    p.n = n_new;
    return carved_bytes(p, groups);
  }

  /// Binds the entry; false when it is skipped. Then `carve` the workspace.
  HYBRIDCACHE_HD_INLINE bool init(int entry, int value_head) {
    b = entry;
    hv = value_head;
    h = key_head_of(hv, io.num_k_heads, io.num_v_heads);
    slot = io.slots[b];
    if (slot < 0) return false;
    m = buf.cursor[slot];
    valid = buf.state_valid[slot] != 0;
    n = io.new_tokens;
    total = m + n;
    fold = decode && advance_cursor(m, valid, 1, flush_interval, crossover).fold;
    return true;
  }
  HYBRIDCACHE_HD_INLINE void carve(workspace_carver& w, int groups) {
    tok = w.take<std::int64_t>(total);
    cum = w.take<float>(total);
    seg = w.take<float>(total);
    alpha = w.take<float>(total);
    kfac = w.take<float>(total);
    qfac = w.take<float>(n);
    beta = w.take<float>(n);
    kk = w.take<float>(static_cast<std::int64_t>(n) * total);
    qk = w.take<float>(static_cast<std::int64_t>(n) * total);
    keys = w.take<In>(static_cast<std::int64_t>(total) * DK);
    colx = w.take<float>(static_cast<std::int64_t>(n) * DV);
    coly = w.take<float>(static_cast<std::int64_t>(n) * DV);
    row_ws = w.take<float>(static_cast<std::int64_t>(groups) * (total + 2 * n));
  }
  HYBRIDCACHE_HD_INLINE float* row_scratch(int group) const {
    return row_ws + static_cast<std::int64_t>(group) * (total + 2 * n);
  }

  HYBRIDCACHE_HD_INLINE const In* key_at(int j) const {
    return j < m ? buf.key(slot, j, h) : io.template k_at<DK>(b, j - m, h);
  }

  HYBRIDCACHE_HD_INLINE int dot_items() const { return n * total + total + n; }
  HYBRIDCACHE_HD_INLINE int weight_items() const { return n * total; }

  /// Run by one group alongside the `dots` items (the same phase): positions over the lanes
  /// (each lane reads back only what it wrote): one block-table lookup per position, the
  /// decays (buffered ones from the pool, new ones from the step, appended to the pool),
  /// their prefixes (restarting at g = -inf), alphas and betas.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void positions(const Group& g) const {
    for (int j = g.rank(); j < total; j += Group::size) tok[j] = buf.token_index(slot, j);
    auto g_at = [&](int j) {
      if (j >= m) return io.g_at(b, j - m, hv);
      return buf.log_decay ? *buf.decay_of(tok[j], hv) : 0.0f;
    };
    scan_log_decays(total, g_at, cum, seg, g);
    for (int j = g.rank(); j < total; j += Group::size) {
      const float gj = g_at(j);
      alpha[j] = expf(gj);
      if (j >= m) {
        beta[j - m] = io.beta_at(b, j - m, hv);
        if (buf.log_decay != nullptr) *buf.decay_of(tok[j], hv) = gj;
      }
    }
  }

  template <class Group>
  HYBRIDCACHE_HD_INLINE void dots(int item, const Group& g) const {
    constexpr int N = slice_len<DK, Group::size>;
    if (item < n * total) {
      const int r = item / total, j = item % total;
      if (j > m + r) return;
      float kj[N], x[N];
      load_slice<DK>(key_at(j), 1.0f, kj, g);
      load_slice<DK>(io.template q_at<DK>(b, r, h), 1.0f, x, g);
      const float qkv = group_dot(x, kj, g);
      float kkv = 0.0f;
      if (j < m + r) {
        load_slice<DK>(key_at(m + r), 1.0f, x, g);
        kkv = group_dot(x, kj, g);
      }
      if (g.rank() == 0) {
        qk[r * total + j] = qkv;
        kk[r * total + j] = kkv;
      }
    } else if (item < n * total + total) {
      const int j = item - n * total;
      const In* raw = key_at(j);
      const float ss = group_sum_sq<DK>(raw, g);
      if (g.rank() == 0) kfac[j] = prep_factor(ss, io.qk.l2_normalize, 1.0f, io.qk.eps);
      for (int i = g.rank(); i < DK; i += Group::size) keys[j * DK + i] = raw[i];
      // Append the new token's raw key once per key head (the first of its value heads).
      if (j >= m && hv % (io.num_v_heads / io.num_k_heads) == 0) {
        In* dst = buf.key(slot, j, h);
        for (int i = g.rank(); i < DK; i += Group::size) dst[i] = raw[i];
      }
    } else {
      const int r = item - n * total - total;
      const float ss = group_sum_sq<DK>(io.template q_at<DK>(b, r, h), g);
      if (g.rank() == 0) qfac[r] = prep_factor(ss, io.qk.l2_normalize, io.qk.scale, io.qk.eps);
    }
  }

  HYBRIDCACHE_HD_INLINE void weights(int item) const {
    const int r = item / total, j = item % total;
    if (j > m + r) return;
    const float dec = decay_between(prefix_at(cum, seg, m + r), cum[j], j);
    qk[r * total + j] = dec * qk[r * total + j] * qfac[r] * kfac[j];
    if (j < m + r) kk[r * total + j] = dec * kk[r * total + j] * kfac[m + r] * kfac[j];
  }

  /// One item per value column c (threads over columns), after `weights`: the buffered
  /// tokens' part of column c's sums, colx[r][c] = sum_{j<m} kk[r][j] u_j[c] (delta rule:
  /// what the earlier values take from the new token's) and coly[r][c] = sum_{j<m} qk[r][j]
  /// u_j[c] (the output's; not needed on a fold, which reads the output from the new
  /// state). Done once per CTA with coalesced reads of the buffered values, instead of once
  /// per state row with a gather of m values and two warp reductions. O(n m) per column.
  HYBRIDCACHE_HD_INLINE int column_items() const { return DV; }
  HYBRIDCACHE_HD_INLINE void columns(int c) const {
    for (int r = 0; r < n; ++r) {
      float x = 0.0f, y = 0.0f;
      for (int j = 0; j < m; ++j) {
        const float uj = to_float(buf.value_of(tok[j], hv)[c]);
        if constexpr (Rule::delta) x = fma_rn(kk[r * total + j], uj, x);
        if (!fold) y = fma_rn(qk[r * total + j], uj, y);
      }
      colx[r * DV + c] = x;
      coly[r * DV + c] = y;
    }
  }

  /// State rows [row_begin, DV) step row_step, one per group. A step that does not fold
  /// reads the state: the two dot products of the row with the new tokens' keys and queries
  /// are its only reductions, and the buffered part of every sum comes from `columns`. A
  /// fold (decode only) replays the buffer onto the row and writes it. Three loops, so the
  /// common one (decode, no fold) carries no branch of the others.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void rows(int row_begin, int row_step, float* scratch, const Group& g) const {
    if (fold) fold_rows(row_begin, row_step, scratch, g);
    else if (n == 1) step_rows<true>(row_begin, row_step, scratch, g);
    else step_rows<false>(row_begin, row_step, scratch, g);
  }

  /// What new token r's value and output take from outside the state row, the same for every
  /// row: the decay since the run's start, its beta and its own query-key weight.
  struct token_terms {
    float from_start = 0.0f, beta = 1.0f, self_qk = 0.0f;
  };
  HYBRIDCACHE_HD_INLINE token_terms terms_of(int r) const {
    return {decay_from_start(prefix_at(cum, seg, m + r)), Rule::delta ? beta[r] : 1.0f, qk[r * total + m + r]};
  }

  /// The state's part of new token r's value and output in row `c` (`sk`, `sq`: the row's
  /// dot products with its key and query; `t`: `terms_of(r)`); `u_new[0..r)` holds the
  /// earlier new tokens' values. Every member computes the same values (the reductions give
  /// each the same totals); one writes them. Returns the token's value u.
  template <class Group>
  HYBRIDCACHE_HD_INLINE float new_token(int c, int r, const token_terms& t, float sk, float sq, const float* u_new,
                                        bool output, const Group& g) const {
    const float v = to_float(io.v[io.template v_index<DV>(b, r, hv, c)]);
    float uu = v;
    if constexpr (Rule::delta) {
      float part = colx[r * DV + c];
      for (int i = 0; i < r; ++i) part = fma_rn(kk[r * total + m + i], u_new[i], part);
      uu = delta_value(v, t.beta, fma_rn(t.from_start, sk, part));
    }
    if (output) {
      float part = coly[r * DV + c];
      for (int i = 0; i < r; ++i) part = fma_rn(qk[r * total + m + i], u_new[i], part);
      part = fma_rn(t.self_qk, uu, part);
      const float o = fma_rn(t.from_start, sq, part);
      if (g.rank() == 0) io.o[io.template v_index<DV>(b, r, hv, c)] = from_float<Out>(o);
    }
    if (g.rank() == 0) buf.value_of(tok[m + r], hv)[c] = from_float<ValueT>(uu);
    return uu;
  }

  /// Decode (`Single`: one new token, its prepared key and query loaded once for all rows)
  /// or verification of n drafts, without a fold: nothing is written to the state.
  template <bool Single, class Group>
  HYBRIDCACHE_HD_INLINE void step_rows(int row_begin, int row_step, float* scratch, const Group& g) const {
    constexpr int N = slice_len<DK, Group::size>;
    float* u_new = scratch + total;  // [n]: the drafts' values of the current row
    const state_type pool{io.states + (static_cast<std::int64_t>(slot) * io.num_v_heads + hv) * state_type::elements};
    float next[N] = {};  // prefetched state row (zero in KV-only mode: no state exists)
    if (valid && row_begin < DV) load_state_row(pool, row_begin, next, g);
    float k1[N] = {}, q1[N] = {};
    token_terms t1;
    if constexpr (Single) {  // the token's key, query and terms: the same for every row
      load_slice<DK>(keys + m * DK, kfac[m], k1, g);
      load_slice<DK>(io.template q_at<DK>(b, 0, h), qfac[0], q1, g);
      t1 = terms_of(0);
    }
    for (int c = row_begin; c < DV; c += row_step) {  // step row loop
      float s[N];
      for (int e = 0; e < N; ++e) s[e] = next[e];
      if (valid && c + row_step < DV) load_state_row(pool, c + row_step, next, g);
      if constexpr (Single) {
        (void)new_token(c, 0, t1, group_dot(s, k1, g), group_dot(s, q1, g), u_new, true, g);
      } else {
        for (int r = 0; r < n; ++r) {
          float k[N], q[N];
          load_slice<DK>(keys + (m + r) * DK, kfac[m + r], k, g);
          load_slice<DK>(io.template q_at<DK>(b, r, h), qfac[r], q, g);
          const float uu = new_token(c, r, terms_of(r), group_dot(s, k, g), group_dot(s, q, g), u_new, true, g);
          if (g.rank() == 0) u_new[r] = uu;
          g.sync();  // the later drafts of this row read it; the next row rewrites it
        }
      }
    }
  }

  /// Decode with a fold (the buffer is full): the new token's value from the state as it
  /// stands, then the buffer replayed onto the row (closed-loop exact fold, SGLang #28695),
  /// the row written once, and the token's output read from the new state.
  template <class Group>
  HYBRIDCACHE_HD_INLINE void fold_rows(int row_begin, int row_step, float* scratch, const Group& g) const {
    constexpr int N = slice_len<DK, Group::size>;
    float* u = scratch;  // [total]: the row's buffered values, then the new token's
    const state_type pool{io.states + (static_cast<std::int64_t>(slot) * io.num_v_heads + hv) * state_type::elements};
    float next[N] = {};
    if (valid && row_begin < DV) load_state_row(pool, row_begin, next, g);
    float k1[N], q1[N];
    load_slice<DK>(keys + m * DK, kfac[m], k1, g);
    load_slice<DK>(io.template q_at<DK>(b, 0, h), qfac[0], q1, g);
    const token_terms t1 = terms_of(0);
    for (int c = row_begin; c < DV; c += row_step) {  // fold row loop
      float s[N];
      for (int e = 0; e < N; ++e) s[e] = next[e];
      if (valid && c + row_step < DV) load_state_row(pool, c + row_step, next, g);
      const float uu = new_token(c, 0, t1, group_dot(s, k1, g), 0.0f, u, false, g);
      for (int j = g.rank(); j < m; j += Group::size) u[j] = to_float(buf.value_of(tok[j], hv)[c]);
      if (g.rank() == 0) u[m] = uu;
      g.sync();
      for (int j = 0; j < total; ++j) {
        float k[N];
        load_slice<DK>(keys + j * DK, kfac[j], k, g);
        fold_row(s, alpha[j], k, u[j]);
      }
      store_state_row(pool, c, s, g);
      const float o = group_dot(s, q1, g);
      if (g.rank() == 0) io.o[io.template v_index<DV>(b, 0, hv, c)] = from_float<Out>(o);
      g.sync();
    }
  }
};

/// Commit after verification: entry b accepted `accepted[b]` of its drafts. When the
/// accepted prefix fills the buffer (or reaches the crossover in KV-only mode), the whole
/// buffer is folded into the state (written once); otherwise nothing is written. `dots` (one
/// item per buffered token: norm, pool token, alpha, raw key staged), then `rows`.
template <class Rule, state_layout Layout, int DK, int DV, class In, class ValueT>
struct kv_commit_program {
  using state_type = state_ref<Layout, DK, DV>;
  static constexpr int key_dim = DK;
  const std::int32_t* slots = nullptr;
  const std::int32_t* accepted = nullptr;
  int num_k_heads = 0;
  int num_v_heads = 0;
  float* states = nullptr;
  kv_buffer_ref<In, ValueT> buf;
  qk_options qk{};
  int flush_interval = 16;
  int crossover = 0;

  int b = 0, hv = 0, h = 0, slot = -1, total = 0;
  bool valid = false;
  std::int64_t* tok = nullptr;
  float* kfac = nullptr;
  float* alpha = nullptr;
  In* keys = nullptr;

  HYBRIDCACHE_HD_INLINE static std::size_t workspace_bytes(int total_tokens) {
    kv_commit_program p;
    p.total = total_tokens;
    return carved_bytes(p);
  }
  HYBRIDCACHE_HD_INLINE void carve(workspace_carver& w) {
    tok = w.take<std::int64_t>(total);
    kfac = w.take<float>(total);
    alpha = w.take<float>(total);
    keys = w.take<In>(static_cast<std::int64_t>(total) * DK);
  }

  HYBRIDCACHE_HD_INLINE bool init(int entry, int value_head) {
    b = entry;
    hv = value_head;
    h = key_head_of(hv, num_k_heads, num_v_heads);
    slot = slots[b];
    if (slot < 0) return false;
    const int m = buf.cursor[slot];
    valid = buf.state_valid[slot] != 0;
    if (!advance_cursor(m, valid, accepted[b], flush_interval, crossover).fold) return false;
    total = m + accepted[b];
    return true;
  }

  template <class Group>
  HYBRIDCACHE_HD_INLINE void dots(int j, const Group& g) const {
    const std::int64_t t = buf.token_index(slot, j);
    const In* raw = buf.key_of(t, h);
    const float ss = group_sum_sq<DK>(raw, g);
    if (g.rank() == 0) {
      tok[j] = t;
      kfac[j] = prep_factor(ss, qk.l2_normalize, 1.0f, qk.eps);
      alpha[j] = expf(buf.log_decay ? *buf.decay_of(t, hv) : 0.0f);
    }
    for (int i = g.rank(); i < DK; i += Group::size) keys[j * DK + i] = raw[i];
  }

  template <class Group>
  HYBRIDCACHE_HD_INLINE void rows(int row_begin, int row_step, const Group& g) const {
    constexpr int N = slice_len<DK, Group::size>;
    const state_type pool{states + (static_cast<std::int64_t>(slot) * num_v_heads + hv) * state_type::elements};
    float next[N] = {};
    if (valid && row_begin < DV) load_state_row(pool, row_begin, next, g);
    for (int c = row_begin; c < DV; c += row_step) {
      float s[N];
      for (int e = 0; e < N; ++e) s[e] = next[e];
      if (valid && c + row_step < DV) load_state_row(pool, c + row_step, next, g);
      for (int j = 0; j < total; ++j) {
        float k[N];
        load_slice<DK>(keys + j * DK, kfac[j], k, g);
        fold_row(s, alpha[j], k, to_float(buf.value_of(tok[j], hv)[c]));
      }
      store_state_row(pool, c, s, g);
    }
  }
};

/// Appends one prefilled token to a request's buffer (KV-only requests after a short prefill):
/// raw key `k` [H][d_k] (written by the first value head of each key head), values `u`
/// [HV][d_v] and log decays `g` [HV] (nullable) at buffer position `pos` of `slot`. Work item
/// (hv, c) copies u[hv][c]; items with c < d_k also copy key element c for the key head.
template <class In, class ValueT>
HYBRIDCACHE_HD_INLINE void append_token_item(const kv_buffer_ref<In, ValueT>& buf, int slot, int pos, const In* k,
                                             const float* u, const float* g, int hv, int c) {
  const int h = key_head_of(hv, buf.num_k_heads, buf.num_v_heads);
  if (c < buf.value_dim) buf.value(slot, pos, hv)[c] = from_float<ValueT>(u[static_cast<std::int64_t>(hv) * buf.value_dim + c]);
  if (hv % (buf.num_v_heads / buf.num_k_heads) == 0 && c < buf.key_dim)
    buf.key(slot, pos, h)[c] = k[static_cast<std::int64_t>(h) * buf.key_dim + c];
  if (c == 0 && buf.log_decay != nullptr) *buf.decay(slot, pos, hv) = g ? g[hv] : 0.0f;
}

// ---------------------------------------------------------------------------------------
// Host drivers (one thread): the reference the device tests compare against.
// ---------------------------------------------------------------------------------------

namespace detail {
template <class T>
void check_finite_host(const char* what, const T* p, std::int64_t count) {
  if (p == nullptr) return;
  for (std::int64_t i = 0; i < count; ++i)
    HYBRIDCACHE_EXPECTS(is_finite(to_float(p[i])), invalid_argument,
                        std::string(what) + "[" + std::to_string(i) + "] is not finite");
}
/// Log decays may be -inf (alpha = 0: the state is reset); NaN and +inf are errors.
inline void check_log_decay_host(const float* p, std::int64_t count) {
  if (p == nullptr) return;
  for (std::int64_t i = 0; i < count; ++i)
    HYBRIDCACHE_EXPECTS(is_finite(p[i]) || is_reset(p[i]), invalid_argument,
                        "log_decay[" + std::to_string(i) + "] is NaN or +inf");
}
template <int DK, int DV, class In, class Out>
void check_step_inputs_host(const step_io<In, Out>& io) {
  HYBRIDCACHE_EXPECTS(io.num_k_heads > 0 && io.num_v_heads % io.num_k_heads == 0, invalid_argument,
                      "step: num_v_heads must be a positive multiple of num_k_heads");
  HYBRIDCACHE_EXPECTS(io.gate_a == nullptr || (io.gate_b && io.a_log && io.dt_bias), invalid_argument,
                      "step: fused gating needs gate_a, gate_b, a_log and dt_bias together");
#if !defined(NDEBUG)
  const std::int64_t tokens = static_cast<std::int64_t>(io.batch) * io.new_tokens;
  check_finite_host("q", io.q, tokens * io.num_k_heads * DK);
  check_finite_host("k", io.k, tokens * io.num_k_heads * DK);
  check_finite_host("v", io.v, tokens * io.num_v_heads * DV);
  check_log_decay_host(io.log_decay, tokens * io.num_v_heads);
  check_finite_host("beta", io.beta, tokens * io.num_v_heads);
  check_finite_host("gate_a", io.gate_a, tokens * io.num_v_heads);
  check_finite_host("gate_b", io.gate_b, tokens * io.num_v_heads);
#endif
}
}  // namespace detail

/// Fills the buffer of `slot` (opened KV-only, cursor 0) with `tokens` prefilled tokens: raw
/// keys k [tokens][H][d_k], u [tokens][HV][d_v] (prefill_io::u_out), g [tokens][HV]. Then call
/// `kv_buffer_table::advance(slot, tokens)` (tokens < the crossover, so nothing folds).
template <class In, class ValueT>
void kv_buffer_append_host(const kv_buffer_ref<In, ValueT>& buf, int slot, int tokens, const In* k, const float* u,
                           const float* g) {
  const int width = std::max(buf.key_dim, buf.value_dim);
  for (int t = 0; t < tokens; ++t)
    for (int hv = 0; hv < buf.num_v_heads; ++hv)
      for (int c = 0; c < width; ++c)
        append_token_item(buf, slot, t, k + static_cast<std::int64_t>(t) * buf.num_k_heads * buf.key_dim,
                          u + static_cast<std::int64_t>(t) * buf.num_v_heads * buf.value_dim,
                          g ? g + static_cast<std::int64_t>(t) * buf.num_v_heads : nullptr, hv, c);
}

/// Recurrent decode / per-draft-state verification on the host.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
void recurrent_step_host(const step_io<In, Out>& io, float* intermediate = nullptr) {
  detail::check_step_inputs_host<DK, DV>(io);
  for (int b = 0; b < io.batch; ++b)
    for (int hv = 0; hv < io.num_v_heads; ++hv) {
      recurrent_program<Rule, Layout, DK, DV, In, Out> p{io, intermediate};
      if (!p.init(b, hv)) continue;
      p.prepare(serial_group{});
      p.rows(0, 1, serial_group{});
    }
}

/// KVBuffer decode (`decode`, n = 1) or draft verification on the host. The caller has run
/// `kv_buffer_table::check_step` and advances the table afterwards.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out, class ValueT>
void kv_step_host(const step_io<In, Out>& io, const kv_buffer_ref<In, ValueT>& buf, int flush_interval, int crossover,
                  bool decode) {
  detail::check_step_inputs_host<DK, DV>(io);
  HYBRIDCACHE_EXPECTS(!decode || io.new_tokens == 1, invalid_argument, "kv_step: decode takes one token per entry");
  workspace_buffer ws;
  for (int b = 0; b < io.batch; ++b)
    for (int hv = 0; hv < io.num_v_heads; ++hv) {
      kv_step_program<Rule, Layout, DK, DV, In, Out, ValueT> p{io, buf, flush_interval, crossover, decode};
      if (!p.init(b, hv)) continue;
      workspace_carver w{ws.get(p.workspace_bytes(p.total, p.n, 1))};
      p.carve(w, 1);
      p.positions(serial_group{});
      for (int i = 0; i < p.dot_items(); ++i) p.dots(i, serial_group{});
      for (int i = 0; i < p.weight_items(); ++i) p.weights(i);
      for (int c = 0; c < p.column_items(); ++c) p.columns(c);
      p.rows(0, 1, p.row_scratch(0), serial_group{});
    }
}

/// Commit of accepted draft prefixes on the host (before `kv_buffer_table::advance`).
template <class Rule, state_layout Layout, int DK, int DV, class In, class ValueT>
void kv_commit_host(const std::int32_t* slots, const std::int32_t* accepted, int batch, int num_k_heads,
                    int num_v_heads, float* states, const kv_buffer_ref<In, ValueT>& buf, const qk_options& qk,
                    int flush_interval, int crossover) {
  workspace_buffer ws;
  for (int b = 0; b < batch; ++b)
    for (int hv = 0; hv < num_v_heads; ++hv) {
      kv_commit_program<Rule, Layout, DK, DV, In, ValueT> p{slots, accepted, num_k_heads, num_v_heads, states, buf,
                                                            qk, flush_interval, crossover};
      if (!p.init(b, hv)) continue;
      workspace_carver w{ws.get(p.workspace_bytes(p.total))};
      p.carve(w);
      for (int j = 0; j < p.total; ++j) p.dots(j, serial_group{});
      p.rows(0, 1, serial_group{});
    }
}

}  // namespace hybridcache::attention
