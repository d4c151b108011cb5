// hybridcache/attention/cuda/linear_attention_kernels.cuh
//
// Kernels and launch wrappers for the batched linear-attention / Gated DeltaNet forms.
// nvcc only. Every `__global__` function here is one line: it calls the body of the same
// name in kernel_bodies.hpp with `cuda_context`, the execution context over threadIdx,
// __syncthreads, warp shuffles and dynamic shared memory. The tests run those bodies under
// the CTA emulator (tests/emulated), so every kernel is executed without a GPU; a kernel
// added here without an emulated test fails that test's count.
//
// Every wrapper validates on the host before launching (throws, nothing launched):
// supported head dims and state layout against the template, head-count ratio, slot range,
// draft counts and buffer capacity (through kv_buffer_table::check_step), shared memory
// against the device's limit, and, in debug builds (NDEBUG not defined), NaN/Inf in the
// inputs (log decays may be -inf: a reset). Launch failures throw cuda_error. Wrappers are
// asynchronous on `stream` unless a debug input check synchronises it.
//
// Memory access: for V-major pools a warp reads a state row (d_k contiguous floats) with
// one 128-bit load per lane (d_k a multiple of 128) and keeps 4 rows' loads in flight in
// recurrent decode; K-major pools are supported for correctness but read rows with stride
// d_v (use V-major for serving).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/cuda/cuda_check.cuh"
#include "hybridcache/attention/cuda/kv_buffer_device.cuh"
#include "hybridcache/attention/decode_programs.hpp"
#include "hybridcache/attention/kernel_bodies.hpp"
#include "hybridcache/attention/kernel_context.hpp"
#include "hybridcache/attention/kv_buffer.hpp"
#include "hybridcache/attention/linear_attention_forms.hpp"

