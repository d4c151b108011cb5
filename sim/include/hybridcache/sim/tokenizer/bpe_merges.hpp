// hybridcache/sim/tokenizer/bpe_merges.hpp
//
// The merge side of the byte-level BPE tokenizer (bpe_tokenizer.hpp): the merge table (a
// pair of ids -> its rank and the id it makes) and the merge of one pre-token in the
// `tokenizers` package's order: repeatedly the pair of lowest rank, the leftmost among
// equal ranks. That order is the definition the fast encoder (bpe_backtracking.hpp) is
// proved and tested against, and the fallback wherever the fast one does not apply.
//
// Cost: `find` is one load for two ids below `dense_ids` (the byte tokens and the first
// merges) and an open-addressing probe otherwise (load factor <= 1/2). `bpe_word_merger`
// merges a pre-token of up to 64 bytes over a linked array of pair ranks with a two-level
// minimum (O(16) compares and 2 lookups per merge) and a longer one with a heap of
// candidate merges (O(n log n)); it reuses its buffers (no allocation once warm).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/core/hash.hpp"

namespace hybridcache::sim {

/// What a merge makes: its rank (its index in the merge list; lower merges first) and the
/// id of the merged token.
struct bpe_merge_target {
  std::int32_t rank;
  token_id id;
};

/// The merges of a BPE model, keyed by the pair of ids they join.
class bpe_merge_table {
 public:
  /// Rank of "no merge" in comparisons.
  static constexpr std::int32_t no_rank = std::numeric_limits<std::int32_t>::max();
  /// Pairs of two ids below this are also kept in a dense table (2 MiB).
  static constexpr std::uint32_t dense_ids = 512;

  /// Prepares for `merges` pairs.
  void reserve(std::size_t merges) {
    std::size_t slots = 16;
    while (slots < 2 * merges) slots *= 2;
    table_.assign(slots, slot{empty_key, {0, 0}});
    mask_ = slots - 1;
    count_ = 0;
    dense_.clear();
  }

  /// Adds merge `rank` of (a, b) into `result`. A pair already present is replaced: the last
  /// one wins, as in the package. Call `finish` after the last one.
  void add(token_id a, token_id b, std::int32_t rank, token_id result) {
    const std::uint64_t key = pair_key(a, b);
    std::size_t i = splitmix64_mix(key) & mask_;
    while (table_[i].key != empty_key && table_[i].key != key) i = (i + 1) & mask_;
    if (table_[i].key == empty_key) ++count_;
    table_[i] = {key, {rank, result}};
  }

  /// Fills the dense table of low-id pairs.
  void finish() {
    dense_.assign(std::size_t{dense_ids} * dense_ids, bpe_merge_target{no_rank, 0});
    for (const slot& m : table_) {
      if (m.key == empty_key) continue;
      const auto a = static_cast<std::uint32_t>(m.key >> 32), b = static_cast<std::uint32_t>(m.key & 0xffffffffu);
      if (a < dense_ids && b < dense_ids) dense_[std::size_t{a} * dense_ids + b] = m.target;
    }
  }

  /// The merge of (a, b), or null.
  [[nodiscard]] const bpe_merge_target* find(token_id a, token_id b) const noexcept {
    if (static_cast<std::uint32_t>(a) < dense_ids && static_cast<std::uint32_t>(b) < dense_ids) {
      const bpe_merge_target& t = dense_[static_cast<std::size_t>(a) * dense_ids + static_cast<std::size_t>(b)];
      return t.rank == no_rank ? nullptr : &t;
    }
    const std::uint64_t key = pair_key(a, b);
    for (std::size_t i = splitmix64_mix(key) & mask_;; i = (i + 1) & mask_) {
      if (table_[i].key == key) return &table_[i].target;
      if (table_[i].key == empty_key) return nullptr;
    }
  }

  /// Number of distinct pairs.
  [[nodiscard]] std::size_t size() const noexcept { return count_; }

  /// Calls `f(a, b, target)` for every pair (in table order).
  template <class F>
  void for_each(F&& f) const {
    for (const slot& m : table_)
      if (m.key != empty_key)
        f(static_cast<token_id>(m.key >> 32), static_cast<token_id>(m.key & 0xffffffffu), m.target);
  }

