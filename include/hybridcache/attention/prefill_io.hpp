// hybridcache/attention/prefill_io.hpp
//
// The inputs of a batched chunked prefill (`prefill_io`: packed variable-length sequences,
// their states, checkpoints, the chunk tables' workspace and `chunk_math`) and how one
// (sequence, value head) of it is bound to the chunk programs of chunk_programs.hpp
// (`prefill_head`), plus the chunk-table slot arithmetic the kernels and the host driver
// share. Both `chunk_prepare` and `chunk_scan` (kernel_bodies.hpp) and `chunked_prefill_host`
// (linear_attention_forms.hpp) read a prefill through these.
//
// Cost: index arithmetic only; no allocation.
//
// This header includes no CUDA header: it compiles with g++, clang++ and nvcc.
#pragma once

#include <cstdint>

#include "hybridcache/core/config.hpp"
#include "hybridcache/attention/chunk_programs.hpp"
#include "hybridcache/attention/linear_attention_common.hpp"

namespace hybridcache::attention {

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
  /// The chunk tables the parallel phase leaves for the state pass:
  /// `prefill_workspace_floats(tokens, num_seqs, num_v_heads, chunk)` floats (device memory
  /// for the kernels; the host driver allocates its own when null).
  float* workspace = nullptr;
  qk_options qk{};
  chunk_math math = chunk_math::tensor_cores;  ///< how chunk_prepare computes K K^T and Q K^T
};

/// First chunk-table slot of sequence `seq` (slots of one sequence are consecutive; a
/// sequence of n tokens has at most floor(n / C) + 2 chunks, so this never overlaps).
HYBRIDCACHE_HD_INLINE std::int64_t chunk_slot_base(const std::int64_t* cu_seqlens, int seq, int chunk) {
  return cu_seqlens[seq] / chunk + 2 * static_cast<std::int64_t>(seq);
}
/// Chunk-table slots of a prefill of `tokens` tokens in `num_seqs` sequences.
HYBRIDCACHE_HD_INLINE std::int64_t prefill_chunk_slots(std::int64_t tokens, int num_seqs, int chunk) {
  return tokens / chunk + 2 * static_cast<std::int64_t>(num_seqs);
}
/// Floats of `prefill_io::workspace`.
HYBRIDCACHE_HD_INLINE std::int64_t prefill_workspace_floats(std::int64_t tokens, int num_seqs, int num_v_heads,
                                                            int chunk) {
  return prefill_chunk_slots(tokens, num_seqs, chunk) * num_v_heads * chunk_tables::floats(chunk);
}

/// One (sequence, value head) of a batched prefill: its slice of the packed tensors, its
/// state, checkpoint sink and absolute start. `active` is false for a negative slot.
template <class State, class In, class Out>
struct prefill_head {
  bool active = false;
  head_input<In> in;
  head_output<Out> out;
  State state;
  checkpoint_sink ck;
  std::int64_t start = 0;

  HYBRIDCACHE_HD_INLINE static prefill_head bind(const prefill_io<In, Out>& io, int seq, int hv) {
    constexpr int DK = State::key_dim, DV = State::value_dim;
    prefill_head p;
    const int slot = io.slots[seq];
    if (slot < 0) return p;
    p.active = true;
    const int h = key_head_of(hv, io.num_k_heads, io.num_v_heads);
    const std::int64_t t0 = io.cu_seqlens[seq];
    const std::int64_t kstride = static_cast<std::int64_t>(io.num_k_heads) * DK;
    const std::int64_t vstride = static_cast<std::int64_t>(io.num_v_heads) * DV;
    p.in.q = io.q + t0 * kstride + h * DK;
    p.in.k = io.k + t0 * kstride + h * DK;
    p.in.v = io.v + t0 * vstride + hv * DV;
    p.in.q_stride = p.in.k_stride = kstride;
    p.in.v_stride = vstride;
    p.in.log_decay = io.log_decay ? io.log_decay + t0 * io.num_v_heads + hv : nullptr;
    p.in.decay_stride = io.num_v_heads;
    p.in.beta = io.beta ? io.beta + t0 * io.num_v_heads + hv : nullptr;
    p.in.beta_stride = io.num_v_heads;
    p.in.length = static_cast<int>(io.cu_seqlens[seq + 1] - t0);
    p.out = head_output<Out>{io.o + t0 * vstride + hv * DV, vstride,
                             io.u_out ? io.u_out + t0 * vstride + hv * DV : nullptr, vstride};
    p.state = State{io.states + (static_cast<std::int64_t>(slot) * io.num_v_heads + hv) * State::elements};
    p.start = io.start_positions[seq];
    if (io.checkpoint_offsets != nullptr) {
      const std::int64_t first = io.checkpoint_offsets[seq];
      p.ck.positions = io.checkpoint_positions + first;
      p.ck.count = static_cast<int>(io.checkpoint_offsets[seq + 1] - first);
      p.ck.state_stride = static_cast<std::int64_t>(io.num_v_heads) * State::elements;
      p.ck.states = io.checkpoint_states + first * p.ck.state_stride + hv * State::elements;
    }
    return p;
  }
};

}  // namespace hybridcache::attention