namespace hybridcache::attention {

// The device expression in device code, the host stub's in the host pass (which never runs
// these bodies but must compile them); undefined again after cuda_context.
#if defined(__CUDA_ARCH__)
#define HYBRIDCACHE_DEVICE_ELSE(device, host) (device)
#else
#define HYBRIDCACHE_DEVICE_ELSE(device, host) (host)
#endif

/// The execution context of the kernel bodies on the device (kernel_context.hpp lists the
/// interface; the host pass of nvcc sees inert stubs).
struct cuda_context {
  HYBRIDCACHE_HD_INLINE std::uint32_t thread() const { return HYBRIDCACHE_DEVICE_ELSE(threadIdx.x, 0); }
  HYBRIDCACHE_HD_INLINE std::uint32_t block_threads() const { return HYBRIDCACHE_DEVICE_ELSE(blockDim.x, 1); }
  HYBRIDCACHE_HD_INLINE std::uint64_t block() const { return HYBRIDCACHE_DEVICE_ELSE(blockIdx.x, 0); }
  HYBRIDCACHE_HD_INLINE std::uint64_t grid_blocks() const { return HYBRIDCACHE_DEVICE_ELSE(gridDim.x, 1); }
  HYBRIDCACHE_HD_INLINE int lane_id() const { return static_cast<int>(thread() & 31u); }
  HYBRIDCACHE_HD_INLINE int warp_id() const { return static_cast<int>(thread() >> 5); }
  HYBRIDCACHE_HD_INLINE void sync_threads() const { HYBRIDCACHE_DEVICE_ELSE(__syncthreads(), void()); }
  HYBRIDCACHE_HD_INLINE void sync_warp() const { HYBRIDCACHE_DEVICE_ELSE(__syncwarp(), void()); }
  template <class T>
  HYBRIDCACHE_HD_INLINE T shfl_xor(T v, int lane_mask) const {
    return HYBRIDCACHE_DEVICE_ELSE(__shfl_xor_sync(0xFFFFFFFFu, v, lane_mask), ((void)lane_mask, v));
  }
  template <class T>
  HYBRIDCACHE_HD_INLINE T shfl_up(T v, int delta) const {
    return HYBRIDCACHE_DEVICE_ELSE(__shfl_up_sync(0xFFFFFFFFu, v, static_cast<unsigned>(delta)), ((void)delta, v));
  }
  template <class T>
  HYBRIDCACHE_HD_INLINE T shfl(T v, int src_lane) const {
    return HYBRIDCACHE_DEVICE_ELSE(__shfl_sync(0xFFFFFFFFu, v, src_lane), ((void)src_lane, v));
  }
  HYBRIDCACHE_HD_INLINE std::uint32_t ballot(bool p) const {
    return HYBRIDCACHE_DEVICE_ELSE(__ballot_sync(0xFFFFFFFFu, p), (p ? 1u : 0u));
  }
  HYBRIDCACHE_HD_INLINE bool any(bool p) const { return ballot(p) != 0; }
  HYBRIDCACHE_HD_INLINE bool all(bool p) const { return ballot(p) == 0xFFFFFFFFu; }
  template <class T>
  HYBRIDCACHE_HD_INLINE T* shared() const {
#if defined(__CUDA_ARCH__)
    extern __shared__ __align__(16) unsigned char hybridcache_dynamic_smem[];
    return reinterpret_cast<T*>(hybridcache_dynamic_smem);
#else
    return nullptr;
#endif
  }
  HYBRIDCACHE_HD_INLINE std::uint32_t atomic_add(std::uint32_t* p, std::uint32_t v) const {
#if defined(__CUDA_ARCH__)
    return atomicAdd(reinterpret_cast<unsigned int*>(p), v);
#else
    const std::uint32_t old = *p;
    *p += v;
    return old;
#endif
  }
};
#undef HYBRIDCACHE_DEVICE_ELSE

/// Description of a state pool `[num_slots][num_v_heads][d_k*d_v]` fp32, for validation.
struct state_pool {
  float* data = nullptr;
  int num_slots = 0;
  int num_v_heads = 0;
  int key_dim = 0;
  int value_dim = 0;
  state_layout layout = state_layout::v_major;
};

/// Host copies of a prefill's index arrays, for validation before launch.
struct prefill_host_view {
  std::span<const std::int64_t> cu_seqlens;
  std::span<const std::int64_t> start_positions;
  std::span<const std::int32_t> slots;
  std::span<const std::int64_t> checkpoint_offsets;    ///< empty: no checkpoints
  std::span<const std::int64_t> checkpoint_positions;
};

namespace kernels {

/// CTAs per SM the decode kernels declare: 8 (64 registers a thread), 4 past d_k = 128.
template <class Program>
inline constexpr int decode_ctas_per_sm = Program::key_dim > 128 ? 4 : 8;
/// kv_step's: 6 (80 registers a thread), 4 past d_k = 128. Its rows go to half warps (a lane
/// holds 8 elements of a row, its key and its query at d_k = 128), which spilled at 64
/// registers; its shared memory held it to 2-3 CTAs per SM at the largest shapes anyway.
template <class Program>
inline constexpr int kv_step_ctas_per_sm = Program::key_dim > 128 ? 4 : 6;

// One line each: the body (kernel_bodies.hpp) with the device context. Each declares the CTAs
// per SM it is meant to reach (the chunk kernels' shared memory allows about 2, the decode
// kernels aim at 8 = half the SM's warps, 4 past d_k 128): with maxThreads alone ptxas
// stopped short of the registers it needed and spilled (.ci/check-ptxas.sh fails on any spill).

template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
__global__ void __launch_bounds__(kThreads, 2) chunk_prepare(prefill_io<In, Out> io) {
  kernel_bodies::chunk_prepare<cuda_context, Rule, Layout, DK, DV>(cuda_context{}, io);
}

template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
__global__ void __launch_bounds__(kThreads, 2) chunk_scan(prefill_io<In, Out> io) {
  kernel_bodies::chunk_scan<cuda_context, Rule, Layout, DK, DV>(cuda_context{}, io);
}

template <class Program>
__global__ void __launch_bounds__(kThreads, decode_ctas_per_sm<Program>) recurrent_step(Program p) {
  kernel_bodies::recurrent_step(cuda_context{}, p);
}

template <class Program>
__global__ void __launch_bounds__(kThreads, kv_step_ctas_per_sm<Program>) kv_step(Program p) {
  kernel_bodies::kv_step(cuda_context{}, p);
}

template <class Program>
__global__ void __launch_bounds__(kThreads, decode_ctas_per_sm<Program>) kv_commit(Program p) {
  kernel_bodies::kv_commit(cuda_context{}, p);
}

template <class In, class ValueT>
__global__ void __launch_bounds__(kThreads) kv_buffer_append(kv_buffer_ref<In, ValueT> buf, int slot, int tokens,
                                                             const In* k, const float* u, const float* g) {
  kernel_bodies::kv_buffer_append(cuda_context{}, buf, slot, tokens, k, u, g);
}

template <class T>
__global__ void count_nonfinite(const T* data, std::int64_t n, bool allow_neg_inf, std::uint32_t* count) {
  kernel_bodies::count_nonfinite(cuda_context{}, data, n, allow_neg_inf, count);
}

template <class In>
__global__ void qwen3_next_gates(const In* a, const In* b, const float* a_log, const float* dt_bias, float* log_decay,
                                 float* beta, std::int64_t tokens, int num_v_heads) {
  kernel_bodies::qwen3_next_gates(cuda_context{}, a, b, a_log, dt_bias, log_decay, beta, tokens, num_v_heads);
}

}  // namespace kernels

namespace detail {

template <int DK, int DV, state_layout Layout>
void check_pool(const state_pool& pool, int num_v_heads) {
  HYBRIDCACHE_EXPECTS(pool.key_dim == DK && pool.value_dim == DV, invalid_argument,
                      "state pool head dims " + std::to_string(pool.key_dim) + "x" + std::to_string(pool.value_dim) +
                          " do not match the kernel's " + std::to_string(DK) + "x" + std::to_string(DV));
  HYBRIDCACHE_EXPECTS(pool.layout == Layout, invalid_argument,
                      std::string("state pool layout is ") +
                          (pool.layout == state_layout::k_major ? "K-major" : "V-major") + ", the kernel expects " +
                          (Layout == state_layout::k_major ? "K-major" : "V-major"));
  HYBRIDCACHE_EXPECTS(pool.num_v_heads == num_v_heads, invalid_argument,
                      "state pool has " + std::to_string(pool.num_v_heads) + " value heads, the step " +
                          std::to_string(num_v_heads));
  HYBRIDCACHE_EXPECTS(pool.data != nullptr, invalid_argument, "state pool data is null");
}

inline void check_slots(std::span<const std::int32_t> host_slots, int batch, int num_slots) {
  HYBRIDCACHE_EXPECTS(static_cast<int>(host_slots.size()) == batch, invalid_argument,
                      "host_slots has " + std::to_string(host_slots.size()) + " entries, batch is " + std::to_string(batch));
  std::vector<bool> seen(static_cast<std::size_t>(std::max(num_slots, 0)));
  for (std::size_t b = 0; b < host_slots.size(); ++b) {
    const int s = host_slots[b];
    HYBRIDCACHE_EXPECTS(s < num_slots, invalid_argument,
                        "batch entry " + std::to_string(b) + ": slot " + std::to_string(s) + " outside the pool of " +
                            std::to_string(num_slots));
    if (s < 0) continue;
    HYBRIDCACHE_EXPECTS(!seen[static_cast<std::size_t>(s)], invalid_argument,
                        "slot " + std::to_string(s) + " appears twice in one batch (the kernels would race)");
    seen[static_cast<std::size_t>(s)] = true;
  }
}

/// Debug builds: throws invalid_argument when `data[0..n)` (device) holds a NaN or an Inf
/// (-inf allowed when `allow_neg_inf`: a log decay that resets the state).
template <class T>
void check_finite_device(const char* what, const T* data, std::int64_t n, cudaStream_t stream,
                         bool allow_neg_inf = false) {
#if !defined(NDEBUG)
  if (data == nullptr || n == 0) return;
  device_array<std::uint32_t> count(1);
  HYBRIDCACHE_CUDA_TRY(cudaMemsetAsync(count.data(), 0, sizeof(std::uint32_t), stream));
  const kernel_launch_shape shape = elementwise_shape(n, 1024);
  kernels::count_nonfinite<<<static_cast<unsigned>(shape.blocks), shape.threads, 0, stream>>>(data, n, allow_neg_inf,
                                                                                               count.data());
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
  std::uint32_t host = 0;
  HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(&host, count.data(), sizeof host, cudaMemcpyDeviceToHost, stream));
  HYBRIDCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
  HYBRIDCACHE_EXPECTS(host == 0, invalid_argument,
                      std::string(what) + " holds " + std::to_string(host) + (allow_neg_inf ? " NaN/+Inf" : " NaN/Inf") +
                          " values");
#else
  (void)what, (void)data, (void)n, (void)stream, (void)allow_neg_inf;
#endif
}

/// Launches `kernel` with `shape` on `stream`, after checking the grid and the dynamic shared
/// memory against the device (and opting in above 48 KiB). @throws invalid_argument, cuda_error.
template <class Kernel, class... Args>
void launch(Kernel kernel, const kernel_launch_shape& shape, cudaStream_t stream, const char* what, Args... args) {
  HYBRIDCACHE_EXPECTS(shape.blocks >= 1 && shape.blocks <= max_grid_blocks, invalid_argument,
                      std::string(what) + ": grid of " + std::to_string(shape.blocks) + " CTAs outside [1, 2^31 - 1]");
  if (shape.shared_bytes > 48 * 1024) {
    int device = 0, limit = 0;
    HYBRIDCACHE_CUDA_TRY(cudaGetDevice(&device));
    HYBRIDCACHE_CUDA_TRY(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    HYBRIDCACHE_EXPECTS(shape.shared_bytes <= static_cast<std::size_t>(limit), invalid_argument,
                        std::string(what) + " needs " + std::to_string(shape.shared_bytes) +
                            " B of shared memory per CTA, the device allows " + std::to_string(limit) +
                            " B (use a smaller chunk or buffer)");
    HYBRIDCACHE_CUDA_TRY(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shape.shared_bytes)));
  }
  kernel<<<static_cast<unsigned>(shape.blocks), shape.threads, shape.shared_bytes, stream>>>(args...);
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
}

