// hybridcache/core/python_heapq.hpp
//
// CPython's `heapq` on a std::vector, step for step: `_siftdown`, `_siftup` (which walks the
// smaller child down to a leaf and then sifts the item back up), `heapify`, `heappop` and
// `heappush`. Only `less(a, b)` is ever asked, exactly where CPython asks `a < b`, so items
// that compare equal end up in the same places as in Python. Reproducing a Python
// reference's tie order (the Marconi reference's LRU eviction rounds) needs this; a heap
// with a tie-breaker does not.
//
// Costs as in CPython: heapify O(n), heappop / heappush O(log n). heappush may allocate
// (reserve the vector to avoid it); nothing else allocates.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace hybridcache::python_heapq {

/// `heapq._siftdown(heap, startpos, pos)`: moves heap[pos] up towards startpos.
template <class T, class Less>
void siftdown(std::vector<T>& heap, std::size_t startpos, std::size_t pos, Less less) {
  T newitem = std::move(heap[pos]);
  while (pos > startpos) {
    const std::size_t parentpos = (pos - 1) >> 1;
    if (!less(newitem, heap[parentpos])) break;
    heap[pos] = std::move(heap[parentpos]);
    pos = parentpos;
  }
  heap[pos] = std::move(newitem);
}

/// `heapq._siftup(heap, pos)`: moves the smaller child up until a leaf is reached, puts
/// heap[pos] there and sifts it back towards pos.
template <class T, class Less>
void siftup(std::vector<T>& heap, std::size_t pos, Less less) {
  const std::size_t endpos = heap.size();
  const std::size_t startpos = pos;
  T newitem = std::move(heap[pos]);
  std::size_t childpos = 2 * pos + 1;
  while (childpos < endpos) {
    const std::size_t rightpos = childpos + 1;
    if (rightpos < endpos && !less(heap[childpos], heap[rightpos])) childpos = rightpos;
    heap[pos] = std::move(heap[childpos]);
    pos = childpos;
    childpos = 2 * pos + 1;
  }
  heap[pos] = std::move(newitem);
  siftdown(heap, startpos, pos, less);
}

/// `heapq.heapify(heap)`.
template <class T, class Less>
void heapify(std::vector<T>& heap, Less less) {
  for (std::size_t i = heap.size() / 2; i-- > 0;) siftup(heap, i, less);
}

/// `heapq.heappop(heap)`. Precondition: !heap.empty().
template <class T, class Less>
[[nodiscard]] T heappop(std::vector<T>& heap, Less less) {
  T last = std::move(heap.back());
  heap.pop_back();
  if (heap.empty()) return last;
  T top = std::move(heap[0]);
  heap[0] = std::move(last);
  siftup(heap, 0, less);
  return top;
}

/// `heapq.heappush(heap, item)`.
template <class T, class Less>
void heappush(std::vector<T>& heap, T item, Less less) {
  heap.push_back(std::move(item));
  siftdown(heap, 0, heap.size() - 1, less);
}

}  // namespace hybridcache::python_heapq
