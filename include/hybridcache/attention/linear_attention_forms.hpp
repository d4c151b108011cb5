// hybridcache/attention/linear_attention_forms.hpp
//
// Per-head forms of linear attention (optional scalar decay) and Gated DeltaNet: recurrent,
// chunkwise (UT transform) and parallel, plus state checkpoints at requested positions
// (Marconi's state capture during chunked prefill).
//
// Every form is a `__host__ __device__` template over the rule (linear_rule / delta_rule),
// the state layout, d_k, d_v, and the I/O element type; accumulation is fp32. The recurrent
// form is below; the chunkwise form is the two programs of chunk_programs.hpp (prepare every
// chunk, then the state pass). The host drivers at the bottom run those programs' phases in
// order with one thread; the kernels run the same phase functions with CTAs (kernel_bodies.hpp).
// Equations: anchors/linear_attention.md §1.1, §2.1-2.3.
//
// Cost per head (T tokens, chunk C, d = d_k = d_v): recurrent O(T d^2) flops, state read
// and written once; chunkwise O(T d^2 + T C d + T C^2) flops; parallel = chunkwise with C = T,
// O(T^2 d + T^3). No allocation except in the convenience host drivers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/attention/chunk_programs.hpp"
#include "hybridcache/attention/prefill_io.hpp"
#include "hybridcache/attention/kernel_context.hpp"
#include "hybridcache/attention/linear_attention_common.hpp"

namespace hybridcache::attention {

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

namespace detail {

/// The chunkwise form of one head with one thread, exactly the kernels' phases: every chunk
/// prepared (tables into `tables`), then the state pass over all value columns.
template <class Rule, class State, class In, class Out>
void chunked_head_host(const head_input<In>& in, const head_output<Out>& out, const State& s, const qk_options& opt,
                       int chunk, std::int64_t start, const checkpoint_sink& ck, std::vector<float>& tables,
                       workspace_buffer& ws) {
  constexpr int DK = State::key_dim, DV = State::value_dim;
  const int chunks = chunk_count(start, in.length, chunk);
  const std::int64_t per = chunk_tables::floats(chunk);
  tables.assign(static_cast<std::size_t>(per) * static_cast<std::size_t>(chunks > 0 ? chunks : 1), 0.0f);
  for (int i = 0; i < chunks; ++i) {
    chunk_prepare_program<Rule, DK, In> p{in, opt, chunk_first_token(start, in.length, chunk, i), 0, chunk};
    p.len = aligned_chunk_len(start, p.t0, in.length, chunk);
    workspace_carver w{ws.get(p.workspace_bytes(chunk))};
    p.carve(w);
    p.stage(0, 1);
    p.decays(serial_group{});
    p.gram(0, 1, 0, 1);
    p.weights(0, 1, 0, 1);
    p.solve(0, 1);
    p.export_tables(tables.data() + i * per, 0, 1);
  }
  chunk_scan_program<Rule, State, In, Out> scan{
      .in = in, .out = out, .state = s, .ck = ck, .start = start, .chunk = chunk, .tables = tables.data(), .table_stride = per};
  for (int c0 = 0; c0 < DV; c0 += scan.block_columns) {
    scan.col_begin = c0;
    scan.col_end = c0 + scan.block_columns < DV ? c0 + scan.block_columns : DV;
    workspace_carver w{ws.get(scan.workspace_bytes(chunk))};
    scan.carve(w);
    scan.load_columns(0, 1, serial_group{});
    for (int i = 0; i < chunks; ++i) {
      scan.select_chunk(i);
      scan.stage(i, 0, 1);
      scan.columns(0, 1, serial_group{});
    }
    scan.store_columns(0, 1, serial_group{});
  }
}

}  // namespace detail

/// Chunkwise form over one head on the host. Chunks are aligned to absolute multiples of
/// `chunk` (the first one is shorter when `start` is not aligned), as the prefix cache's
/// checkpoint plan assumes.
template <class Rule, class State, class In, class Out>
void chunkwise_head(const head_input<In>& in, const head_output<Out>& out, const State& s, const qk_options& opt,
                    int chunk, std::int64_t start = 0, const checkpoint_sink& ck = {}) {
  HYBRIDCACHE_EXPECTS(chunk > 0, invalid_argument, "chunkwise_head: chunk must be positive");
  std::vector<float> tables;
  workspace_buffer ws;
  detail::chunked_head_host<Rule>(in, out, s, opt, chunk, start, ck, tables, ws);
}

/// Batched chunked prefill on the host: the kernels' programs, one thread, every
/// (sequence, value head) in turn.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
void chunked_prefill_host(const prefill_io<In, Out>& io) {
  HYBRIDCACHE_EXPECTS(io.chunk > 0, invalid_argument, "chunked_prefill_host: chunk must be positive");
  using state_type = state_ref<Layout, DK, DV>;
  std::vector<float> tables;
  workspace_buffer ws;
  for (int seq = 0; seq < io.num_seqs; ++seq)
    for (int hv = 0; hv < io.num_v_heads; ++hv) {
      const auto head = prefill_head<state_type, In, Out>::bind(io, seq, hv);
      if (!head.active) continue;
      detail::chunked_head_host<Rule>(head.in, head.out, head.state, io.qk, io.chunk, head.start, head.ck, tables, ws);
    }
}

/// Parallel form over one head on the host: the whole sequence as one chunk,
/// O = diag(gamma) Q S_0 + (Q K^T ⊙ Gamma) U (anchor §1.1, §2.3); also leaves the final state.
template <class Rule, class State, class In, class Out>
void parallel_head(const head_input<In>& in, const head_output<Out>& out, const State& s, const qk_options& opt) {
  if (in.length == 0) return;
  std::vector<float> tables;
  workspace_buffer ws;
  detail::chunked_head_host<Rule>(in, out, s, opt, in.length, 0, checkpoint_sink{}, tables, ws);
}

}  // namespace hybridcache::attention