template <int DK, int DV, class In, class Out>
void check_step(const step_io<In, Out>& io, std::span<const std::int32_t> host_slots, const state_pool& pool,
                cudaStream_t stream) {
  HYBRIDCACHE_EXPECTS(io.num_k_heads > 0 && io.num_v_heads > 0 && io.num_v_heads % io.num_k_heads == 0,
                      invalid_argument, "num_v_heads must be a positive multiple of num_k_heads");
  HYBRIDCACHE_EXPECTS(io.batch >= 0 && static_cast<std::uint64_t>(io.batch) * io.num_v_heads <= max_grid_blocks,
                      invalid_argument, "batch x num_v_heads must be at most 2^31 - 1");
  HYBRIDCACHE_EXPECTS(io.new_tokens >= 1, invalid_argument, "new_tokens must be >= 1");
  check_slots(host_slots, io.batch, pool.num_slots);
  const std::int64_t tokens = static_cast<std::int64_t>(io.batch) * io.new_tokens;
  check_finite_device("q", io.q, tokens * io.num_k_heads * DK, stream);
  check_finite_device("k", io.k, tokens * io.num_k_heads * DK, stream);
  check_finite_device("v", io.v, tokens * io.num_v_heads * DV, stream);
  check_finite_device("log_decay", io.log_decay, tokens * io.num_v_heads, stream, true);
  check_finite_device("beta", io.beta, tokens * io.num_v_heads, stream);
  HYBRIDCACHE_EXPECTS(io.gate_a == nullptr || (io.gate_b && io.a_log && io.dt_bias), invalid_argument,
                      "fused gating needs gate_a, gate_b, a_log and dt_bias together");
  check_finite_device("gate_a", io.gate_a, tokens * io.num_v_heads, stream);
  check_finite_device("gate_b", io.gate_b, tokens * io.num_v_heads, stream);
}

