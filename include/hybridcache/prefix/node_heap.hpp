// hybridcache/prefix/node_heap.hpp
//
// `detail::basic_node_heap<Key>`: an indexed binary min-heap of node ids ordered by
// (key, node id), the eviction index of the scorers whose victim is the minimum of one
// order (lru_scorer: last access; gdsf_scorer: priority). The order is the one a
// std::set<std::pair<Key, node_id>> keeps (key first, ties by the lower id), so its top is
// that set's first element, and ids are unique, so the order is total.
//
// Costs: top O(1); set (insert or move) / erase O(log n); contains / key O(1); clear
// O(size). A position and a key per node id live in per-id arrays, grown by reserve();
// nothing else allocates (no node per entry, unlike a set). Memory: 4 + sizeof(Key) bytes
// per node id plus 4 bytes per entry.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "hybridcache/core/indexed_heap.hpp"
#include "hybridcache/prefix/detail/memory_bytes.hpp"
#include "hybridcache/prefix/types.hpp"

namespace hybridcache::prefix::detail {

/// Indexed binary min-heap of node ids ordered by (key, id). See the file comment.
template <class Key>
class basic_node_heap {
 public:
  static constexpr std::uint32_t absent = 0xffffffffu;

  /// Covers node ids < `ids` (positions, keys and the heap's capacity).
  void reserve(std::size_t ids) {
    if (pos_.size() < ids) {
      reserve_geometric(pos_, ids);
      reserve_geometric(key_, ids);
      pos_.resize(ids, absent);
      key_.resize(ids, Key{});
    }
    reserve_geometric(heap_, ids);
  }
  [[nodiscard]] bool contains(node_id n) const noexcept { return n < pos_.size() && pos_[n] != absent; }
  [[nodiscard]] bool empty() const noexcept { return heap_.empty(); }
  [[nodiscard]] node_id top() const noexcept { return heap_.empty() ? no_node : heap_[0]; }
  /// The key of `n`. Precondition: contains(n) (otherwise the last key it had, or Key{}).
  [[nodiscard]] const Key& key(node_id n) const noexcept { return key_[n]; }
  [[nodiscard]] std::size_t size() const noexcept { return heap_.size(); }
  /// Heap bytes of the three arrays (their capacities). O(1).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept {
    return heap_bytes(heap_) + heap_bytes(pos_) + heap_bytes(key_);
  }
  /// Empties the heap (positions reset). O(size); keeps the capacity.
  void clear() noexcept {
    for (node_id n : heap_) pos_[n] = absent;
    heap_.clear();
  }

  /// Inserts `n` or moves it to `key`. Precondition: reserve() covered n.
  void set(node_id n, Key key) noexcept {
    key_[n] = std::move(key);
    if (pos_[n] == absent) ops().push(n);  // capacity reserved
    else ops().resift(pos_[n]);
  }
  void erase(node_id n) noexcept {
    if (contains(n)) ops().erase(n, absent);
  }

 private:
  /// std::pair's `<` on (key, id).
  [[nodiscard]] bool less(node_id a, node_id b) const noexcept {
    return key_[a] < key_[b] || (!(key_[b] < key_[a]) && a < b);
  }
  [[nodiscard]] auto ops() noexcept {
    return ::hybridcache::detail::indexed_heap_ops{heap_, [this](node_id n) -> std::uint32_t& { return pos_[n]; },
                                                   [this](node_id a, node_id b) { return less(a, b); }};
  }

  std::vector<node_id> heap_;
  std::vector<std::uint32_t> pos_;
  std::vector<Key> key_;
};

/// The LRU index: keys are last-access times.
using node_heap = basic_node_heap<std::uint64_t>;

}  // namespace hybridcache::prefix::detail
