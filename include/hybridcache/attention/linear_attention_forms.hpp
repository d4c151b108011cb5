// hybridcache/attention/linear_attention_forms.hpp
//
// Per-head forms of linear attention (optional scalar decay) and Gated DeltaNet: recurrent,
// chunkwise (UT transform) and parallel, plus state checkpoints at requested positions
// (Marconi's state capture during chunked prefill).
//
// Every form is a `__host__ __device__` template over the rule (linear_rule / delta_rule),
// the state layout, d_k, d_v, and the I/O element type; accumulation is fp32. A head is
// processed as per-head scalar phases followed by independent rows (value columns), see
// linear_attention_common.cuh. The host drivers at the bottom run the phases in order with
// one thread; the kernels run the same phase functions with a CTA (warps over rows and
// items, a __syncthreads between phases). Equations: anchors/linear_attention.md §1.1, §2.1-2.3.
//
// Cost per head (T tokens, chunk C, d = d_k = d_v): recurrent O(T d^2) flops, state read
// and written once; chunkwise O(T d^2 + T C d + T C^2) flops; parallel = chunkwise with C = T,
// O(T^2 d + T^3). No allocation except in the convenience host drivers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/attention/linear_attention_common.hpp"

namespace hybridcache::cuda {

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
  const float* log_decay = nullptr;  ///< g_t <= 0 (alpha = exp(g)); nullptr: no decay
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

/// Recurrent form over one head's sequence, rows [row_begin, d_v) step row_step: updates the
/// state in place, writes every output, and emits checkpoints (`start` = absolute position of
/// token 0). O(T d_k) per row.
template <class Rule, class State, class In, class Out, class Group>
HYBRIDCACHE_HD_INLINE void recurrent_rows(const head_input<In>& in, const head_output<Out>& out, const State& s_ref,
                                          const qk_options& opt, std::int64_t start, const checkpoint_sink& ck,
                                          int row_begin, int row_step, const Group& g) {
  constexpr int DK = State::key_dim;
  constexpr int N = slice_len<DK, Group::size>;
  for (int c = row_begin; c < State::value_dim; c += row_step) {
    float s[N];
    load_state_row(s_ref, c, s, g);
    int next = 0;
    while (next < ck.count && ck.positions[next] < start) ++next;
    auto emit = [&](std::int64_t pos) {
      while (next < ck.count && ck.positions[next] == pos) {
        store_state_row(State{ck.states + next * ck.state_stride}, c, s, g);
        ++next;
      }
    };
    emit(start);
    for (int t = 0; t < in.length; ++t) {
      float k[N], q[N];
      load_prepared<DK>(in.k_at(t), opt, false, k, g);
      load_prepared<DK>(in.q_at(t), opt, true, q, g);
      float u = 0.0f;
      const float o = recurrent_row_step<Rule>(s, k, q, in.v_at(t, c), in.g_at(t), in.beta_at(t), g, &u);
      if (g.rank() == 0) {
        out.o[t * out.stride + c] = from_float<Out>(o);
        if (out.u != nullptr) out.u[t * out.u_stride + c] = u;
      }
      emit(start + t + 1);
    }
    store_state_row(s_ref, c, s, g);
  }
}

/// Per-chunk scratch of the chunkwise form (C = chunk capacity): cumulative log decays,
/// q/k normalisation factors, betas, the strictly-lower `A`, `T = (I + A)^{-1} diag(beta)`,
/// `P = (Q K^T) ⊙ Gamma`, and 3*C floats of row scratch per row group.
struct chunk_workspace {
  float* cum_decay = nullptr;  ///< G_r = sum_{i<=r} g_i within the chunk
  float* k_factor = nullptr;
  float* q_factor = nullptr;
  float* beta = nullptr;
  float* a = nullptr;  ///< C x C: raw K K^T, then A
  float* t = nullptr;  ///< C x C
  float* p = nullptr;  ///< C x C: raw Q K^T, then P
  float* rows = nullptr;  ///< row_groups x 3C
  int capacity = 0;