template <class KeyT, class ValueT>
void check_buffer(const kv_buffer_ref<KeyT, ValueT>& buf, const kv_buffer_table& table, int dk, int dv, int h, int hv) {
  HYBRIDCACHE_EXPECTS(buf.key_dim == dk && buf.value_dim == dv && buf.num_k_heads == h && buf.num_v_heads == hv,
                      invalid_argument, "kv_buffer_ref shape does not match the step (heads or head dims)");
  HYBRIDCACHE_EXPECTS(buf.block_tokens == table.config().block_tokens && buf.max_blocks == table.max_blocks_per_slot(),
                      invalid_argument, "kv_buffer_ref does not match its kv_buffer_table (block size)");
}

}  // namespace detail

/// Recurrent decode (n = 1) or per-draft-state verification (`intermediate` != nullptr:
/// states after each token go to `intermediate[((b*n + r)*HV + hv) * d_k*d_v]`, pool
/// untouched). `io` points to device memory; `host_slots` is a host copy of `io.slots`.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
void launch_recurrent_step(const step_io<In, Out>& io, const state_pool& pool, std::span<const std::int32_t> host_slots,
                           float* intermediate = nullptr, cudaStream_t stream = nullptr) {
  detail::check_pool<DK, DV, Layout>(pool, io.num_v_heads);
  detail::check_step<DK, DV>(io, host_slots, pool, stream);
  if (io.batch == 0) return;
  using program = recurrent_program<Rule, Layout, DK, DV, In, Out>;
  program p{io, intermediate};
  p.io.states = pool.data;
  detail::launch(kernels::recurrent_step<program>, recurrent_step_shape(io.batch, io.num_v_heads), stream,
                 "recurrent_step", p);
}

