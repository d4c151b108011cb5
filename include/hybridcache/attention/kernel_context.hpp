// hybridcache/attention/kernel_context.hpp
//
// What a kernel body asks of the hardware, so that one body runs under nvcc and on the host.
//
// Every `__global__` kernel of attention/cuda/ is a one-line wrapper that calls a body in
// kernel_bodies.hpp with an *execution context* `ctx`: `cuda_context` under nvcc (threadIdx,
// __syncthreads, __shfl_*_sync, extern __shared__), or the CTA emulator's lane in the tests
// (tests/support/cta_emulator.hpp: a real thread per lane, barriers, NaN-poisoned shared
// memory). A context offers, with CUDA's meaning:
//
//   ctx.thread()  ctx.block_threads()  ctx.block()  ctx.grid_blocks()  ctx.lane_id()  ctx.warp_id()
//   ctx.sync_threads()  ctx.sync_warp()
//   ctx.shfl_xor(v, mask)  ctx.shfl_up(v, delta)  ctx.shfl(v, src)      (4-byte v, full warp)
//   ctx.ballot(p)  ctx.any(p)  ctx.all(p)
//   ctx.shared<T>()                                                     (dynamic shared memory)
//   ctx.atomic_add(std::uint32_t*, std::uint32_t)
//
// A template parameter was chosen over macros (redefining threadIdx/__syncthreads for a host
// build): the bodies were already templates over the cooperative group, the context is a
// value the compiler inlines away under nvcc (same PTX as direct intrinsics), and the host
// build needs no CUDA header and no macro that leaks into user code.
//
// Also here: `warp_group` (a warp as the cooperative group of the row primitives), the launch
// shape every launcher and the emulator share, a byte carver for shared-memory workspaces,
// and the bank-conflict count behind the static checks of the shared-memory layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hybridcache/core/config.hpp"

namespace hybridcache::attention {

/// Threads per CTA of every batched kernel (4 warps).
inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;

/// A 1-D launch: `blocks` CTAs of `threads` threads with `shared_bytes` of dynamic shared memory.
struct kernel_launch_shape {
  std::uint64_t blocks = 0;
  std::uint32_t threads = kThreads;
  std::size_t shared_bytes = 0;
};

/// Largest grid a 1-D launch may have (gridDim.x).
inline constexpr std::uint64_t max_grid_blocks = 2147483647ull;

/// `Size` lanes of a warp (32: the whole warp; 16: each half) as a cooperative group: lanes
/// split d_k, sums by xor butterfly (offsets Size/2, ..., 2, 1; every lane gets its group's
/// total, in the same order on every lane and in the emulator), scans by shfl_up.
///
/// Half warps (`half_warp_group`) let a warp work on two rows at once, each lane holding twice
/// the elements: a dot product's sum takes 4 butterfly rounds for two rows where a whole warp
/// takes 5 for one, and the work done once per row (one member's scalar math) serves two rows
/// per instruction. The shuffles are whole-warp instructions (offsets below 16 stay in a half),
/// so both halves must reach each `sum`, `sync` and shuffle together: a loop over rows must
/// run the same number of iterations in both halves.
template <class Ctx, int Size>
struct lane_group {
  static_assert(Size == 32 || Size == 16, "a warp or a half warp");
  static constexpr int size = Size;
  const Ctx& ctx;