  /// Floats needed for chunk capacity `c` and `row_groups` concurrent row groups.
  HYBRIDCACHE_HD_INLINE static std::int64_t floats(int c, int row_groups) {
    return 4 * static_cast<std::int64_t>(c) + 3 * static_cast<std::int64_t>(c) * c +
           3 * static_cast<std::int64_t>(c) * row_groups;
  }
  /// Carves the workspace out of `base` (which holds `floats(c, row_groups)` floats).
  HYBRIDCACHE_HD_INLINE static chunk_workspace carve(float* base, int c) {
    chunk_workspace w;
    w.capacity = c;
    w.cum_decay = base;
    w.k_factor = base + c;
    w.q_factor = base + 2 * c;
    w.beta = base + 3 * c;
    w.a = base + 4 * c;
    w.t = w.a + c * c;
    w.p = w.t + c * c;
    w.rows = w.p + c * c;
    return w;
  }
};

/// The chunkwise form of one chunk [t0, t0 + len) of one head, as phases:
///   1. `dots`     items (r, j), r, j < len: raw k_r.k_j (j < r), q_r.k_j (j <= r), norms;
///                 item 0 also forms the cumulative decays and betas;
///   2. `weights`  items (r, j): A = strictLower(diag(beta)(Gamma ⊙ K K^T)), P = (Q K^T) ⊙ Gamma;
///   3. `solve`    columns c of T = (I + A)^{-1} diag(beta) by forward substitution (delta rule);
///   4. `rows`     per value column: U = T (V - diag(gamma) K S_0) (delta) or V (linear),
///                 O = diag(gamma) Q S_0 + P U, then the state is rolled forward token by token
///                 (`s = alpha_j s + k_j u_j`), emitting checkpoints that fall inside the chunk.
/// Consecutive phases need a barrier between them; items of one phase are independent.
template <class Rule, class State, class In, class Out>
struct chunk_program {
  static constexpr int DK = State::key_dim;
  static constexpr int DV = State::value_dim;

  head_input<In> in;  ///< the whole sequence (tokens indexed from the sequence start)
  head_output<Out> out;
  State state;
  qk_options opt;
  chunk_workspace ws;
  int t0 = 0;   ///< first token of the chunk (index into `in`)
  int len = 0;  ///< tokens in the chunk (<= ws.capacity)

  HYBRIDCACHE_HD_INLINE int items() const { return len * len; }

  template <class Group>
  HYBRIDCACHE_HD_INLINE void dots(int item, const Group& g) const {
    const int r = item / len, j = item % len;
    if (item == 0) {
      float acc = 0.0f;
      for (int i = 0; i < len; ++i) {
        acc += in.g_at(t0 + i);
        if (g.rank() == 0) {
          ws.cum_decay[i] = acc;
          ws.beta[i] = in.beta_at(t0 + i);
        }
      }
    }
    if (j > r) return;
    float kr[slice_len<DK, Group::size>], kj[slice_len<DK, Group::size>], qr[slice_len<DK, Group::size>];
    load_slice<DK>(in.k_at(t0 + r), 1.0f, kr, g);
    load_slice<DK>(in.k_at(t0 + j), 1.0f, kj, g);
    load_slice<DK>(in.q_at(t0 + r), 1.0f, qr, g);
    const float kk = group_dot(kr, kj, g);
    const float qk = group_dot(qr, kj, g);
    float qq = 0.0f;
    if (j == r) qq = group_dot(qr, qr, g);
    if (g.rank() != 0) return;
    const int C = ws.capacity;
    ws.p[r * C + j] = qk;
    if (j < r) ws.a[r * C + j] = kk;
    if (j == r) {
      ws.k_factor[r] = prep_factor(kk, opt.l2_normalize, 1.0f, opt.eps);
      ws.q_factor[r] = prep_factor(qq, opt.l2_normalize, opt.scale, opt.eps);
    }
  }

  HYBRIDCACHE_HD_INLINE void weights(int item) const {
    const int r = item / len, j = item % len;
    if (j > r) return;
    const int C = ws.capacity;
    const float decay = expf(ws.cum_decay[r] - ws.cum_decay[j]);
    ws.p[r * C + j] = decay * ws.p[r * C + j] * ws.q_factor[r] * ws.k_factor[j];
    if (j < r) ws.a[r * C + j] = ws.beta[r] * decay * ws.a[r * C + j] * ws.k_factor[r] * ws.k_factor[j];
  }