namespace detail {
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out, class ValueT>
void launch_kv_step(const step_io<In, Out>& io, const state_pool& pool, std::span<const std::int32_t> host_slots,
                    const kv_buffer_table& table, const kv_buffer_ref<In, ValueT>& buf, bool decode, cudaStream_t stream) {
  check_pool<DK, DV, Layout>(pool, io.num_v_heads);
  check_step<DK, DV>(io, host_slots, pool, stream);
  check_buffer(buf, table, DK, DV, io.num_k_heads, io.num_v_heads);
  table.check_step(host_slots, io.new_tokens);
  if (io.batch == 0) return;
  using program = kv_step_program<Rule, Layout, DK, DV, In, Out, ValueT>;
  const int max_total = std::max(table.capacity(false), table.capacity(true));
  program p{io, buf, table.config().flush_interval, table.config().kv_only_crossover, decode};
  p.io.states = pool.data;
  launch(kernels::kv_step<program>, kv_step_shape<program>(io.batch, io.num_v_heads, max_total, io.new_tokens), stream,
         "kv_step", p);
}
}  // namespace detail

/// KVBuffer decode of one token per entry: output from the state at the last flush plus the
/// buffer; appends (k, u|v, g); folds the buffer into the state when it reaches B (or the
/// crossover, KV-only). Afterwards call `table.advance(slot, 1)` for every active entry and
/// re-upload the table's arrays before the next launch. `buf` views device memory whose
/// cursor/state_valid/block_table arrays mirror `table`.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out, class ValueT>
void launch_kv_decode(const step_io<In, Out>& io, const state_pool& pool, std::span<const std::int32_t> host_slots,
                      const kv_buffer_table& table, const kv_buffer_ref<In, ValueT>& buf, cudaStream_t stream = nullptr) {
  HYBRIDCACHE_EXPECTS(io.new_tokens == 1, invalid_argument, "launch_kv_decode: one token per entry");
  detail::launch_kv_step<Rule, Layout, DK, DV>(io, pool, host_slots, table, buf, true, stream);
}

/// Verification of `io.new_tokens` drafts per entry in one pass (no state write, no
/// per-draft states): outputs for every draft; drafts are written past the cursor. Then call
/// `launch_kv_commit` with the accepted counts.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out, class ValueT>
void launch_kv_verify(const step_io<In, Out>& io, const state_pool& pool, std::span<const std::int32_t> host_slots,
                      const kv_buffer_table& table, const kv_buffer_ref<In, ValueT>& buf, cudaStream_t stream = nullptr) {
  detail::launch_kv_step<Rule, Layout, DK, DV>(io, pool, host_slots, table, buf, false, stream);
}

