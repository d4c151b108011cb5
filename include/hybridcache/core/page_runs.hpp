// hybridcache/core/page_runs.hpp
//
// Pages as runs. A tier of the tiered store is an array of equal pages; an entry's copy in
// a tier owns some of them, in the entry's *logical* order (`page_list`), and the tier's
// free pages are kept by `page_allocator`. Both hold runs of adjacent pages, not one index
// per page, so their size follows fragmentation, not capacity: a 512 GiB host tier of
// 2 KiB pages is 2^28 pages, and a per-page free stack of it alone would take 1 GiB.
//
// The logical order of an entry is layer-major (tiered_store.hpp): `segments` equal
// segments, one per layer, so `slice` of a segment is that layer's bytes and a split at a
// token takes the same number of pages from the front of every segment
// (`split_segments`), without copying.
//
// Costs (r = runs of a list, F = free runs of a tier): page_list slice/append O(r),
// page(i) O(r); page_allocator take O((k + 1) log F) for the k runs it hands out, give
// O(r log F). The allocator's run maps recycle their nodes (a pool resource): after
// warm-up, take and give allocate nothing but the returned list's run vector.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory_resource>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

namespace hybridcache {

/// `count` adjacent pages from page `first`.
struct page_run {
  std::uint32_t first = 0;
  std::uint32_t count = 0;
  friend constexpr bool operator==(page_run, page_run) = default;
};

/// The pages of one copy of an entry, in the entry's logical order, as runs.
class page_list {
 public:
  page_list() = default;
  /// `count` pages from `first`.
  static page_list contiguous(std::uint32_t first, std::uint32_t count) {
    page_list l;
    l.push_back({first, count});
    return l;
  }

  [[nodiscard]] std::int64_t size() const noexcept { return pages_; }
  [[nodiscard]] bool empty() const noexcept { return pages_ == 0; }
  [[nodiscard]] std::span<const page_run> runs() const noexcept { return runs_; }
  void clear() noexcept {
    runs_.clear();
    pages_ = 0;
  }

  /// Logical page `i` (0 <= i < size()). O(runs).
  [[nodiscard]] std::uint32_t page(std::int64_t i) const noexcept {
    for (const page_run& r : runs_) {
      if (i < r.count) return r.first + static_cast<std::uint32_t>(i);
      i -= r.count;
    }
    return 0;
  }

  /// Appends a run, merging it into the last run when adjacent. Empty runs are ignored.
  void push_back(page_run r) {
    if (r.count == 0) return;
    if (!runs_.empty() && runs_.back().first + runs_.back().count == r.first) runs_.back().count += r.count;
    else runs_.push_back(r);
    pages_ += r.count;
  }
  void append(const page_list& o) {
    runs_.reserve(runs_.size() + o.runs_.size());
    for (const page_run& r : o.runs_) push_back(r);
  }

  /// The logical pages [first, first + n) (clamped to the list).
  [[nodiscard]] page_list slice(std::int64_t first, std::int64_t n) const {
    page_list out;
    first = std::max<std::int64_t>(first, 0);
    for (const page_run& r : runs_) {
      if (n <= 0) break;
      if (first >= r.count) {
        first -= r.count;
        continue;
      }
      const auto take = static_cast<std::uint32_t>(std::min<std::int64_t>(n, r.count - first));
      out.push_back({r.first + static_cast<std::uint32_t>(first), take});
      n -= take;
      first = 0;
    }
    return out;
  }

  /// Calls `f(page)` for every page in logical order.
  template <class F>
  void for_each_page(F&& f) const {
    for (const page_run& r : runs_)
      for (std::uint32_t p = 0; p < r.count; ++p) f(r.first + p);
  }

  friend bool operator==(const page_list& a, const page_list& b) {
    if (a.pages_ != b.pages_) return false;
    // Runs are kept merged, so equal page sequences have equal runs.
    return a.runs_ == b.runs_;
  }

 private:
  std::vector<page_run> runs_;
  std::int64_t pages_ = 0;
};

/// Splits a layer-major list of `segments` equal segments into its head (the first
/// `head_per_segment` pages of every segment, in segment order) and its tail (the rest).
/// Requires size() % segments == 0 and head_per_segment <= size() / segments.
[[nodiscard]] inline std::pair<page_list, page_list> split_segments(const page_list& l, std::int64_t segments,
                                                                    std::int64_t head_per_segment) {
  const std::int64_t per = l.size() / segments;
  std::pair<page_list, page_list> out;
  for (std::int64_t s = 0; s < segments; ++s) {
    out.first.append(l.slice(s * per, head_per_segment));
    out.second.append(l.slice(s * per + head_per_segment, per - head_per_segment));
  }
  return out;
}

/// The layer-major list whose segment s is `front`'s segment s followed by `back`'s (the
/// join of two entries with the same number of segments).
[[nodiscard]] inline page_list join_segments(const page_list& front, const page_list& back, std::int64_t segments) {
  const std::int64_t pf = front.size() / segments, pb = back.size() / segments;
  page_list out;
  for (std::int64_t s = 0; s < segments; ++s) {
    out.append(front.slice(s * pf, pf));
    out.append(back.slice(s * pb, pb));
  }
  return out;
}

/// The free pages of one tier, as runs indexed by address (to merge neighbours on give)
/// and by length (best fit on take).
class page_allocator {
 public:
  /// All `pages` pages free, as one run.
  explicit page_allocator(std::int64_t pages)
      : capacity_(pages), by_first_(&pool_), by_size_(&pool_) {
    if (pages > 0) insert_run({0, static_cast<std::uint32_t>(pages)});
    free_ = pages;
  }
  page_allocator(const page_allocator&) = delete;
  page_allocator& operator=(const page_allocator&) = delete;

  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int64_t free_pages() const noexcept { return free_; }
  [[nodiscard]] std::size_t free_runs() const noexcept { return by_first_.size(); }

