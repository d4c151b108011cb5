// hybridcache/attention/linear_attention_common.hpp
//
// Vocabulary shared by every linear-attention / Gated DeltaNet form: state layouts, a view
// of one head's state, the update rules, cooperative groups, per-row primitives, the
// Qwen3-Next gating and q/k preparation.
//
// Conventions (anchors/linear_attention.md §0): the math is written as in
// flash-linear-attention, S is d_k x d_v, `S_t = alpha_t S_{t-1} + k_t u_t^T`, `o_t = S_t^T q_t`.
// A "row" below is one value index c in [0, d_v): everything about column c of S
// (x = S^T k, o = S^T q, the update) needs only S[:, c], so a head decomposes into d_v
// independent rows plus a few per-head scalars (key/query dot products, decays). The host
// reference runs rows in a loop with `serial_group`; the kernels hand rows to warps whose 32
// lanes split the d_k elements (`warp_group` in linear_attention_kernels.cuh). The same
// functions are therefore the device code and the host reference.
//
// This header includes no CUDA header: it compiles with g++, clang++ and nvcc.
#pragma once

#include <cmath>
#include <cstdint>

#include "hybridcache/core/config.hpp"
#include "hybridcache/attention/numeric.hpp"

namespace hybridcache::cuda {

/// How one head's d_k x d_v fp32 state is stored.
enum class state_layout : unsigned char {
  k_major,  ///< [K][V], V contiguous: flash-linear-attention's `[B, H, K, V]`
  v_major,  ///< [V][K], K contiguous: SGLang/vLLM state pools `[slot, HV, V, K]`
};

/// Mutable view of one head's fp32 state (d_k x d_v elements, contiguous).
template <state_layout Layout, int DK, int DV>
struct state_ref {
  static_assert(DK > 0 && DV > 0, "state_ref: head dims must be positive");
  static constexpr int key_dim = DK;
  static constexpr int value_dim = DV;
  static constexpr state_layout layout = Layout;
  static constexpr std::int64_t elements = static_cast<std::int64_t>(DK) * DV;

  float* data = nullptr;

