// hybridcache/attention/kernel_bodies.hpp
//
// The body of every kernel of attention/cuda/, written once against an execution context
// (kernel_context.hpp): the `__global__` functions of linear_attention_kernels.cuh are
// one-line calls of these with the CUDA context, and the tests run the same bodies under the
// CTA emulator (a real thread per lane, barriers, warp shuffles in hardware order, NaN-filled
// shared memory), so the device code is executed on machines without a GPU. Each body comes
// with the launch shape its launcher uses (grid, block, dynamic shared memory).
//
// Batched kernels use a 1-D grid: CTA `block` serves entry block / HV and value head
// block % HV (a batch of any size up to 2^31 / HV entries; gridDim.y would stop at 65,535).
//
// This header includes no CUDA header: it compiles with g++, clang++ and nvcc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "hybridcache/core/config.hpp"
#include "hybridcache/attention/chunk_programs.hpp"
#include "hybridcache/attention/prefill_io.hpp"
#include "hybridcache/attention/decode_programs.hpp"
#include "hybridcache/attention/kernel_context.hpp"
#include "hybridcache/attention/kv_buffer.hpp"
#include "hybridcache/attention/linear_attention_common.hpp"

namespace hybridcache::attention {

namespace kernel_bodies {

/// Whether a decode kernel's rows go to half warps (two rows at once per warp; see
/// half_warp_group): when both halves of every warp get the same number of rows, which an
/// even d_v guarantees (a warp's two halves start one row apart). Recurrent decode and
/// KVBuffer decode split the same way, so their dot products sum in the same order and
/// B = 1 buffered decode stays bit-identical to recurrent decode.
template <int DV>
inline constexpr bool rows_by_half_warps = DV % 2 == 0;

/// Recurrent decode / per-draft-state verification: a CTA per (entry, value head), half warps
/// (or warps) over state rows (`decode_rows_in_flight` rows' loads outstanding per warp).
template <class Ctx, class Program>
HYBRIDCACHE_HD_INLINE void recurrent_step(const Ctx& ctx, Program p) {
  const int hv_count = p.io.num_v_heads;
  if (!p.init(static_cast<int>(ctx.block() / hv_count), static_cast<int>(ctx.block() % hv_count))) return;
  p.prepare(warp_group<Ctx>{ctx});
  if constexpr (rows_by_half_warps<Program::value_dim>) {
    const half_warp_group<Ctx> hg{ctx};
    p.rows(2 * ctx.warp_id() + hg.half(), 2 * kWarps, hg);
  } else {
    p.rows(ctx.warp_id(), kWarps, warp_group<Ctx>{ctx});
  }
}

/// Row groups of a kv_step CTA: two per warp when its rows go to half warps, else one.
template <class Program>
inline constexpr int kv_step_row_groups = rows_by_half_warps<Program::value_dim> ? 2 * kWarps : kWarps;

/// KVBuffer decode / draft verification: items over warps, weights and value columns over
/// threads, rows over half warps (two rows at once per warp).
template <class Ctx, class Program>
HYBRIDCACHE_HD_INLINE void kv_step(const Ctx& ctx, Program p) {
  const int hv_count = p.io.num_v_heads;
  if (!p.init(static_cast<int>(ctx.block() / hv_count), static_cast<int>(ctx.block() % hv_count))) return;
  workspace_carver w{ctx.template shared<std::byte>()};
  p.carve(w, kv_step_row_groups<Program>);
  const warp_group<Ctx> g{ctx};
  const int warp = ctx.warp_id(), tid = static_cast<int>(ctx.thread());
  if (warp == 0) p.positions(g);
  for (int i = warp; i < p.dot_items(); i += kWarps) p.dots(i, g);
  ctx.sync_threads();
  for (int i = tid; i < p.weight_items(); i += kThreads) p.weights(i);
  ctx.sync_threads();
  for (int c = tid; c < p.column_items(); c += kThreads) p.columns(c);
  ctx.sync_threads();
  if constexpr (kv_step_row_groups<Program> == 2 * kWarps) {  // two rows per warp (see half_warp_group)
    const half_warp_group<Ctx> hg{ctx};
    const int group = 2 * warp + hg.half();
    p.rows(group, 2 * kWarps, p.row_scratch(group), hg);
  } else {
    p.rows(warp, kWarps, p.row_scratch(warp), g);
  }
}

/// Commit of accepted drafts: a token per warp item, then rows over warps.
template <class Ctx, class Program>
HYBRIDCACHE_HD_INLINE void kv_commit(const Ctx& ctx, Program p) {
  const int hv_count = p.num_v_heads;
  if (!p.init(static_cast<int>(ctx.block() / hv_count), static_cast<int>(ctx.block() % hv_count))) return;
  workspace_carver w{ctx.template shared<std::byte>()};
  p.carve(w);
  const warp_group<Ctx> g{ctx};
  const int warp = ctx.warp_id();
  for (int j = warp; j < p.total; j += kWarps) p.dots(j, g);
  ctx.sync_threads();
  p.rows(warp, kWarps, g);
}

/// Appends `tokens` prefilled tokens to a KV-only buffer: a CTA per (token, value head),
/// threads over the columns of its value (and of its key, for the first head of a group).
template <class Ctx, class In, class ValueT>
HYBRIDCACHE_HD_INLINE void kv_buffer_append(const Ctx& ctx, kv_buffer_ref<In, ValueT> buf, int slot, int tokens,
                                            const In* k, const float* u, const float* g) {
  const int t = static_cast<int>(ctx.block() / buf.num_v_heads), hv = static_cast<int>(ctx.block() % buf.num_v_heads);
  if (t >= tokens) return;
  const int width = buf.key_dim > buf.value_dim ? buf.key_dim : buf.value_dim;
  for (int c = static_cast<int>(ctx.thread()); c < width; c += static_cast<int>(ctx.block_threads()))
    append_token_item(buf, slot, t, k + static_cast<std::int64_t>(t) * buf.num_k_heads * buf.key_dim,
                      u + static_cast<std::int64_t>(t) * buf.num_v_heads * buf.value_dim,
                      g ? g + static_cast<std::int64_t>(t) * buf.num_v_heads : nullptr, hv, c);
}

/// Debug input check: adds to `*count` the elements of data[0..n) that are NaN or infinite
/// (-inf allowed when `allow_neg_inf`: a log decay of -inf resets a state). Grid-stride loop.
template <class Ctx, class T>
HYBRIDCACHE_HD_INLINE void count_nonfinite(const Ctx& ctx, const T* data, std::int64_t n, bool allow_neg_inf,
                                           std::uint32_t* count) {
  std::uint32_t local = 0;
  const std::int64_t stride = static_cast<std::int64_t>(ctx.grid_blocks()) * ctx.block_threads();
  for (std::int64_t i = static_cast<std::int64_t>(ctx.block()) * ctx.block_threads() + ctx.thread(); i < n; i += stride) {
    const float x = to_float(data[i]);
    local += is_finite(x) || (allow_neg_inf && is_reset(x)) ? 0u : 1u;
  }
  if (local != 0) ctx.atomic_add(count, local);
}

/// Qwen3-Next gates for tokens x num_v_heads (grid-stride).
template <class Ctx, class In>
HYBRIDCACHE_HD_INLINE void qwen3_next_gates(const Ctx& ctx, const In* a, const In* b, const float* a_log,
                                            const float* dt_bias, float* log_decay, float* beta, std::int64_t tokens,
                                            int num_v_heads) {
  const std::int64_t n = tokens * num_v_heads;
  const std::int64_t stride = static_cast<std::int64_t>(ctx.grid_blocks()) * ctx.block_threads();
  for (std::int64_t i = static_cast<std::int64_t>(ctx.block()) * ctx.block_threads() + ctx.thread(); i < n; i += stride) {
    const int hv = static_cast<int>(i % num_v_heads);
    log_decay[i] = qwen3_next_log_decay(a_log[hv], to_float(a[i]), dt_bias[hv]);
    beta[i] = qwen3_next_beta(to_float(b[i]));
  }
}

/// Chunked prefill, parallel phase: a CTA per (chunk-table slot, value head) prepares that
/// chunk (intra-chunk tables) whatever the sequence's other chunks do.
template <class Ctx, class Rule, state_layout Layout, int DK, int DV, class In, class Out>
HYBRIDCACHE_HD_INLINE void chunk_prepare(const Ctx& ctx, const prefill_io<In, Out>& io) {
  using state_type = state_ref<Layout, DK, DV>;
  const int hv_count = io.num_v_heads, C = io.chunk;
  const auto slot = static_cast<std::int64_t>(ctx.block() / hv_count);
  const int hv = static_cast<int>(ctx.block() % hv_count);
  int lo = 0, hi = io.num_seqs - 1;  // the last sequence whose first slot is <= slot
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (chunk_slot_base(io.cu_seqlens, mid, C) <= slot) lo = mid;
    else hi = mid - 1;
  }
  const auto head = prefill_head<state_type, In, Out>::bind(io, lo, hv);
  if (!head.active) return;
  const int i = static_cast<int>(slot - chunk_slot_base(io.cu_seqlens, lo, C));
  if (i >= chunk_count(head.start, head.in.length, C)) return;
  chunk_prepare_program<Rule, DK, In> p{head.in, io.qk, chunk_first_token(head.start, head.in.length, C, i), 0, C};
  p.len = aligned_chunk_len(head.start, p.t0, head.in.length, C);
  workspace_carver w{ctx.template shared<std::byte>()};
  p.carve(w);
  const int tid = static_cast<int>(ctx.thread());
  p.stage(tid, kThreads);
  if (ctx.warp_id() == 0) p.decays(warp_group<Ctx>{ctx});
  ctx.sync_threads();
  if constexpr (is_mma_input_v<In>) {
    if (gram_on_tensor_cores<In>(io.math)) {
      p.gram_tiles(ctx, ctx.warp_id(), kWarps);
      p.norms(ctx.warp_id(), kWarps, warp_group<Ctx>{ctx});
    } else {
      p.gram(ctx.warp_id(), kWarps, ctx.lane_id(), 32);
    }
  } else {
    p.gram(ctx.warp_id(), kWarps, ctx.lane_id(), 32);
  }
  ctx.sync_threads();
  p.weights(ctx.warp_id(), kWarps, ctx.lane_id(), 32);
  ctx.sync_threads();
  p.solve(tid, kThreads);
  ctx.sync_threads();
  p.export_tables(io.workspace + (slot * hv_count + hv) * chunk_tables::floats(C), tid, kThreads);
}

/// Chunked prefill, sequential phase: a CTA per (sequence, value head, block of 8 value
/// columns) walks the sequence's chunks, reading the prepared tables (K S and Q S on tensor
/// cores for bf16 inputs unless prefill_io::math says fp32).
template <class Ctx, class Rule, state_layout Layout, int DK, int DV, class In, class Out>
HYBRIDCACHE_HD_INLINE void chunk_scan(const Ctx& ctx, const prefill_io<In, Out>& io) {
  using state_type = state_ref<Layout, DK, DV>;
  using program = chunk_scan_program<Rule, state_type, In, Out>;
  constexpr int blocks_per_head = (DV + program::block_columns - 1) / program::block_columns;
  const int hv_count = io.num_v_heads, C = io.chunk;
  const int cb = static_cast<int>(ctx.block() % blocks_per_head);
  const std::uint64_t seq_head = ctx.block() / blocks_per_head;
  const int hv = static_cast<int>(seq_head % hv_count), seq = static_cast<int>(seq_head / hv_count);
  const auto head = prefill_head<state_type, In, Out>::bind(io, seq, hv);
  if (!head.active) return;
  program p;
  p.in = head.in;
  p.out = head.out;
  p.state = head.state;
  p.ck = head.ck;
  p.start = head.start;
  p.chunk = C;
  p.math = io.math;
  p.tables = io.workspace + (chunk_slot_base(io.cu_seqlens, seq, C) * hv_count + hv) * chunk_tables::floats(C);
  p.table_stride = static_cast<std::int64_t>(hv_count) * chunk_tables::floats(C);
  p.col_begin = cb * program::block_columns;
  p.col_end = p.col_begin + program::block_columns < DV ? p.col_begin + program::block_columns : DV;
  workspace_carver w{ctx.template shared<std::byte>()};
  p.carve(w);
  const warp_group<Ctx> g{ctx};
  const int warp = ctx.warp_id(), tid = static_cast<int>(ctx.thread());
  p.load_columns(warp, kWarps, g);
  const int chunks = chunk_count(head.start, head.in.length, C);
  for (int i = 0; i < chunks; ++i) {
    p.select_chunk(i);
    p.stage(i, tid, kThreads);
    ctx.sync_threads();
    if (p.scan_on_tensor_cores()) {
      p.products(ctx, warp, kWarps);
      ctx.sync_threads();
      p.columns_w(warp, kWarps, g);
      ctx.sync_threads();
      if constexpr (Rule::delta) {
        p.u_products(ctx, warp, kWarps);
        ctx.sync_threads();
      }
      p.o_products(ctx, warp, kWarps);
      p.fold_columns(warp, kWarps, g);
    } else {
      p.columns(warp, kWarps, g);
    }
    ctx.sync_threads();
  }
  p.store_columns(warp, kWarps, g);
}

}  // namespace kernel_bodies

