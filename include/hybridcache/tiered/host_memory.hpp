// hybridcache/tiered/host_memory.hpp
//
// Page-aligned host arenas for the host and CXL tiers, optionally bound to a NUMA node
// (a CXL memory expander appears as a CPU-less NUMA node; LMCache's recipe is allocate,
// bind, first-touch, then register for DMA — anchors/multitier.md §2.2).
//
// NUMA binding is a runtime choice (`numa_node >= 0`) and costs nothing at compile time:
//   - with HYBRIDCACHE_USE_LIBNUMA defined and <numa.h> present, libnuma checks the node
//     and its `mbind` wrapper (<numaif.h>) binds, so a refusal is reported (libnuma's
//     `numa_tonode_memory` returns nothing and only warns); the user links -lnuma;
//   - otherwise, on Linux, the `mbind` system call is issued directly (no library needed);
//   - elsewhere binding is unavailable and `bind_to_numa_node` returns false.
// The library never requires libnuma.
//
// Allocation is O(bytes) (the arena is touched once so that pages are placed now, not on
// the first copy), done once at start-up, never on a request path.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "hybridcache/core/error.hpp"

#if defined(HYBRIDCACHE_USE_LIBNUMA) && __has_include(<numa.h>) && __has_include(<numaif.h>)
#include <numa.h>
#include <numaif.h>
#define HYBRIDCACHE_NUMA_LIBNUMA 1
#elif defined(__linux__) && __has_include(<sys/syscall.h>) && __has_include(<unistd.h>)
#include <sys/syscall.h>
#include <unistd.h>
#define HYBRIDCACHE_NUMA_SYSCALL 1
#endif

namespace hybridcache::tiered {

/// Whether this build can bind memory to a NUMA node at all.
[[nodiscard]] constexpr bool numa_binding_available() noexcept {
#if defined(HYBRIDCACHE_NUMA_LIBNUMA) || (defined(HYBRIDCACHE_NUMA_SYSCALL) && defined(SYS_mbind))
  return true;
#else
  return false;
#endif
}

/// Binds `bytes` at `addr` (page aligned) to NUMA node `node`. Returns false when binding
/// is unavailable or the kernel refused (e.g. no such node); the memory stays usable.
inline bool bind_to_numa_node(void* addr, std::size_t bytes, int node) noexcept {
  if (node < 0 || addr == nullptr || bytes == 0) return false;
#if defined(HYBRIDCACHE_NUMA_LIBNUMA) || (defined(HYBRIDCACHE_NUMA_SYSCALL) && defined(SYS_mbind))
  if (node >= 1024) return false;
  unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {};
  mask[static_cast<std::size_t>(node) / (8 * sizeof(unsigned long))] |= 1ul << (static_cast<unsigned>(node) % (8 * sizeof(unsigned long)));
  constexpr int mpol_bind = 2;  // MPOL_BIND
  constexpr unsigned mpol_mf_move = 1u << 1;
#if defined(HYBRIDCACHE_NUMA_LIBNUMA)
  if (numa_available() < 0 || node > numa_max_node()) return false;
  return ::mbind(addr, bytes, mpol_bind, mask, 1024ul, mpol_mf_move) == 0;
#else
  return ::syscall(SYS_mbind, addr, bytes, mpol_bind, mask, 1024ul, mpol_mf_move) == 0;
#endif
#else
  return false;
#endif
}

/// An owned, page-aligned, zero-filled host buffer. Move-only.
class host_arena {
 public:
  static constexpr std::size_t alignment = 4096;

  host_arena() = default;
  /// Allocates `bytes` (> 0); binds to `numa_node` when >= 0 and binding is available
  /// (`bound()` says whether it happened). @throws invalid_argument for bytes <= 0,
  /// std::bad_alloc when the memory is not there.
  explicit host_arena(std::int64_t bytes, int numa_node = -1) : bytes_(bytes) {
    HYBRIDCACHE_EXPECTS(bytes > 0, invalid_argument, "host_arena: bytes must be > 0, got " + std::to_string(bytes));
    const std::size_t rounded = (static_cast<std::size_t>(bytes) + alignment - 1) / alignment * alignment;
    data_.reset(static_cast<std::byte*>(::operator new(rounded, std::align_val_t{alignment})));
    if (numa_node >= 0) bound_ = bind_to_numa_node(data_.get(), rounded, numa_node);
    std::memset(data_.get(), 0, rounded);  // first touch: place the pages now
  }

  [[nodiscard]] std::byte* data() noexcept { return data_.get(); }
  [[nodiscard]] const std::byte* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::int64_t size() const noexcept { return bytes_; }
  [[nodiscard]] bool bound() const noexcept { return bound_; }

 private:
  struct aligned_delete {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{alignment}); }
  };
  std::unique_ptr<std::byte, aligned_delete> data_;
  std::int64_t bytes_ = 0;
  bool bound_ = false;
};

}  // namespace hybridcache::tiered