  /// Column `c` of T: T[r][c] = beta_r [r == c] - sum_{c <= j < r} A[r][j] T[j][c].
  HYBRIDCACHE_HD_INLINE void solve(int c) const {
    if constexpr (Rule::delta) {
      const int C = ws.capacity;
      for (int r = 0; r < len; ++r) {
        float x = r == c ? ws.beta[r] : 0.0f;
        for (int j = c; j < r; ++j) x -= ws.a[r * C + j] * ws.t[j * C + c];
        ws.t[r * C + c] = r < c ? 0.0f : x;
      }
    }
  }

  /// Row phase for columns [row_begin, d_v) step row_step; `scratch` holds 3C floats owned
  /// by this group. `start` = absolute position of token 0 of `in` (checkpoint positions).
  template <class Group>
  HYBRIDCACHE_HD_INLINE void rows(int row_begin, int row_step, float* scratch, std::int64_t start,
                                  const checkpoint_sink& ck, const Group& g) const {
    constexpr int N = slice_len<DK, Group::size>;
    const int C = ws.capacity;
    float* ks = scratch;       // k_r . s, then y_r
    float* qs = scratch + C;   // q_r . s
    float* u = scratch + 2 * C;
    const std::int64_t chunk_start = start + t0;
    for (int c = row_begin; c < DV; c += row_step) {
      float s[N];
      load_state_row(state, c, s, g);
      for (int r = 0; r < len; ++r) {
        float k[N], q[N];
        load_slice<DK>(in.k_at(t0 + r), ws.k_factor[r], k, g);
        load_slice<DK>(in.q_at(t0 + r), ws.q_factor[r], q, g);
        const float a = group_dot(s, k, g);
        const float b = group_dot(s, q, g);
        if (g.rank() == 0) {
          ks[r] = a;
          qs[r] = b;
        }
      }
      g.sync();
      if constexpr (Rule::delta) {
        for (int r = g.rank(); r < len; r += Group::size) ks[r] = in.v_at(t0 + r, c) - expf(ws.cum_decay[r]) * ks[r];
        g.sync();
        for (int r = g.rank(); r < len; r += Group::size) {
          float x = 0.0f;
          for (int j = 0; j <= r; ++j) x += ws.t[r * C + j] * ks[j];
          u[r] = x;
        }
      } else {
        for (int r = g.rank(); r < len; r += Group::size) u[r] = in.v_at(t0 + r, c);
      }
      g.sync();
      if (out.u != nullptr)
        for (int r = g.rank(); r < len; r += Group::size) out.u[(t0 + r) * out.u_stride + c] = u[r];
      for (int r = g.rank(); r < len; r += Group::size) {
        float o = expf(ws.cum_decay[r]) * qs[r];
        for (int j = 0; j <= r; ++j) o += ws.p[r * C + j] * u[j];
        out.o[(t0 + r) * out.stride + c] = from_float<Out>(o);
      }
      // Roll the state forward through the chunk; checkpoints inside the chunk are the
      // boundary state rolled forward, the one at the chunk end is the new boundary state.
      int next = 0;
      while (next < ck.count && ck.positions[next] <= chunk_start) ++next;
      for (int j = 0; j < len; ++j) {
        float k[N];
        load_slice<DK>(in.k_at(t0 + j), ws.k_factor[j], k, g);
        fold_row(s, expf(in.g_at(t0 + j)), k, u[j]);
        while (next < ck.count && ck.positions[next] == chunk_start + j + 1) {
          store_state_row(State{ck.states + next * ck.state_stride}, c, s, g);
          ++next;
        }
      }
      store_state_row(state, c, s, g);
      g.sync();
    }
  }
};

/// One thread runs the four phases of `p`'s chunk in order (serial_group, no barriers
/// needed): the host drivers below all go through here.
template <class Rule, class State, class In, class Out>
HYBRIDCACHE_HD_INLINE void run_chunk_serial(const chunk_program<Rule, State, In, Out>& p, std::int64_t start,
                                            const checkpoint_sink& ck) {
  for (int i = 0; i < p.items(); ++i) p.dots(i, serial_group{});
  for (int i = 0; i < p.items(); ++i) p.weights(i);
  for (int c = 0; c < p.len; ++c) p.solve(c);
  p.rows(0, 1, p.ws.rows, start, ck, serial_group{});
}

/// Tokens of the chunk that starts at token `t` of a sequence of `length` tokens whose token
/// 0 sits at absolute position `start`: chunks are aligned to absolute multiples of `chunk`,
/// so the first one is shorter when `start` is not aligned.
HYBRIDCACHE_HD_INLINE int aligned_chunk_len(std::int64_t start, int t, int length, int chunk) {
  const std::int64_t abs = start + t;
  const std::int64_t to_boundary = (abs / chunk + 1) * chunk - abs;
  const std::int64_t left = length - t;
  return static_cast<int>(left < to_boundary ? left : to_boundary);
}

/// Inputs of a batched chunked prefill over packed variable-length sequences. Token t of
/// sequence s is row `cu_seqlens[s] + t` of q, k [tokens][H][d_k], v, o [tokens][HV][d_v],
/// log_decay, beta [tokens][HV]. The state of `slots[s]` is the initial state and receives the
/// final state. Checkpoints of sequence s are `checkpoint_positions[checkpoint_offsets[s] ..
/// checkpoint_offsets[s+1])` (absolute positions, ascending), written to
/// `checkpoint_states[i][HV][d_k*d_v]`. Chunks are aligned to absolute multiples of `chunk`.
template <class In, class Out>
struct prefill_io {
  int num_seqs = 0;
  int num_k_heads = 0;
  int num_v_heads = 0;
  int chunk = 64;
  const std::int64_t* cu_seqlens = nullptr;
  const std::int64_t* start_positions = nullptr;
  const std::int32_t* slots = nullptr;
  const In* q = nullptr;
  const In* k = nullptr;
  const In* v = nullptr;
  const float* log_decay = nullptr;
  const float* beta = nullptr;
  Out* o = nullptr;
  float* states = nullptr;
  const std::int64_t* checkpoint_offsets = nullptr;
  const std::int64_t* checkpoint_positions = nullptr;
  float* checkpoint_states = nullptr;
  float* u_out = nullptr;  ///< optional [tokens][HV][d_v]: u (or v) per token, to fill a KV-only buffer
  qk_options qk{};
};

/// One (sequence, value head) of a batched chunked prefill: the chunk program over that
/// head's slice of the packed tensors, its checkpoint sink, and its absolute start position.
/// Shared by the kernel (one CTA per head) and `chunked_prefill_host`.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
struct prefill_head {
  using state_type = state_ref<Layout, DK, DV>;
  chunk_program<Rule, state_type, In, Out> program;
  checkpoint_sink ck;
  std::int64_t start = 0;
  int chunk = 0;
  bool active = false;