// ---- launch shapes (the launchers and the emulated tests use the same) -------------------

/// recurrent_step: a CTA per (entry, value head), no shared memory.
inline kernel_launch_shape recurrent_step_shape(int batch, int num_v_heads) {
  return {static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(num_v_heads), kThreads, 0};
}
/// kv_step: a CTA per (entry, value head); the workspace for the largest buffer + n tokens.
template <class Program>
kernel_launch_shape kv_step_shape(int batch, int num_v_heads, int max_total, int new_tokens) {
  return {static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(num_v_heads), kThreads,
          Program::workspace_bytes(max_total, new_tokens, kernel_bodies::kv_step_row_groups<Program>)};
}
/// kv_commit: a CTA per (entry, value head).
template <class Program>
kernel_launch_shape kv_commit_shape(int batch, int num_v_heads, int max_total) {
  return {static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(num_v_heads), kThreads,
          Program::workspace_bytes(max_total)};
}
/// kv_buffer_append: a CTA per (token, value head).
inline kernel_launch_shape kv_buffer_append_shape(int tokens, int num_v_heads) {
  return {static_cast<std::uint64_t>(tokens) * static_cast<std::uint64_t>(num_v_heads), kThreads, 0};
}
/// count_nonfinite / qwen3_next_gates: grid-stride, 256 threads, at most `max_blocks` CTAs.
inline kernel_launch_shape elementwise_shape(std::int64_t n, std::int64_t max_blocks) {
  return {static_cast<std::uint64_t>(std::clamp<std::int64_t>((n + 255) / 256, 1, max_blocks)), 256, 0};
}
/// chunk_prepare: a CTA per (chunk-table slot, value head).
template <class Rule, int DK, class In>
kernel_launch_shape chunk_prepare_shape(std::int64_t tokens, int num_seqs, int num_v_heads, int chunk) {
  return {static_cast<std::uint64_t>(prefill_chunk_slots(tokens, num_seqs, chunk)) * static_cast<std::uint64_t>(num_v_heads),
          kThreads, chunk_prepare_program<Rule, DK, In>::workspace_bytes(chunk)};
}
/// chunk_scan: a CTA per (sequence, value head, 8 value columns).
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
kernel_launch_shape chunk_scan_shape(int num_seqs, int num_v_heads, int chunk) {
  using program = chunk_scan_program<Rule, state_ref<Layout, DK, DV>, In, Out>;
  constexpr int blocks_per_head = (DV + program::block_columns - 1) / program::block_columns;
  return {static_cast<std::uint64_t>(num_seqs) * static_cast<std::uint64_t>(num_v_heads) * blocks_per_head, kThreads,
          program::workspace_bytes(chunk)};
}

}  // namespace hybridcache::attention
