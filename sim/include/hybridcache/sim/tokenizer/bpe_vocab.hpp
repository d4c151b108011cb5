// hybridcache/sim/tokenizer/bpe_vocab.hpp
//
// The vocabulary of the byte-level BPE tokenizer (bpe_tokenizer.hpp): token spellings ->
// ids, read once from a tokenizer.json of tens of thousands of entries and then looked up
// by the merges (three lookups each) and by `token_to_id`.
//
// Why not std::unordered_map<std::string, token_id>: that made one heap node and one string
// per token and hashed through std::hash; building and freeing it was a quarter of loading
// a 32k tokenizer. Here every spelling is appended to one byte arena, entries are plain
// records, and an open-addressing table of entry indices (at most half full, grown by
// doubling) finds them by a multiply-xor hash of 8 bytes at a time. Lookups take a
// string_view and never allocate.
//
// Cost: `assign` and `find` O(length) expected (one hash, a probe or two); growing
// O(entries) amortised. `for_each` visits entries in first-insertion order.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/core/hash.hpp"

namespace hybridcache::sim {

/// Token spelling -> id, over one byte arena. See the file comment.
class bpe_vocab {
 public:
  /// Sets the id of `token`; a spelling already present keeps its place and takes the new id
  /// (the last one wins, as a JSON object read into a map does). The caller bounds the count
  /// and the total length (under 4 GiB).
  void assign(std::string_view token, token_id id) {
    if (2 * (entries_.size() + 1) > slots_.size()) grow();
    const std::uint64_t h = hash(token);
    std::size_t i = static_cast<std::size_t>(h) & mask_;
    for (; slots_[i] != 0; i = (i + 1) & mask_) {
      entry& e = entries_[slots_[i] - 1];
      if (e.hash == h && spelling(e) == token) {
        e.id = id;
        return;
      }
    }
    entries_.push_back({static_cast<std::uint32_t>(bytes_.size()), static_cast<std::uint32_t>(token.size()), id, h});
    bytes_.append(token);
    slots_[i] = static_cast<std::uint32_t>(entries_.size());
  }

  /// The id of `token`, or -1.
  [[nodiscard]] token_id find(std::string_view token) const noexcept {
    if (entries_.empty()) return -1;
    const std::uint64_t h = hash(token);
    for (std::size_t i = static_cast<std::size_t>(h) & mask_; slots_[i] != 0; i = (i + 1) & mask_) {
      const entry& e = entries_[slots_[i] - 1];
      if (e.hash == h && spelling(e) == token) return e.id;
    }
    return -1;
  }

  /// The id of `token`, or -1, trying entry `next` first and setting `next` to the entry
  /// after the one found. A trainer lists the tokens that merges make in merge order, so
  /// looking the merges' results up in turn mostly hits the next entry: one comparison of
  /// adjacent bytes instead of a hash probe into the table.
  [[nodiscard]] token_id find_from(std::string_view token, std::size_t& next) const noexcept {
    if (next < entries_.size() && spelling(entries_[next]) == token) return entries_[next++].id;
    if (entries_.empty()) return -1;
    const std::uint64_t h = hash(token);
    for (std::size_t i = static_cast<std::size_t>(h) & mask_; slots_[i] != 0; i = (i + 1) & mask_) {
      const entry& e = entries_[slots_[i] - 1];
      if (e.hash == h && spelling(e) == token) {
        next = slots_[i];  // the entry's index + 1
        return e.id;
      }
    }
    return -1;
  }

  /// Number of distinct spellings.
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  /// Total bytes of the spellings.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_.size(); }

  /// Calls `f(spelling, id)` for every entry, in first-insertion order.
  template <class F>
  void for_each(F&& f) const {
    for (const entry& e : entries_) f(spelling(e), e.id);
  }

 private:
  struct entry {
    std::uint32_t at, length;  // the spelling in bytes_
    token_id id;
    std::uint64_t hash;  // compared before the bytes, and kept for growing
  };

  [[nodiscard]] std::string_view spelling(const entry& e) const noexcept { return {bytes_.data() + e.at, e.length}; }

  // Multiply-xor over 8-byte words, the tail zero-padded, the length mixed in; the low bits
  // index the table, so the result is finished with a xor-shift of the high half.
  [[nodiscard]] static std::uint64_t hash(std::string_view s) noexcept {
    constexpr std::uint64_t k = splitmix64_gamma;  // odd: multiplying by it is a bijection
    std::uint64_t h = s.size() * k;
    std::size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      std::uint64_t w = 0;
      std::memcpy(&w, s.data() + i, 8);
      h = (h ^ w) * k;
      h ^= h >> 32;
    }
    if (i < s.size()) {
      std::uint64_t w = 0;
      std::memcpy(&w, s.data() + i, s.size() - i);
      h = (h ^ w) * k;
    }
    return h ^ (h >> 29);
  }

  void grow() {
    std::size_t slots = slots_.empty() ? 1024 : 2 * slots_.size();
    slots_.assign(slots, 0);
    mask_ = slots - 1;
    for (std::size_t k = 0; k < entries_.size(); ++k) {
      std::size_t i = static_cast<std::size_t>(entries_[k].hash) & mask_;
      while (slots_[i] != 0) i = (i + 1) & mask_;
      slots_[i] = static_cast<std::uint32_t>(k + 1);
    }
  }

  std::string bytes_;
  std::vector<entry> entries_;
  std::vector<std::uint32_t> slots_;  // entry index + 1; 0: empty
  std::size_t mask_ = 0;
};

}  // namespace hybridcache::sim
