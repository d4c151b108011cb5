// hybridcache/attention/cuda/linear_attention_kernels.cuh
//
// Kernels and launch wrappers for the batched linear-attention / Gated DeltaNet forms.
// nvcc only. The kernels are a thin layer over the shared per-head programs
// (decode_programs.cuh, linear_attention_forms.cuh): one CTA of `kThreads` threads per
// (batch entry or sequence, value head); warps take per-head items and value rows, lanes
// split d_k (`warp_group`: shuffle reductions), per-head scalars are staged in dynamic shared
// memory, phases are separated by __syncthreads.
//
// Every wrapper validates on the host before launching (throws, nothing launched):
// supported head dims and state layout against the template, head-count ratio, slot range,
// draft counts and buffer capacity (through kv_buffer_table::check_step), and, in debug
// builds (NDEBUG not defined), NaN/Inf in the inputs. Launch failures throw cuda_error.
// Wrappers are asynchronous on `stream` unless a debug input check synchronises it.
//
// Memory access: for V-major pools a warp reads one state row (d_k contiguous floats) per
// instruction group, so state traffic is fully coalesced; K-major pools are supported for
// correctness but read rows with stride d_v (use V-major for serving).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/cuda/cuda_check.cuh"
#include "hybridcache/attention/decode_programs.hpp"
#include "hybridcache/attention/kv_buffer.hpp"
#include "hybridcache/attention/linear_attention_forms.hpp"

namespace hybridcache::cuda {

/// Threads per CTA of every kernel here (4 warps).
inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;

/// A warp as a cooperative group for the row primitives: lanes split d_k, sums by butterfly
/// shuffles (every lane gets the total). On the host pass it degenerates to one member.
struct warp_group {
  static constexpr int size = 32;
  HYBRIDCACHE_HD_INLINE int rank() const {
#if defined(__CUDA_ARCH__)
    return static_cast<int>(threadIdx.x & 31u);
#else
    return 0;
#endif
  }
  HYBRIDCACHE_HD_INLINE float sum(float x) const {
#if defined(__CUDA_ARCH__)
    HYBRIDCACHE_UNROLL
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
#endif
    return x;
  }
  HYBRIDCACHE_HD_INLINE void sync() const {
#if defined(__CUDA_ARCH__)
    __syncwarp();
#endif
  }
};

/// Description of a state pool `[num_slots][num_v_heads][d_k*d_v]` fp32, for validation.
struct state_pool {
  float* data = nullptr;
  int num_slots = 0;
  int num_v_heads = 0;
  int key_dim = 0;
  int value_dim = 0;
  state_layout layout = state_layout::v_major;
};

/// Device mirror of a `kv_buffer_table`'s arrays (block table, cursors, modes), shared by the
/// buffers of all layers. `upload` copies them when the table changed since the last upload
/// (asynchronous on `stream`; the table must not change before the copy completes).
class device_kv_buffer_table {
 public:
  explicit device_kv_buffer_table(const kv_buffer_table& t)
      : table_(static_cast<std::size_t>(t.config().num_slots) * t.max_blocks_per_slot()),
        cursor_(static_cast<std::size_t>(t.config().num_slots)),
        valid_(static_cast<std::size_t>(t.config().num_slots)) {}

  void upload(const kv_buffer_table& t, cudaStream_t stream = nullptr) {
    HYBRIDCACHE_EXPECTS(table_.size() == static_cast<std::size_t>(t.config().num_slots) * t.max_blocks_per_slot(),
                        invalid_argument, "device_kv_buffer_table: uploaded from a table of another shape");
    if (uploaded_ && version_ == t.version()) return;
    HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(table_.data(), t.block_table_data(), table_.size() * sizeof(std::int32_t),
                                         cudaMemcpyHostToDevice, stream));
    HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(cursor_.data(), t.cursor_data(), cursor_.size() * sizeof(std::int32_t),
                                         cudaMemcpyHostToDevice, stream));
    HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(valid_.data(), t.state_valid_data(), valid_.size() * sizeof(std::int32_t),
                                         cudaMemcpyHostToDevice, stream));
    uploaded_ = true;
    version_ = t.version();
  }

  [[nodiscard]] const std::int32_t* block_table() const noexcept { return table_.data(); }
  [[nodiscard]] const std::int32_t* cursor() const noexcept { return cursor_.data(); }
  [[nodiscard]] const std::int32_t* state_valid() const noexcept { return valid_.data(); }

 private:
  device_array<std::int32_t> table_, cursor_, valid_;
  bool uploaded_ = false;
  std::uint64_t version_ = 0;
};