  /// `workspace` holds chunk_workspace::floats(io.chunk, row groups) floats.
  HYBRIDCACHE_HD_INLINE static prefill_head bind(const prefill_io<In, Out>& io, int seq, int hv, float* workspace) {
    prefill_head p;
    const int slot = io.slots[seq];
    if (slot < 0) return p;
    p.active = true;
    p.chunk = io.chunk;
    const int h = key_head_of(hv, io.num_k_heads, io.num_v_heads);
    const std::int64_t t0 = io.cu_seqlens[seq];
    const std::int64_t kstride = static_cast<std::int64_t>(io.num_k_heads) * DK;
    const std::int64_t vstride = static_cast<std::int64_t>(io.num_v_heads) * DV;
    head_input<In>& in = p.program.in;
    in.q = io.q + t0 * kstride + h * DK;
    in.k = io.k + t0 * kstride + h * DK;
    in.v = io.v + t0 * vstride + hv * DV;
    in.q_stride = in.k_stride = kstride;
    in.v_stride = vstride;
    in.log_decay = io.log_decay ? io.log_decay + t0 * io.num_v_heads + hv : nullptr;
    in.decay_stride = io.num_v_heads;
    in.beta = io.beta ? io.beta + t0 * io.num_v_heads + hv : nullptr;
    in.beta_stride = io.num_v_heads;
    in.length = static_cast<int>(io.cu_seqlens[seq + 1] - t0);
    p.program.out = head_output<Out>{io.o + t0 * vstride + hv * DV, vstride,
                                     io.u_out ? io.u_out + t0 * vstride + hv * DV : nullptr, vstride};
    p.program.state = state_type{io.states + (static_cast<std::int64_t>(slot) * io.num_v_heads + hv) * state_type::elements};
    p.program.opt = io.qk;
    p.program.ws = chunk_workspace::carve(workspace, io.chunk);
    p.start = io.start_positions[seq];
    if (io.checkpoint_offsets != nullptr) {
      const std::int64_t first = io.checkpoint_offsets[seq];
      p.ck.positions = io.checkpoint_positions + first;
      p.ck.count = static_cast<int>(io.checkpoint_offsets[seq + 1] - first);
      p.ck.state_stride = static_cast<std::int64_t>(io.num_v_heads) * state_type::elements;
      p.ck.states = io.checkpoint_states + first * p.ck.state_stride + hv * state_type::elements;
    }
    return p;
  }

