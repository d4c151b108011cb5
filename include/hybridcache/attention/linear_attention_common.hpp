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
#include <cstring>

#include "hybridcache/core/config.hpp"
#include "hybridcache/attention/numeric.hpp"

namespace hybridcache::attention {

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
/// Models the group interface the row primitives use: `size`, `rank()`, `sum()`, `sync()`,
/// and the raw exchanges `shfl_up` / `shfl_idx` the scans use (a group of one keeps its own
/// value, as a lane whose source is out of range does on the device).
struct serial_group {
  static constexpr int size = 1;
  HYBRIDCACHE_HD_INLINE int rank() const { return 0; }
  HYBRIDCACHE_HD_INLINE float sum(float x) const { return x; }
  HYBRIDCACHE_HD_INLINE void sync() const {}
  template <class T>
  HYBRIDCACHE_HD_INLINE T shfl_up(T v, int) const {
    return v;
  }
  template <class T>
  HYBRIDCACHE_HD_INLINE T shfl_idx(T v, int) const {
    return v;
  }
};

/// Number of the D elements of a vector one member of a group of `GroupSize` holds.
template <int D, int GroupSize>
inline constexpr int slice_len = (D + GroupSize - 1) / GroupSize;

/// Elements a member holds side by side: 4 (one 128-bit load) when D is a multiple of
/// 4 x GroupSize, 2 when of 2 x GroupSize, else 1.
template <int D, int GroupSize>
inline constexpr int vec_width = D % (4 * GroupSize) == 0 ? 4 : (D % (2 * GroupSize) == 0 ? 2 : 1);

/// Which element of a D-vector slot `e` of member `rank` holds: runs of vec_width elements,
/// member r holding [r W, r W + W) of every block of GroupSize x W (for a group of one:
/// element e). Every slice of one program uses this map, so slices combine element-wise.
template <int D, int GroupSize>
HYBRIDCACHE_HD_INLINE constexpr int slice_index(int rank, int e) {
  constexpr int W = vec_width<D, GroupSize>;
  return (e / W) * (GroupSize * W) + rank * W + e % W;
}

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

// ---- rounding the host and the device agree on ------------------------------------------

/// a * b + c rounded once, on the host (std::fma) and on the device (__fmaf_rn). Every
/// product-sum that two forms must compute identically is written with it: nvcc contracts a
/// plain `a * b + c` into an FMA wherever it likes and g++ does not, so without it the
/// kernels and the host reference (and two kernels that must agree bit for bit, such as
/// KVBuffer decode with B = 1 and recurrent decode) would round differently.
HYBRIDCACHE_HD_INLINE float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// a * b rounded once and never fused into an addition that follows (__fmul_rn on the device).
HYBRIDCACHE_HD_INLINE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// ---- log decays with resets ---------------------------------------------------------------

/// Prefix of log decays at position j of a run (a chunk, or a buffer since its flush):
/// `seg` = the last position <= j whose g is -inf (alpha = 0: the state is reset there), -1
/// if none; `cum` = the sum of g over (seg, j]. The decay between two positions is then
/// exp of a difference of sums that never include -inf (which would give -inf - -inf = NaN).
struct decay_prefix {
  float cum = 0.0f;
  int seg = -1;
};

/// True for a log decay that resets the state (alpha = exp(g) = 0).
HYBRIDCACHE_HD_INLINE bool is_reset(float g) { return g < -3.40282347e+38f; }  // -inf only

/// The prefix of position `j` alone.
HYBRIDCACHE_HD_INLINE decay_prefix decay_item(float g, int j) {
  return is_reset(g) ? decay_prefix{0.0f, j} : decay_prefix{g, -1};
}

/// `right` extended by the positions of `left` before it (associative: the scans use it).
HYBRIDCACHE_HD_INLINE decay_prefix combine(decay_prefix left, decay_prefix right) {
  return right.seg >= 0 ? right : decay_prefix{left.cum + right.cum, left.seg};
}

/// prod_{j < i <= r} alpha_i for positions j <= r with prefixes pr (at r) and cum_j (at j).
HYBRIDCACHE_HD_INLINE float decay_between(decay_prefix pr, float cum_j, int j) {
  return pr.seg > j ? 0.0f : expf(pr.cum - cum_j);
}

/// prod_{0 <= i <= r} alpha_i: the decay of the state the run starts from.
HYBRIDCACHE_HD_INLINE float decay_from_start(decay_prefix pr) { return pr.seg >= 0 ? 0.0f : expf(pr.cum); }

/// Inclusive scan of the log decays g_at(0..n) into cum[j], seg[j] (seg stored as a float,
/// exact below 2^24): members take positions rank, rank + size, ... in tiles of the group's
/// size, Hillis-Steele over `shfl_up` within a tile, the tile's last prefix carried on.
template <class Group, class GAt>
HYBRIDCACHE_HD_INLINE void scan_log_decays(int n, const GAt& g_at, float* cum, float* seg, const Group& g) {
  decay_prefix carry{};
  for (int base = 0; base < n; base += Group::size) {
    const int j = base + g.rank();
    decay_prefix x = j < n ? decay_item(g_at(j), j) : decay_prefix{};
    for (int d = 1; d < Group::size; d <<= 1) {
      const decay_prefix o{g.shfl_up(x.cum, d), g.shfl_up(x.seg, d)};
      if (g.rank() >= d) x = combine(o, x);
    }
    x = combine(carry, x);
    if (j < n) {
      cum[j] = x.cum;
      seg[j] = static_cast<float>(x.seg);
    }
    carry = decay_prefix{g.shfl_idx(x.cum, Group::size - 1), g.shfl_idx(x.seg, Group::size - 1)};
  }
}

/// The prefix stored at position j by `scan_log_decays`.
HYBRIDCACHE_HD_INLINE decay_prefix prefix_at(const float* cum, const float* seg, int j) {
  return decay_prefix{cum[j], static_cast<int>(seg[j])};
}

// ---- per-row primitives (a group's slice of one d_k-long vector lives in registers) ----

/// Loads W consecutive floats from `p` into `out` (one 128-bit or 64-bit load on the device;
/// `p` must be aligned to W floats, which the host build checks).
template <int W>
HYBRIDCACHE_HD_INLINE void load_vector(const float* p, float* out) {
#if defined(__CUDA_ARCH__)
  if constexpr (W == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else if constexpr (W == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    out[0] = v.x, out[1] = v.y;
  } else {
    out[0] = *p;
  }
#else
  HYBRIDCACHE_ASSERT(reinterpret_cast<std::uintptr_t>(p) % (W * sizeof(float)) == 0);
  std::memcpy(out, p, W * sizeof(float));
#endif
}

/// Stores W consecutive floats (the counterpart of `load_vector`).
template <int W>
HYBRIDCACHE_HD_INLINE void store_vector(float* p, const float* in) {
#if defined(__CUDA_ARCH__)
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  } else if constexpr (W == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(in[0], in[1]);
  } else {
    *p = in[0];
  }
#else
  HYBRIDCACHE_ASSERT(reinterpret_cast<std::uintptr_t>(p) % (W * sizeof(float)) == 0);
  std::memcpy(p, in, W * sizeof(float));
#endif
}

/// Loads `raw[0..D)` (any I/O type) times `mul` into this member's slice; padding is 0.
template <int D, class Group, class T>
HYBRIDCACHE_HD_INLINE void load_slice(const T* raw, float mul, float (&x)[slice_len<D, Group::size>], const Group& g) {
  HYBRIDCACHE_UNROLL
  for (int e = 0; e < slice_len<D, Group::size>; ++e) {
    const int i = slice_index<D, Group::size>(g.rank(), e);
    x[e] = i < D ? to_float(raw[i]) * mul : 0.0f;
  }
}

/// Dot product of two slices, summed over the group (every member gets the sum).
template <int N, class Group>
HYBRIDCACHE_HD_INLINE float group_dot(const float (&a)[N], const float (&b)[N], const Group& g) {
  float acc = 0.0f;
  HYBRIDCACHE_UNROLL
  for (int e = 0; e < N; ++e) acc = fma_rn(a[e], b[e], acc);
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

/// Walks this member's slice of column `c` of a state: for a V-major state whose rows split
/// evenly (d_k a multiple of 64 for a warp) `vector(p, e)` once per W-float piece, `p` its
/// address and `e` its first slice element; otherwise `scalar(i, e)` per slice element, `i`
/// its state row (>= d_k on padding elements). The one walk behind `load_state_row` and
/// `store_state_row`.
template <class State, class Group, class Vector, class Scalar>
HYBRIDCACHE_HD_INLINE void walk_state_row(const State& s, int c, const Group& g, Vector&& vector, Scalar&& scalar) {
  constexpr int DK = State::key_dim;
  constexpr int W = vec_width<DK, Group::size>;
  if constexpr (State::layout == state_layout::v_major && W > 1 && Group::size > 1) {
    auto* row = &s(0, c);  // const for a read-only state view
    HYBRIDCACHE_UNROLL
    for (int e = 0; e < slice_len<DK, Group::size>; e += W) vector(row + slice_index<DK, Group::size>(g.rank(), e), e);
  } else {
    HYBRIDCACHE_UNROLL
    for (int e = 0; e < slice_len<DK, Group::size>; ++e) scalar(slice_index<DK, Group::size>(g.rank(), e), e);
  }
}

/// Loads this member's slice of column `c` of a state: vector loads where `walk_state_row`
/// walks vectors, scalar loads otherwise (padding reads as 0).
template <class State, class Group>
HYBRIDCACHE_HD_INLINE void load_state_row(const State& s, int c, float (&x)[slice_len<State::key_dim, Group::size>],
                                          const Group& g) {
  constexpr int W = vec_width<State::key_dim, Group::size>;
  walk_state_row(
      s, c, g, [&](const float* p, int e) { load_vector<W>(p, x + e); },
      [&](int i, int e) { x[e] = i < State::key_dim ? s(i, c) : 0.0f; });
}

/// Stores this member's slice of column `c` of a state (vector stores as `load_state_row`).
template <class State, class Group>
HYBRIDCACHE_HD_INLINE void store_state_row(const State& s, int c, const float (&x)[slice_len<State::key_dim, Group::size>],
                                           const Group& g) {
  constexpr int W = vec_width<State::key_dim, Group::size>;
  walk_state_row(
      s, c, g, [&](float* p, int e) { store_vector<W>(p, x + e); },
      [&](int i, int e) {
        if (i < State::key_dim) s(i, c) = x[e];
      });
}

/// The corrected value of the delta rule, `u = beta (v - x)`, where the caller has already
/// accumulated `x = alpha S^T k` (recurrent) or its chunk/buffer reconstruction. One
/// spelling for every form, so B = 1 buffered decode is bit-identical to recurrent decode.
HYBRIDCACHE_HD_INLINE float delta_value(float v, float beta, float x) { return beta * (v - x); }

/// One state-row update `s = alpha s + k u` (the recurrent step and every fold use it),
/// spelled `fma(k, u, alpha * s)` on the host and on the device alike (see `fma_rn`).
template <int N>
HYBRIDCACHE_HD_INLINE void fold_row(float (&s)[N], float alpha, const float (&k)[N], float u) {
  HYBRIDCACHE_UNROLL
  for (int e = 0; e < N; ++e) s[e] = fma_rn(k[e], u, mul_rn(alpha, s[e]));
}

/// One recurrent step on row slice `s` for prepared `k`, `q` and the decay alpha =
/// exp(log_decay) (a decode loop computes it once for all rows): returns o_t[c].
/// Linear rule: `s = alpha s + k v`; delta rule: `u = beta (v - alpha k.s)`, `s = alpha s + k u`.
template <class Rule, int N, class Group>
HYBRIDCACHE_HD_INLINE float recurrent_row_step_alpha(float (&s)[N], const float (&k)[N], const float (&q)[N], float v,
                                                     float alpha, float beta, const Group& g,
                                                     float* u_out = nullptr) {
  float u = v;
  if constexpr (Rule::delta) {
    const float x = mul_rn(alpha, group_dot(s, k, g));
    u = delta_value(v, beta, x);
  }
  if (u_out != nullptr) *u_out = u;
  fold_row(s, alpha, k, u);
  return group_dot(s, q, g);
}

/// The same from the log decay.
template <class Rule, int N, class Group>
HYBRIDCACHE_HD_INLINE float recurrent_row_step(float (&s)[N], const float (&k)[N], const float (&q)[N], float v,
                                               float log_decay, float beta, const Group& g, float* u_out = nullptr) {
  return recurrent_row_step_alpha<Rule>(s, k, q, v, expf(log_decay), beta, g, u_out);
}

}  // namespace hybridcache::attention
