// hybridcache/core/indexed_heap.hpp
//
// `detail::indexed_heap_ops`: the steps of an indexed binary min-heap, a heap of ids that
// records each id's position so any entry can be re-sorted or erased: push, sift up, sift
// down, re-sort and erase over a caller's vector of ids. The caller owns the keys and the
// positions (per-id arrays or slots) and passes `pos(id)` (a reference to id's recorded
// position) and `less(a, b)` (a strict total order of ids); the ops only move ids and keep
// the positions current. One spelling for the heaps that keep their keys outside the heap
// (prefix/node_heap.hpp, tiered/car_score.hpp).
//
// Costs: push, resift, erase O(log n) comparisons and swaps; sift_up / sift_down
// O(log n); nothing allocates but push (none when the vector's capacity covers it). The ops
// object is two references and two small functors, built per call.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace hybridcache::detail {

/// Heap steps over `heap` with positions `pos(id)` and order `less`. See the file comment.
template <class Id, class Pos, class Less>
struct indexed_heap_ops {
  std::vector<Id>& heap;
  Pos pos;    // Id -> std::uint32_t&: the id's recorded position
  Less less;  // (Id, Id) -> bool

  /// Appends `n` and sifts it up. Precondition: n is not in the heap.
  void push(Id n) {
    pos(n) = static_cast<std::uint32_t>(heap.size());
    heap.push_back(n);
    sift_up(pos(n));
  }
  /// Moves the entry at `i` towards the root while it is less than its parent; returns
  /// where it stops.
  std::uint32_t sift_up(std::uint32_t i) noexcept {
    while (i > 0) {
      const std::uint32_t p = (i - 1) / 2;
      if (!less(heap[i], heap[p])) break;
      swap_at(i, p);
      i = p;
    }
    return i;
  }
  /// Moves the entry at `i` towards the leaves while a child is less than it.
  void sift_down(std::uint32_t i) noexcept {
    const auto n = static_cast<std::uint32_t>(heap.size());
    while (true) {
      const std::uint32_t l = 2 * i + 1, r = l + 1;
      std::uint32_t m = i;
      if (l < n && less(heap[l], heap[m])) m = l;
      if (r < n && less(heap[r], heap[m])) m = r;
      if (m == i) break;
      swap_at(i, m);
      i = m;
    }
  }
  /// Re-sorts the entry at `i` after its key changed either way.
  void resift(std::uint32_t i) noexcept { sift_down(sift_up(i)); }
  /// Removes `n` (its position becomes `absent`); the last entry fills its place and is
  /// re-sorted. Precondition: n is in the heap.
  void erase(Id n, std::uint32_t absent) noexcept {
    const std::uint32_t i = pos(n);
    const Id last = heap.back();
    heap.pop_back();
    pos(n) = absent;
    if (last != n) {
      heap[i] = last;
      pos(last) = i;
      resift(i);
    }
  }
  void swap_at(std::uint32_t i, std::uint32_t j) noexcept {
    std::swap(heap[i], heap[j]);
    pos(heap[i]) = i;
    pos(heap[j]) = j;
  }
};

template <class Id, class Pos, class Less>
indexed_heap_ops(std::vector<Id>&, Pos, Less) -> indexed_heap_ops<Id, Pos, Less>;

}  // namespace hybridcache::detail