  /// Element S[i][c] (i over keys, c over values) in fla's convention.
  HYBRIDCACHE_HD_INLINE float& operator()(int i, int c) const {
    if constexpr (Layout == state_layout::k_major) return data[static_cast<std::int64_t>(i) * DV + c];
    else return data[static_cast<std::int64_t>(c) * DK + i];
  }
};

/// Plain linear attention: the buffered value is v itself (`u_t = v_t`).
struct linear_rule {
  static constexpr bool delta = false;
};
/// Gated delta rule: `u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t)`.
struct delta_rule {
  static constexpr bool delta = true;
};

/// A cooperative group of one thread: the host reference (and any single-thread caller).
/// Models the group interface the row primitives use: `size`, `rank()`, `sum()`, `sync()`.
struct serial_group {
  static constexpr int size = 1;
  HYBRIDCACHE_HD_INLINE int rank() const { return 0; }
  HYBRIDCACHE_HD_INLINE float sum(float x) const { return x; }
  HYBRIDCACHE_HD_INLINE void sync() const {}
};

/// Number of the D elements of a vector one member of a group of `GroupSize` holds
/// (member r holds elements r, r + GroupSize, ...).
template <int D, int GroupSize>
inline constexpr int slice_len = (D + GroupSize - 1) / GroupSize;

/// How q and k are prepared before use (fla/SGLang semantics: q_hat = q/||q|| * scale,
/// k_hat = k/||k||, with ||x|| = sqrt(sum x^2 + eps) when `l2_normalize`).
struct qk_options {
  bool l2_normalize = false;  ///< Qwen3-Next: true
  float scale = 1.0f;         ///< applied to q only; Qwen3-Next: 1/sqrt(d_k)
  float eps = 1e-6f;          ///< inside the square root (fla, SGLang, vLLM)
};

/// Qwen3-Next's preparation for key head dim `dk`: L2-normalised q, k; q scaled by 1/sqrt(dk).
inline qk_options qwen3_next_qk(int dk) {
  return qk_options{true, 1.0f / std::sqrt(static_cast<float>(dk)), 1e-6f};
}

/// Multiplier that turns a raw vector with squared norm `sum_sq` into its prepared form.
HYBRIDCACHE_HD_INLINE float prep_factor(float sum_sq, bool l2, float scale, float eps) {
  return l2 ? scale / sqrtf(sum_sq + eps) : scale;
}

/// softplus with PyTorch's threshold 20 (`x > 20 -> x`).
HYBRIDCACHE_HD_INLINE float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/// Logistic sigmoid.
HYBRIDCACHE_HD_INLINE float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/// Qwen3-Next log-decay `g = -exp(A_log) * softplus(a + dt_bias)` (so alpha = exp(g) <= 1).
HYBRIDCACHE_HD_INLINE float qwen3_next_log_decay(float a_log, float a, float dt_bias) {
  return -expf(a_log) * softplus(a + dt_bias);
}

/// Qwen3-Next write strength `beta = sigmoid(b)` (kept in fp32, as vLLM after PR #53877).
HYBRIDCACHE_HD_INLINE float qwen3_next_beta(float b) { return sigmoid(b); }

/// Grouped value heads: value head `hv` reads key/query head `hv / (HV / H)`.
HYBRIDCACHE_HD_INLINE int key_head_of(int hv, int num_k_heads, int num_v_heads) {
  return hv / (num_v_heads / num_k_heads);
}

// ---- per-row primitives (a group's slice of one d_k-long vector lives in registers) ----

/// Loads `raw[0..D)` (any I/O type) times `mul` into this member's slice; padding is 0.
template <int D, class Group, class T>
HYBRIDCACHE_HD_INLINE void load_slice(const T* raw, float mul, float (&x)[slice_len<D, Group::size>],
                                      const Group& g) {
  HYBRIDCACHE_UNROLL
  for (int e = 0; e < slice_len<D, Group::size>; ++e) {
    const int i = g.rank() + e * Group::size;
    x[e] = i < D ? to_float(raw[i]) * mul : 0.0f;
  }
}

/// Dot product of two slices, summed over the group (every member gets the sum).
template <int N, class Group>
HYBRIDCACHE_HD_INLINE float group_dot(const float (&a)[N], const float (&b)[N], const Group& g) {
  float acc = 0.0f;
  HYBRIDCACHE_UNROLL
  for (int e = 0; e < N; ++e) acc += a[e] * b[e];
  return g.sum(acc);
}

/// Squared norm of raw[0..D) summed over the group: the input of `prep_factor`.
template <int D, class Group, class T>
HYBRIDCACHE_HD_INLINE float group_sum_sq(const T* raw, const Group& g) {
  float x[slice_len<D, Group::size>];
  load_slice<D>(raw, 1.0f, x, g);
  return group_dot(x, x, g);
}

/// Loads the prepared slice of a query (`is_query`) or key vector.
template <int D, class Group, class T>
HYBRIDCACHE_HD_INLINE void load_prepared(const T* raw, const qk_options& opt, bool is_query,
                                         float (&x)[slice_len<D, Group::size>], const Group& g) {
  const float f = prep_factor(group_sum_sq<D>(raw, g), opt.l2_normalize, is_query ? opt.scale : 1.0f, opt.eps);
  load_slice<D>(raw, f, x, g);
}

/// Loads this member's slice of column `c` of a state.
template <class State, class Group>
HYBRIDCACHE_HD_INLINE void load_state_row(const State& s, int c, float (&x)[slice_len<State::key_dim, Group::size>],
                                          const Group& g) {
  HYBRIDCACHE_UNROLL
  for (int e = 0; e < slice_len<State::key_dim, Group::size>; ++e) {
    const int i = g.rank() + e * Group::size;
    x[e] = i < State::key_dim ? s(i, c) : 0.0f;
  }
}

/// Stores this member's slice of column `c` of a state.
template <class State, class Group>
HYBRIDCACHE_HD_INLINE void store_state_row(const State& s, int c, const float (&x)[slice_len<State::key_dim, Group::size>],
                                           const Group& g) {
  HYBRIDCACHE_UNROLL
  for (int e = 0; e < slice_len<State::key_dim, Group::size>; ++e) {
    const int i = g.rank() + e * Group::size;
    if (i < State::key_dim) s(i, c) = x[e];
  }
}

/// The corrected value of the delta rule, `u = beta (v - x)`, where the caller has already
/// accumulated `x = alpha S^T k` (recurrent) or its chunk/buffer reconstruction. One
/// spelling for every form, so B = 1 buffered decode is bit-identical to recurrent decode.
HYBRIDCACHE_HD_INLINE float delta_value(float v, float beta, float x) { return beta * (v - x); }

/// One state-row update `s = alpha s + k u` (the recurrent step and every fold use it).
template <int N>
HYBRIDCACHE_HD_INLINE void fold_row(float (&s)[N], float alpha, const float (&k)[N], float u) {
  HYBRIDCACHE_UNROLL
  for (int e = 0; e < N; ++e) s[e] = alpha * s[e] + k[e] * u;
}

/// One recurrent step on row slice `s` for prepared `k`, `q`: returns o_t[c].
/// Linear rule: `s = alpha s + k v`; delta rule: `u = beta (v - alpha k.s)`, `s = alpha s + k u`.
template <class Rule, int N, class Group>
HYBRIDCACHE_HD_INLINE float recurrent_row_step(float (&s)[N], const float (&k)[N], const float (&q)[N], float v,
                                               float log_decay, float beta, const Group& g, float* u_out = nullptr) {
  const float alpha = expf(log_decay);
  float u = v;
  if constexpr (Rule::delta) {
    const float x = alpha * group_dot(s, k, g);
    u = delta_value(v, beta, x);
  }
  if (u_out != nullptr) *u_out = u;
  fold_row(s, alpha, k, u);
  return group_dot(s, q, g);
}

}  // namespace hybridcache::cuda