/// One layer's KVBuffer pool in device memory (keys, values, decays for every block).
template <class KeyT, class ValueT>
class device_kv_buffer_pool {
 public:
  device_kv_buffer_pool(const kv_buffer_table& t, int num_k_heads, int num_v_heads, int key_dim, int value_dim)
      : h_(num_k_heads), hv_(num_v_heads), dk_(key_dim), dv_(value_dim), block_tokens_(t.config().block_tokens),
        max_blocks_(t.max_blocks_per_slot()),
        keys_(tokens(t) * static_cast<std::size_t>(num_k_heads) * key_dim),
        values_(tokens(t) * static_cast<std::size_t>(num_v_heads) * value_dim),
        decays_(tokens(t) * static_cast<std::size_t>(num_v_heads)) {}

  /// The view the kernels take, over this pool and a mirror of its table.
  [[nodiscard]] kv_buffer_ref<KeyT, ValueT> ref(const device_kv_buffer_table& t) const noexcept {
    return {keys_.data(), values_.data(), decays_.data(), t.block_table(), t.cursor(), t.state_valid(),
            block_tokens_, max_blocks_, h_, hv_, dk_, dv_};
  }

 private:
  static std::size_t tokens(const kv_buffer_table& t) {
    return static_cast<std::size_t>(t.config().num_blocks) * static_cast<std::size_t>(t.config().block_tokens);
  }
  int h_, hv_, dk_, dv_, block_tokens_, max_blocks_;
  device_array<KeyT> keys_;
  device_array<ValueT> values_;
  device_array<float> decays_;
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

template <class Rule, state_layout Layout, int DK, int DV, class In, class Out>
__global__ void __launch_bounds__(kThreads) chunked_prefill(prefill_io<In, Out> io) {
  extern __shared__ float workspace[];
  auto head = prefill_head<Rule, Layout, DK, DV, In, Out>::bind(io, static_cast<int>(blockIdx.y),
                                                                static_cast<int>(blockIdx.x), workspace);
  if (!head.active) return;
  head.copy_start_checkpoints(static_cast<int>(threadIdx.x), kThreads);
  __syncthreads();
  auto& p = head.program;
  const int warp = static_cast<int>(threadIdx.x / 32);
  for (int t = 0; t < p.in.length; t += p.len) {
    head.select_chunk(t);
    for (int i = warp; i < p.items(); i += kWarps) p.dots(i, warp_group{});
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < p.items(); i += kThreads) p.weights(i);
    __syncthreads();
    for (int c = static_cast<int>(threadIdx.x); c < p.len; c += kThreads) p.solve(c);
    __syncthreads();
    p.rows(warp, kWarps, p.ws.rows + warp * 3 * io.chunk, head.start, head.ck, warp_group{});
    __syncthreads();
  }
}

template <class Program>
__global__ void __launch_bounds__(kThreads) recurrent_step(Program p) {
  if (!p.init(static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x))) return;
  p.rows(static_cast<int>(threadIdx.x / 32), kWarps, warp_group{});
}

template <class Program>
__global__ void __launch_bounds__(kThreads) kv_step(Program p) {
  extern __shared__ float workspace[];
  if (!p.init(static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x))) return;
  p.carve(workspace);
  const int warp = static_cast<int>(threadIdx.x / 32);
  for (int i = warp; i < p.dot_items(); i += kWarps) p.dots(i, warp_group{});
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < p.weight_items(); i += kThreads) p.weights(i);
  __syncthreads();
  p.rows(warp, kWarps, p.row_scratch(warp), warp_group{});
}