/// Commit of the accepted draft prefixes (`accepted` device, `host_accepted` its host copy):
/// folds into the state only the entries whose buffer fills; afterwards call
/// `table.advance(slot, accepted)` per active entry.
template <class Rule, state_layout Layout, int DK, int DV, class In, class ValueT>
void launch_kv_commit(const std::int32_t* slots, const std::int32_t* accepted, std::span<const std::int32_t> host_slots,
                      std::span<const std::int32_t> host_accepted, int num_k_heads, int num_v_heads,
                      const state_pool& pool, const kv_buffer_table& table, const kv_buffer_ref<In, ValueT>& buf,
                      const qk_options& qk, int verified_tokens, cudaStream_t stream = nullptr) {
  detail::check_pool<DK, DV, Layout>(pool, num_v_heads);
  detail::check_slots(host_slots, static_cast<int>(host_slots.size()), pool.num_slots);
  detail::check_buffer(buf, table, DK, DV, num_k_heads, num_v_heads);
  HYBRIDCACHE_EXPECTS(host_accepted.size() == host_slots.size(), invalid_argument,
                      "launch_kv_commit: one accepted count per batch entry");
  table.check_step(host_slots, verified_tokens);
  for (std::size_t b = 0; b < host_slots.size(); ++b)
    HYBRIDCACHE_EXPECTS(host_accepted[b] >= 0 && host_accepted[b] <= verified_tokens, invalid_argument,
                        "launch_kv_commit: entry " + std::to_string(b) + " accepts " + std::to_string(host_accepted[b]) +
                            " of " + std::to_string(verified_tokens) + " drafts");
  if (host_slots.empty()) return;
  using program = kv_commit_program<Rule, Layout, DK, DV, In, ValueT>;
  const int max_total = std::max(table.capacity(false), table.capacity(true));
  program p{slots, accepted, num_k_heads, num_v_heads, pool.data, buf, qk, table.config().flush_interval,
            table.config().kv_only_crossover};
  // A 1-D grid of batch x HV CTAs: batches past 65,535 entries launch (gridDim.y would not).
  detail::launch(kernels::kv_commit<program>,
                 kv_commit_shape<program>(static_cast<int>(host_slots.size()), num_v_heads, max_total), stream,
                 "kv_commit", p);
}

/// Chunked prefill (chunkwise form through the UT transform for the delta rule) of a batch of
/// packed sequences, writing the state at every requested checkpoint position: at a chunk
/// boundary directly, inside a chunk by rolling forward from the previous boundary. Two
/// launches: `chunk_prepare` (every chunk of every sequence in parallel, tables into
/// `io.workspace`, prefill_workspace_floats(...) floats of device memory) and `chunk_scan`
/// (the sequential state pass, a CTA per sequence, value head and 8 value columns); the chunk
/// products of 16-bit inputs on tensor cores unless `io.math` is chunk_math::fp32. Chunk
/// sizes 1..64 (d_k 256 with fp32 inputs needs chunk <= 32 on sm_80: the shared memory is
/// checked). `host` mirrors the index arrays for validation.
template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
void launch_chunked_prefill(const prefill_io<In, Out>& io, const state_pool& pool, const prefill_host_view& host,
                            cudaStream_t stream = nullptr) {
  detail::check_pool<DK, DV, Layout>(pool, io.num_v_heads);
  HYBRIDCACHE_EXPECTS(io.num_k_heads > 0 && io.num_v_heads > 0 && io.num_v_heads % io.num_k_heads == 0,
                      invalid_argument, "num_v_heads must be a positive multiple of num_k_heads");
  HYBRIDCACHE_EXPECTS(io.chunk >= 1 && io.chunk <= 64, invalid_argument,
                      "chunked prefill: chunk " + std::to_string(io.chunk) + " outside [1, 64]");
  HYBRIDCACHE_EXPECTS(io.num_seqs >= 0 && io.num_seqs <= 65535, invalid_argument, "num_seqs must be in [0, 65535]");
  HYBRIDCACHE_EXPECTS(host.cu_seqlens.size() == static_cast<std::size_t>(io.num_seqs) + 1 &&
                          host.start_positions.size() == static_cast<std::size_t>(io.num_seqs),
                      invalid_argument, "chunked prefill: cu_seqlens / start_positions sizes do not match num_seqs");
  detail::check_slots(host.slots, io.num_seqs, pool.num_slots);
  const bool ckpts = !host.checkpoint_offsets.empty();
  HYBRIDCACHE_EXPECTS(!ckpts || host.checkpoint_offsets.size() == static_cast<std::size_t>(io.num_seqs) + 1,
                      invalid_argument, "chunked prefill: checkpoint_offsets must have num_seqs + 1 entries");
  for (int s = 0; s < io.num_seqs; ++s) {
    const std::int64_t len = host.cu_seqlens[s + 1] - host.cu_seqlens[s];
    HYBRIDCACHE_EXPECTS(len >= 0 && len < (std::int64_t{1} << 31), invalid_argument,
                        "chunked prefill: sequence " + std::to_string(s) + " has a bad length");
    if (!ckpts) continue;
    std::int64_t prev = -1;
    for (std::int64_t i = host.checkpoint_offsets[s]; i < host.checkpoint_offsets[s + 1]; ++i) {
      const std::int64_t p = host.checkpoint_positions[static_cast<std::size_t>(i)];
      HYBRIDCACHE_EXPECTS(p > prev && p >= host.start_positions[s] && p <= host.start_positions[s] + len,
                          invalid_argument,
                          "chunked prefill: checkpoint position " + std::to_string(p) + " of sequence " +
                              std::to_string(s) + " is not ascending inside the prefill");
      prev = p;
    }
  }
  const std::int64_t tokens = host.cu_seqlens.empty() ? 0 : host.cu_seqlens.back();
  detail::check_finite_device("q", io.q, tokens * io.num_k_heads * DK, stream);
  detail::check_finite_device("k", io.k, tokens * io.num_k_heads * DK, stream);
  detail::check_finite_device("v", io.v, tokens * io.num_v_heads * DV, stream);
  detail::check_finite_device("log_decay", io.log_decay, tokens * io.num_v_heads, stream, true);
  detail::check_finite_device("beta", io.beta, tokens * io.num_v_heads, stream);
  if (io.num_seqs == 0) return;
  HYBRIDCACHE_EXPECTS(io.workspace != nullptr, invalid_argument,
                      "chunked prefill: prefill_io::workspace is null (needs prefill_workspace_floats(...) floats)");
  prefill_io<In, Out> p = io;
  p.states = pool.data;
  if (!ckpts) p.checkpoint_offsets = nullptr;
  // Every chunk of every sequence at once, then the state pass (same stream: ordered).
  detail::launch(kernels::chunk_prepare<Rule, Layout, DK, DV, In, Out>,
                 chunk_prepare_shape<Rule, DK, In>(tokens, io.num_seqs, io.num_v_heads, io.chunk), stream,
                 "chunk_prepare", p);
  detail::launch(kernels::chunk_scan<Rule, Layout, DK, DV, In, Out>,
                 chunk_scan_shape<Rule, Layout, DK, DV, In, Out>(io.num_seqs, io.num_v_heads, io.chunk), stream,
                 "chunk_scan", p);
}

