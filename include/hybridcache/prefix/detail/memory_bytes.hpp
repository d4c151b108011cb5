// hybridcache/prefix/detail/memory_bytes.hpp
//
// What a container holds on the heap, for the `memory_bytes()` reports of the radix tree,
// the scorers and the prefix cache (the adaptive selector compares its shadows' memory with
// the live cache's through them). Each counts the bytes the container asked its allocator
// for, live or kept for reuse (a vector's capacity, not its size), not the allocator's own
// per-block overhead. `counting_resource` is an upstream for a pooled memory resource that
// counts what the pool took (a pool keeps its chunks until it is destroyed, so the entries a
// pooled set holds now say nothing about its memory).
//
// Costs: every function O(1) but `heap_bytes(model_spec)` (O(1) too: three containers);
// `counting_resource` adds one addition per chunk the pool takes or gives back.
// Internal to the prefix cache and its scorers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <string>
#include <unordered_map>
#include <vector>

#include "hybridcache/model/cost_model.hpp"

namespace hybridcache::prefix::detail {

/// A vector's buffer: its capacity, whether used or kept.
template <class T, class A>
[[nodiscard]] std::int64_t heap_bytes(const std::vector<T, A>& v) noexcept {
  return static_cast<std::int64_t>(v.capacity() * sizeof(T));
}

/// A string's buffer when it is not stored inside the object (short strings are).
[[nodiscard]] inline std::int64_t heap_bytes(const std::string& s) noexcept {
  const char* p = s.data();
  const auto* self = reinterpret_cast<const char*>(&s);
  if (p >= self && p < self + sizeof(std::string)) return 0;
  return static_cast<std::int64_t>(s.capacity() + 1);
}

/// An unordered map: its bucket array and one node per entry (a next pointer, the value and,
/// counted whether or not the library caches it, the hash).
template <class K, class V, class H, class E, class A>
[[nodiscard]] std::int64_t heap_bytes(const std::unordered_map<K, V, H, E, A>& m) noexcept {
  using value_type = typename std::unordered_map<K, V, H, E, A>::value_type;
  return static_cast<std::int64_t>(m.bucket_count() * sizeof(void*) +
                                   m.size() * (sizeof(void*) + sizeof(std::size_t) + sizeof(value_type)));
}

/// A cost model's copy of its spec (every scorer that weighs FLOPs holds one).
[[nodiscard]] inline std::int64_t heap_bytes(const cost_model& m) noexcept {
  const model_spec& s = m.spec();
  return heap_bytes(s.name) + heap_bytes(s.source) + heap_bytes(s.layers);
}

/// Upstream of a pooled resource that counts the bytes it holds from `new_delete_resource`.
class counting_resource final : public std::pmr::memory_resource {
 public:
  /// Bytes taken and not given back.
  [[nodiscard]] std::int64_t bytes() const noexcept { return bytes_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t align) override {
    void* p = std::pmr::new_delete_resource()->allocate(bytes, align);
    bytes_ += static_cast<std::int64_t>(bytes);
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    std::pmr::new_delete_resource()->deallocate(p, bytes, align);
    bytes_ -= static_cast<std::int64_t>(bytes);
  }
  [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }

  std::int64_t bytes_ = 0;
};

}  // namespace hybridcache::prefix::detail