  HYBRIDCACHE_HD_INLINE int rank() const { return ctx.lane_id() & (Size - 1); }
  /// Which group of the warp this lane is in (0 for a whole warp; 0 or 1 for half warps).
  HYBRIDCACHE_HD_INLINE int half() const { return ctx.lane_id() / Size; }
  HYBRIDCACHE_HD_INLINE float sum(float x) const {
    HYBRIDCACHE_UNROLL
    for (int offset = Size / 2; offset > 0; offset >>= 1) x += ctx.shfl_xor(x, offset);
    return x;
  }
  HYBRIDCACHE_HD_INLINE void sync() const { ctx.sync_warp(); }
  /// Valid where rank() >= delta (the lanes below read another group's).
  template <class T>
  HYBRIDCACHE_HD_INLINE T shfl_up(T v, int delta) const {
    return ctx.shfl_up(v, delta);
  }
  template <class T>
  HYBRIDCACHE_HD_INLINE T shfl_idx(T v, int src) const {
    return ctx.shfl(v, (ctx.lane_id() & ~(Size - 1)) + src);
  }
};

/// A whole warp as a group.
template <class Ctx>
using warp_group = lane_group<Ctx, 32>;
/// Each half of a warp as a group.
template <class Ctx>
using half_warp_group = lane_group<Ctx, 16>;

/// Splits a workspace (dynamic shared memory, or a host buffer) into typed arrays, each
/// aligned to 16 bytes. With a null base it only counts: `offset` is then the bytes a layout
/// needs, so launchers and kernels size and carve with the same code.
struct workspace_carver {
  std::byte* base = nullptr;
  std::size_t offset = 0;

  template <class T>
  HYBRIDCACHE_HD_INLINE T* take(std::int64_t count) {
    offset = (offset + 15) / 16 * 16;
    T* p = base != nullptr ? reinterpret_cast<T*>(base + offset) : nullptr;
    offset += static_cast<std::size_t>(count) * sizeof(T);
    return p;
  }
};

/// Bytes of workspace `program.carve(carver, args...)` lays out (what a launcher sizes):
/// the program's own carve with a counting carver, so size and layout cannot disagree.
template <class Program, class... Args>
HYBRIDCACHE_HD_INLINE std::size_t carved_bytes(Program program, Args... args) {
  workspace_carver w;
  program.carve(w, args...);
  return w.offset;
}

/// A reusable, 16-byte aligned host buffer for the host drivers' workspaces (the kernels use
/// dynamic shared memory instead).
class workspace_buffer {
 public:
  std::byte* get(std::size_t bytes) {
    const std::size_t blocks = (bytes + 15) / 16;
    if (buf_.size() < blocks) buf_.resize(blocks);
    return reinterpret_cast<std::byte*>(buf_.data());
  }

 private:
  struct alignas(16) block {
    std::byte b[16];
  };
  std::vector<block> buf_;
};

/// Smallest row stride (in elements of `ElemBytes` bytes) >= `n` whose length in 4-byte
/// words is odd: consecutive rows then start in different banks, so a warp whose lanes read
/// one element of 32 different rows touches 32 different banks.
HYBRIDCACHE_HD_INLINE constexpr int padded_stride(int n, int elem_bytes) {
  int s = n;
  while ((s * elem_bytes) % 4 != 0 || ((s * elem_bytes) / 4) % 2 == 0) ++s;
  return s;
}

/// Shared-memory bank conflict of one warp-wide access: `byte_of(lane)` is the byte offset a
/// lane reads or writes (negative when the lane is idle). Returns the largest number of
/// distinct 4-byte words that fall into one of the 32 banks (1: conflict-free; one word read
/// by several lanes is a broadcast and counts once).
template <class ByteOf>
constexpr int bank_ways(const ByteOf& byte_of) {
  std::int64_t words[32] = {};
  int n = 0;
  for (int l = 0; l < 32; ++l) {
    const std::int64_t b = byte_of(l);
    if (b < 0) continue;
    const std::int64_t w = b / 4;
    bool seen = false;
    for (int i = 0; i < n; ++i) seen = seen || words[i] == w;
    if (!seen) words[n++] = w;
  }
  int worst = 0;
  for (int bank = 0; bank < 32; ++bank) {
    int ways = 0;
    for (int i = 0; i < n; ++i) ways += words[i] % 32 == bank ? 1 : 0;
    worst = ways > worst ? ways : worst;
  }
  return worst;
}

}  // namespace hybridcache::attention