/// Fills the buffer of a KV-only `slot` (cursor 0) with `tokens` prefilled tokens (device
/// pointers: raw keys [tokens][H][d_k], u [tokens][HV][d_v] from prefill_io::u_out, g
/// [tokens][HV]); then call `table.advance(slot, tokens)`.
template <class In, class ValueT>
void launch_kv_buffer_append(const kv_buffer_ref<In, ValueT>& buf, const kv_buffer_table& table, int slot, int tokens,
                             const In* k, const float* u, const float* g, cudaStream_t stream = nullptr) {
  HYBRIDCACHE_EXPECTS(table.is_open(slot) && !table.state_valid(slot) && table.cursor(slot) == 0, invalid_argument,
                      "kv_buffer_append: slot " + std::to_string(slot) + " is not an empty KV-only request");
  HYBRIDCACHE_EXPECTS(tokens >= 0 && tokens < table.config().kv_only_crossover, invalid_argument,
                      "kv_buffer_append: " + std::to_string(tokens) + " tokens do not stay below the crossover " +
                          std::to_string(table.config().kv_only_crossover));
  if (tokens == 0) return;
  detail::launch(kernels::kv_buffer_append<In, ValueT>, kv_buffer_append_shape(tokens, buf.num_v_heads), stream,
                 "kv_buffer_append", buf, slot, tokens, k, u, g);
}

/// Qwen3-Next gates for `tokens` x `num_v_heads`: log_decay = -exp(A_log) softplus(a + dt_bias),
/// beta = sigmoid(b). All pointers are device memory.
template <class In>
void launch_qwen3_next_gates(const In* a, const In* b, const float* a_log, const float* dt_bias, float* log_decay,
                             float* beta, std::int64_t tokens, int num_v_heads, cudaStream_t stream = nullptr) {
  HYBRIDCACHE_EXPECTS(tokens >= 0 && num_v_heads > 0, invalid_argument, "qwen3_next_gates: bad shape");
  const std::int64_t n = tokens * num_v_heads;
  if (n == 0) return;
  detail::launch(kernels::qwen3_next_gates<In>, elementwise_shape(n, 4096), stream, "qwen3_next_gates", a, b, a_log,
                 dt_bias, log_decay, beta, tokens, num_v_heads);
}

}  // namespace hybridcache::attention