 private:
  struct slot {
    std::uint64_t key;  // empty_key: free
    bpe_merge_target target;
  };
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};  // never a pair of ids >= 0

  [[nodiscard]] static std::uint64_t pair_key(token_id a, token_id b) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  std::vector<slot> table_;
  std::size_t mask_ = 0;
  std::size_t count_ = 0;
  std::vector<bpe_merge_target> dense_;
};

/// Merges one pre-token in the package's order. Not thread-safe (its buffers).
class bpe_word_merger {
 public:
  /// Words of up to this many bytes are merged over fixed arrays.
  static constexpr std::size_t small_word = 64;

  /// Appends the ids of `piece` to `out`: its bytes' ids (`byte_ids`; a byte without an id
  /// is dropped, as the package does without an unk token), merged.
  void merge(std::string_view piece, const std::array<token_id, 256>& byte_ids, const bpe_merge_table& merges,
             std::vector<token_id>& out) {
    if (piece.size() <= small_word)
      merge_small(piece, byte_ids, merges, out);
    else
      merge_heap(piece, byte_ids, merges, out);
  }

 private:
  struct symbol {
    token_id id;
    std::int32_t prev;
    std::int32_t next;
    bool alive;
  };
  struct candidate {
    std::int32_t rank;
    std::int32_t pos;
    token_id id;
    token_id left;
    token_id right;
    bool operator>(const candidate& o) const noexcept { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  // The symbols sit in fixed arrays linked in order; rank[i] is the rank of the pair that
  // starts at live symbol i (none for the last one and for dead slots). The minimum is
  // found in two levels, 8 blocks of 8 slots, so a merge costs O(8 + 8) compares and three
  // block refreshes instead of a scan and a shift of the whole word. Leftmost among equal
  // ranks: the first block holding the minimum, then its first slot.
  static void merge_small(std::string_view piece, const std::array<token_id, 256>& byte_ids, const bpe_merge_table& merges,
                          std::vector<token_id>& out) {
    constexpr std::int32_t none = bpe_merge_table::no_rank;
    constexpr std::size_t block = 8, blocks = small_word / block;
    std::array<token_id, small_word> ids{};
    std::array<token_id, small_word> merged{};
    std::array<std::int32_t, small_word> rank{};
    std::array<std::uint8_t, small_word> next{}, prev{};
    std::array<std::int32_t, blocks> block_min{};
    constexpr std::uint8_t end = 0xff;
    std::size_t n = 0;
    for (char c : piece) {
      const token_id id = byte_ids[static_cast<unsigned char>(c)];
      if (id >= 0) ids[n++] = id;
    }
    if (n == 0) return;
    rank.fill(none);
    for (std::size_t i = 0; i < n; ++i) {
      next[i] = i + 1 < n ? static_cast<std::uint8_t>(i + 1) : end;
      prev[i] = i > 0 ? static_cast<std::uint8_t>(i - 1) : end;
    }
    auto set_pair = [&](std::size_t i) {
      if (next[i] == end) {
        rank[i] = none;
        return;
      }
      const bpe_merge_target* m = merges.find(ids[i], ids[next[i]]);
      rank[i] = m != nullptr ? m->rank : none;
      merged[i] = m != nullptr ? m->id : 0;
    };
    auto refresh = [&](std::size_t b) {
      std::int32_t lo = none;
      for (std::size_t i = b * block; i < (b + 1) * block; ++i) lo = std::min(lo, rank[i]);
      block_min[b] = lo;
    };
    for (std::size_t i = 0; i + 1 < n; ++i) set_pair(i);
    for (std::size_t b = 0; b < blocks; ++b) refresh(b);
    while (true) {
      std::size_t best_block = 0;
      for (std::size_t b = 1; b < blocks; ++b)
        if (block_min[b] < block_min[best_block]) best_block = b;
      const std::int32_t lo = block_min[best_block];
      if (lo == none) break;
      std::size_t i = best_block * block;
      while (rank[i] != lo) ++i;
      const std::size_t j = next[i];
      ids[i] = merged[i];
      next[i] = next[j];
      if (next[j] != end) prev[next[j]] = static_cast<std::uint8_t>(i);
      rank[j] = none;
      set_pair(i);
      refresh(j / block);
      refresh(i / block);
      if (prev[i] != end) {
        set_pair(prev[i]);
        refresh(prev[i] / block);
      }
    }
    for (std::size_t i = 0; i != end; i = next[i]) out.push_back(ids[i]);
  }

  void merge_heap(std::string_view piece, const std::array<token_id, 256>& byte_ids, const bpe_merge_table& merges,
                  std::vector<token_id>& out) {
    symbols_.clear();
    for (char c : piece) {
      const token_id id = byte_ids[static_cast<unsigned char>(c)];
      if (id < 0) continue;
      const auto idx = static_cast<std::int32_t>(symbols_.size());
      symbols_.push_back({id, idx - 1, idx + 1, true});
    }
    if (symbols_.empty()) return;
    symbols_.back().next = -1;
    // A min-heap on (rank, position) in a reused vector; a candidate is stale when the
    // pair at its position changed since it was pushed.
    heap_.clear();
    const auto later = [](const candidate& a, const candidate& b) { return a > b; };
    auto candidate_at = [&](std::int32_t pos, candidate& c) {
      const std::int32_t nx = symbols_[static_cast<std::size_t>(pos)].next;
      if (nx < 0) return false;
      const token_id a = symbols_[static_cast<std::size_t>(pos)].id, b = symbols_[static_cast<std::size_t>(nx)].id;
      const bpe_merge_target* m = merges.find(a, b);
      if (m == nullptr) return false;
      c = {m->rank, pos, m->id, a, b};
      return true;
    };
    auto push_pair = [&](std::int32_t pos) {
      candidate c{};
      if (!candidate_at(pos, c)) return;
      heap_.push_back(c);
      std::push_heap(heap_.begin(), heap_.end(), later);
    };
    candidate c{};
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(symbols_.size()); ++i)
      if (candidate_at(i, c)) heap_.push_back(c);
    std::make_heap(heap_.begin(), heap_.end(), later);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      const candidate top = heap_.back();
      heap_.pop_back();
      symbol& left = symbols_[static_cast<std::size_t>(top.pos)];
      if (!left.alive || left.next < 0) continue;
      symbol& right = symbols_[static_cast<std::size_t>(left.next)];
      if (left.id != top.left || right.id != top.right) continue;  // stale: the pair changed
      left.id = top.id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<std::size_t>(right.next)].prev = top.pos;
      if (left.prev >= 0) push_pair(left.prev);
      push_pair(top.pos);
    }
    for (const symbol& s : symbols_)
      if (s.alive) out.push_back(s.id);
  }

  std::vector<symbol> symbols_;
  std::vector<candidate> heap_;
};

namespace detail {

// Sorts merges (anything with a `rank`, constructible from {rank, 0, 0, 0}) by rank. Ranks
// are distinct (one per pair) and below the merge list's length, so each goes straight to
// its place (O(n), no comparisons), gaps squeezed out.
template <class Merge>
void sort_by_rank(std::vector<Merge>& list) {
  std::int32_t top = -1;
  for (const Merge& m : list) {
    if (m.rank < 0) return std::sort(list.begin(), list.end(), [](const Merge& x, const Merge& y) { return x.rank < y.rank; });
    top = std::max(top, m.rank);
  }
  if (static_cast<std::size_t>(top) >= 4 * list.size() + 64)  // sparse ranks: sort
    return std::sort(list.begin(), list.end(), [](const Merge& x, const Merge& y) { return x.rank < y.rank; });
  std::vector<Merge> placed(static_cast<std::size_t>(top) + 1, Merge{-1, 0, 0, 0});
  for (const Merge& m : list) placed[static_cast<std::size_t>(m.rank)] = m;
  std::size_t k = 0;
  for (const Merge& m : placed)
    if (m.rank >= 0) list[k++] = m;
}

}  // namespace detail

}  // namespace hybridcache::sim