  /// A checkpoint at the start position is the initial state: elements [tid, n) step nthreads.
  HYBRIDCACHE_HD_INLINE void copy_start_checkpoints(int tid, int nthreads) const {
    for (int i = 0; i < ck.count; ++i)
      if (ck.positions[i] == start)
        for (std::int64_t e = tid; e < state_type::elements; e += nthreads)
          ck.states[i * ck.state_stride + e] = program.state.data[e];
  }

  /// Points the program at the chunk starting at token t (chunks aligned to absolute
  /// multiples of the chunk size, so the first one is shorter when `start` is not aligned).
  HYBRIDCACHE_HD_INLINE void select_chunk(int t) {
    program.t0 = t;
    program.len = aligned_chunk_len(start, t, program.in.length, chunk);
  }
};

/// Checks a checkpoint plan against a prefill of `length` tokens starting at absolute
/// position `start` with chunk `chunk`: positions ascending in [start, start + length], and
/// each site's `chunk_boundary`/`roll_forward` equal to what the chunked scan does here
/// (boundary = max(start, largest multiple of chunk <= position)). `Site` is any type with
/// `position`, `chunk_boundary`, `roll_forward` (e.g. prefix::checkpoint_site).
/// @throw invalid_argument naming the first bad site.
template <class Site>
void validate_checkpoint_sites(const Site* sites, std::size_t count, std::int64_t start, std::int64_t length,
                               int chunk) {
  HYBRIDCACHE_EXPECTS(chunk > 0, invalid_argument, "checkpoint plan: chunk must be positive");
  std::int64_t prev = start - 1;
  for (std::size_t i = 0; i < count; ++i) {
    const auto& s = sites[i];
    const std::string at = "checkpoint site " + std::to_string(i) + " (position " + std::to_string(s.position) + ")";
    HYBRIDCACHE_EXPECTS(s.position > prev, invalid_argument, at + ": positions must be strictly ascending");
    HYBRIDCACHE_EXPECTS(s.position >= start && s.position <= start + length, invalid_argument,
                        at + ": outside the prefill [" + std::to_string(start) + ", " +
                            std::to_string(start + length) + "]");
    const std::int64_t boundary = std::max(start, s.position / chunk * chunk);
    HYBRIDCACHE_EXPECTS(s.chunk_boundary == boundary && s.roll_forward == s.position - boundary, invalid_argument,
                        at + ": boundary/roll-forward do not match chunk " + std::to_string(chunk));
    prev = s.position;
  }
}

/// The checkpoint positions of a prefix-cache plan (any type with `prefill_start`, `chunk`
/// and `sites`, e.g. prefix::checkpoint_plan), validated against a prefill of `length` tokens
/// with the scan's chunk `chunk`: the input of `chunkwise_head` / `launch_chunked_prefill`.
/// @throw invalid_argument when the plan was made for another chunk size or does not fit.
template <class Plan>
std::vector<std::int64_t> checkpoint_positions(const Plan& plan, std::int64_t length, int chunk) {
  HYBRIDCACHE_EXPECTS(plan.chunk == chunk, invalid_argument,
                      "checkpoint plan made for chunk " + std::to_string(plan.chunk) + ", the prefill uses " +
                          std::to_string(chunk));
  validate_checkpoint_sites(plan.sites.data(), plan.sites.size(), plan.prefill_start, length, chunk);
  std::vector<std::int64_t> out;
  out.reserve(plan.sites.size());
  for (const auto& site : plan.sites) out.push_back(site.position);
  return out;
}

// ---------------------------------------------------------------------------------------
// Host drivers (one thread): the reference path of the tests and a CPU fallback.
// ---------------------------------------------------------------------------------------

/// Recurrent form over one head on the host.
template <class Rule, class State, class In, class Out>
void recurrent_head(const head_input<In>& in, const head_output<Out>& out, const State& s, const qk_options& opt,
                    std::int64_t start = 0, const checkpoint_sink& ck = {}) {
  recurrent_rows<Rule>(in, out, s, opt, start, ck, 0, 1, serial_group{});
}

/// Chunkwise form over one head on the host. Chunks are aligned to absolute multiples of
/// `chunk` (the first one is shorter when `start` is not aligned), as the prefix cache's
/// checkpoint plan assumes.
template <class Rule, class State, class In, class Out>
void chunkwise_head(const head_input<In>& in, const head_output<Out>& out, const State& s, const qk_options& opt,
                    int chunk, std::int64_t start = 0, const checkpoint_sink& ck = {}) {
  HYBRIDCACHE_EXPECTS(chunk > 0, invalid_argument, "chunkwise_head: chunk must be positive");
  std::vector<float> buf(static_cast<std::size_t>(chunk_workspace::floats(chunk, 1)));
  chunk_program<Rule, State, In, Out> p{in, out, s, opt, chunk_workspace::carve(buf.data(), chunk), 0, 0};
  // A checkpoint at the start position is the initial state itself.
  for (int i = 0; i < ck.count; ++i)
    if (ck.positions[i] == start)
      std::copy(s.data, s.data + State::elements, ck.states + i * ck.state_stride);
  for (int t = 0; t < in.length; t += p.len) {
    p.t0 = t;
    p.len = aligned_chunk_len(start, t, in.length, chunk);
    run_chunk_serial(p, start, ck);
  }
}

/// Batched chunked prefill on the host: the kernel's program, one thread, every
/// (sequence, value head) in turn.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
void chunked_prefill_host(const prefill_io<In, Out>& io) {
  HYBRIDCACHE_EXPECTS(io.chunk > 0, invalid_argument, "chunked_prefill_host: chunk must be positive");
  std::vector<float> ws(static_cast<std::size_t>(chunk_workspace::floats(io.chunk, 1)));
  for (int seq = 0; seq < io.num_seqs; ++seq)
    for (int hv = 0; hv < io.num_v_heads; ++hv) {
      auto head = prefill_head<Rule, Layout, DK, DV, In, Out>::bind(io, seq, hv, ws.data());
      if (!head.active) continue;
      head.copy_start_checkpoints(0, 1);
      auto& p = head.program;
      for (int t = 0; t < p.in.length; t += p.len) {
        head.select_chunk(t);
        run_chunk_serial(p, head.start, head.ck);
      }
    }
}

/// Parallel form over one head on the host: the whole sequence as one chunk,
/// O = diag(gamma) Q S_0 + (Q K^T ⊙ Gamma) U (anchor §1.1, §2.3); also leaves the final state.
template <class Rule, class State, class In, class Out>
void parallel_head(const head_input<In>& in, const head_output<Out>& out, const State& s, const qk_options& opt) {
  if (in.length == 0) return;
  std::vector<float> buf(static_cast<std::size_t>(chunk_workspace::floats(in.length, 1)));
  chunk_program<Rule, State, In, Out> p{in, out, s, opt, chunk_workspace::carve(buf.data(), in.length), 0, in.length};
  run_chunk_serial(p, 0, checkpoint_sink{});
}

}  // namespace hybridcache::cuda