  /// `n` free pages (n > 0) as a list, or nullopt (nothing changed) when fewer are free.
  /// Best fit: the shortest free run that holds all n (the lowest such), cut from its
  /// front, so consecutive allocations from one run are adjacent and their copies merge;
  /// when no run holds n, the longest runs first. @throws bad_alloc (nothing changed).
  [[nodiscard]] std::optional<page_list> take(std::int64_t n) {
    if (n <= 0 || n > free_) return std::nullopt;
    page_list out;
    if (const auto it = by_size_.lower_bound({static_cast<std::uint32_t>(std::min<std::int64_t>(n, UINT32_MAX)), 0});
        it != by_size_.end()) {
      out.push_back({it->second, static_cast<std::uint32_t>(n)});  // may throw: nothing changed yet
      cut_front(page_run{it->second, it->first}, static_cast<std::uint32_t>(n));
      free_ -= n;
      return out;
    }
    // Fragmented: reserve the list first, so that nothing below can throw half-way.
    std::int64_t runs = 0, covered = 0;
    for (auto it = by_size_.rbegin(); it != by_size_.rend() && covered < n; ++it, ++runs) covered += it->first;
    std::vector<page_run> take_runs;
    take_runs.reserve(static_cast<std::size_t>(runs));
    for (auto it = by_size_.rbegin(); it != by_size_.rend() && static_cast<std::int64_t>(take_runs.size()) < runs; ++it)
      take_runs.push_back({it->second, it->first});
    std::sort(take_runs.begin(), take_runs.end(), [](page_run a, page_run b) { return a.first < b.first; });
    page_list staged;
    for (const page_run& r : take_runs) staged.push_back(r);  // may throw: nothing changed yet
    std::int64_t left = n;
    for (const page_run& r : take_runs) {
      const auto k = static_cast<std::uint32_t>(std::min<std::int64_t>(left, r.count));
      out.push_back({r.first, k});
      cut_front(r, k);
      left -= k;
    }
    free_ -= n;
    return out;
  }

  /// Returns pages to the free set, merging adjacent runs. The pages must be allocated
  /// (not free) and distinct. @throws bad_alloc only before warm-up (a run node).
  void give(const page_list& l) {
    for (const page_run& r : l.runs()) give_run(r);
  }

  /// Calls f(page_run) for every free run in address order (invariant checks).
  template <class F>
  void for_each_free_run(F&& f) const {
    for (const auto& [first, count] : by_first_) f(page_run{first, count});
  }

 private:
  void insert_run(page_run r) {
    by_first_.emplace(r.first, r.count);
    try {
      by_size_.emplace(r.count, r.first);
    } catch (...) {
      by_first_.erase(r.first);
      throw;
    }
  }
  void erase_run(page_run r) noexcept {
    by_first_.erase(r.first);
    by_size_.erase({r.count, r.first});
  }
  // Takes k pages from the front of free run r (reuses the nodes: no allocation).
  void cut_front(page_run r, std::uint32_t k) noexcept {
    auto node_f = by_first_.extract(r.first);
    auto node_s = by_size_.extract({r.count, r.first});
    if (k == r.count) return;  // the run is used up; its nodes go back to the pool
    node_f.key() = r.first + k;
    node_f.mapped() = r.count - k;
    node_s.value() = {r.count - k, r.first + k};
    by_first_.insert(std::move(node_f));
    by_size_.insert(std::move(node_s));
  }
  void give_run(page_run r) {
    if (r.count == 0) return;
    free_ += r.count;
    auto next = by_first_.lower_bound(r.first);
    // Merge with the run before and the run after when adjacent.
    if (next != by_first_.begin()) {
      const auto prev = std::prev(next);
      if (prev->first + prev->second == r.first) {
        const page_run p{prev->first, prev->second};
        erase_run(p);
        r = {p.first, p.count + r.count};
        next = by_first_.lower_bound(r.first);
      }
    }
    if (next != by_first_.end() && r.first + r.count == next->first) {
      const page_run n{next->first, next->second};
      erase_run(n);
      r.count += n.count;
    }
    insert_run(r);
  }

  std::int64_t capacity_;
  std::int64_t free_ = 0;
  std::pmr::unsynchronized_pool_resource pool_;
  std::pmr::map<std::uint32_t, std::uint32_t> by_first_;              // first -> count
  std::pmr::set<std::pair<std::uint32_t, std::uint32_t>> by_size_;    // (count, first)
};

}  // namespace hybridcache