template <class Program>
__global__ void __launch_bounds__(kThreads) kv_commit(Program p) {
  extern __shared__ float workspace[];
  if (!p.init(static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x))) return;
  p.kfac = workspace;
  const int warp = static_cast<int>(threadIdx.x / 32);
  for (int j = warp; j < p.total; j += kWarps) p.dots(j, warp_group{});
  __syncthreads();
  p.rows(warp, kWarps, warp_group{});
}

template <class In, class ValueT>
__global__ void kv_buffer_append(kv_buffer_ref<In, ValueT> buf, int slot, int tokens, const In* k, const float* u,
                                 const float* g) {
  const int t = static_cast<int>(blockIdx.y), hv = static_cast<int>(blockIdx.x);
  if (t >= tokens) return;
  for (int c = static_cast<int>(threadIdx.x); c < max(buf.key_dim, buf.value_dim); c += static_cast<int>(blockDim.x))
    append_token_item(buf, slot, t, k + static_cast<std::int64_t>(t) * buf.num_k_heads * buf.key_dim,
                      u + static_cast<std::int64_t>(t) * buf.num_v_heads * buf.value_dim,
                      g ? g + static_cast<std::int64_t>(t) * buf.num_v_heads : nullptr, hv, c);
}

template <class T>
__global__ void count_nonfinite(const T* data, std::int64_t n, unsigned int* count) {
  unsigned int local = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    local += is_finite(to_float(data[i])) ? 0u : 1u;
  if (local != 0) atomicAdd(count, local);
}

template <class In>
__global__ void qwen3_next_gates(const In* a, const In* b, const float* a_log, const float* dt_bias, float* log_decay,
                                 float* beta, std::int64_t tokens, int num_v_heads) {
  const std::int64_t n = tokens * num_v_heads;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int hv = static_cast<int>(i % num_v_heads);
    log_decay[i] = qwen3_next_log_decay(a_log[hv], to_float(a[i]), dt_bias[hv]);
    beta[i] = qwen3_next_beta(to_float(b[i]));
  }
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

/// Debug builds: throws invalid_argument when `data[0..n)` (device) holds a NaN or an Inf.
template <class T>
void check_finite_device(const char* what, const T* data, std::int64_t n, cudaStream_t stream) {
#if !defined(NDEBUG)
  if (data == nullptr || n == 0) return;
  device_array<unsigned int> count(1);
  HYBRIDCACHE_CUDA_TRY(cudaMemsetAsync(count.data(), 0, sizeof(unsigned int), stream));
  kernels::count_nonfinite<<<static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 1024)), 256, 0, stream>>>(
      data, n, count.data());
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
  unsigned int host = 0;
  HYBRIDCACHE_CUDA_TRY(cudaMemcpyAsync(&host, count.data(), sizeof host, cudaMemcpyDeviceToHost, stream));
  HYBRIDCACHE_CUDA_TRY(cudaStreamSynchronize(stream));
  HYBRIDCACHE_EXPECTS(host == 0, invalid_argument, std::string(what) + " holds " + std::to_string(host) + " NaN/Inf values");
#else
  (void)what, (void)data, (void)n, (void)stream;
#endif
}

template <int DK, int DV, class In, class Out>
void check_step(const step_io<In, Out>& io, std::span<const std::int32_t> host_slots, const state_pool& pool,
                cudaStream_t stream) {
  HYBRIDCACHE_EXPECTS(io.num_k_heads > 0 && io.num_v_heads > 0 && io.num_v_heads % io.num_k_heads == 0,
                      invalid_argument, "num_v_heads must be a positive multiple of num_k_heads");
  HYBRIDCACHE_EXPECTS(io.batch >= 0 && io.batch <= 65535, invalid_argument, "batch must be in [0, 65535]");
  HYBRIDCACHE_EXPECTS(io.new_tokens >= 1, invalid_argument, "new_tokens must be >= 1");
  check_slots(host_slots, io.batch, pool.num_slots);
  const std::int64_t tokens = static_cast<std::int64_t>(io.batch) * io.new_tokens;
  check_finite_device("q", io.q, tokens * io.num_k_heads * DK, stream);
  check_finite_device("k", io.k, tokens * io.num_k_heads * DK, stream);
  check_finite_device("v", io.v, tokens * io.num_v_heads * DV, stream);
  check_finite_device("log_decay", io.log_decay, tokens * io.num_v_heads, stream);
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

inline dim3 grid_of(int batch, int num_v_heads) {
  return dim3(static_cast<unsigned>(num_v_heads), static_cast<unsigned>(std::max(batch, 1)));
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
  recurrent_program<Rule, Layout, DK, DV, In, Out> p{io, intermediate};
  p.io.states = pool.data;
  kernels::recurrent_step<<<detail::grid_of(io.batch, io.num_v_heads), kThreads, 0, stream>>>(p);
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
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
  const auto bytes = static_cast<std::size_t>(program::workspace_floats(max_total, io.new_tokens, kWarps)) * sizeof(float);
  if (bytes > 48 * 1024)
    HYBRIDCACHE_CUDA_TRY(cudaFuncSetAttribute(kernels::kv_step<program>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(bytes)));
  program p{io, buf, table.config().flush_interval, table.config().kv_only_crossover, decode};
  p.io.states = pool.data;
  kernels::kv_step<<<grid_of(io.batch, io.num_v_heads), kThreads, bytes, stream>>>(p);
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
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
  const auto bytes = static_cast<std::size_t>(program::workspace_floats(max_total)) * sizeof(float);
  program p{slots, accepted, num_k_heads, num_v_heads, pool.data, buf, qk, table.config().flush_interval,
            table.config().kv_only_crossover};
  kernels::kv_commit<<<detail::grid_of(static_cast<int>(host_slots.size()), num_v_heads), kThreads, bytes, stream>>>(p);
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
}

/// Chunked prefill (chunkwise form through the UT transform for the delta rule) of a batch of
/// packed sequences, writing the state at every requested checkpoint position: at a chunk
/// boundary directly, inside a chunk by rolling forward from the previous boundary. Chunk
/// sizes 1..64. `host` mirrors the index arrays for validation.
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
  detail::check_finite_device("log_decay", io.log_decay, tokens * io.num_v_heads, stream);
  detail::check_finite_device("beta", io.beta, tokens * io.num_v_heads, stream);
  if (io.num_seqs == 0) return;
  prefill_io<In, Out> p = io;
  p.states = pool.data;
  if (!ckpts) p.checkpoint_offsets = nullptr;
  const auto bytes = static_cast<std::size_t>(chunk_workspace::floats(io.chunk, kWarps)) * sizeof(float);
  auto kernel = kernels::chunked_prefill<Rule, Layout, DK, DV, In, Out>;
  if (bytes > 48 * 1024)
    HYBRIDCACHE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  kernel<<<detail::grid_of(io.num_seqs, io.num_v_heads), kThreads, bytes, stream>>>(p);
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
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
  kernels::kv_buffer_append<<<dim3(static_cast<unsigned>(buf.num_v_heads), static_cast<unsigned>(tokens)), kThreads, 0,
                              stream>>>(buf, slot, tokens, k, u, g);
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
}

/// Qwen3-Next gates for `tokens` x `num_v_heads`: log_decay = -exp(A_log) softplus(a + dt_bias),
/// beta = sigmoid(b). All pointers are device memory.
template <class In>
void launch_qwen3_next_gates(const In* a, const In* b, const float* a_log, const float* dt_bias, float* log_decay,
                             float* beta, std::int64_t tokens, int num_v_heads, cudaStream_t stream = nullptr) {
  HYBRIDCACHE_EXPECTS(tokens >= 0 && num_v_heads > 0, invalid_argument, "qwen3_next_gates: bad shape");
  const std::int64_t n = tokens * num_v_heads;
  if (n == 0) return;
  kernels::qwen3_next_gates<<<static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 4096)), 256, 0, stream>>>(
      a, b, a_log, dt_bias, log_decay, beta, tokens, num_v_heads);
  HYBRIDCACHE_CUDA_TRY(cudaGetLastError());
}

}  // namespace hybridcache::cuda
