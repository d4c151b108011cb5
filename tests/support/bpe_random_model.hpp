// tests/support/bpe_random_model.hpp: random byte-level BPE merge lists and the definition
// of BPE as a naive reference, for the fast encoder's randomized test
// (tests/tokenizer/test_bpe_fast.cpp) and its differential fuzz target (tests/fuzz/fuzz_bpe.cpp);
// and the JSON of a tokenizer.json vocabulary's 256 byte tokens (tests/tokenizer/).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <hybridcache/sim/tokenizer/bpe_merges.hpp>
#include <hybridcache/sim/tokenizer/utf8_pretokenize.hpp>

namespace bpe_test {

using hybridcache::sim::bpe_merge_table;
using hybridcache::sim::bpe_merge_target;
using hybridcache::token_id;

// A BPE model built by hand: byte tokens at ids 1000 + byte, merges ranked in order.
struct random_model {
  std::array<token_id, 256> byte_ids{};
  std::map<std::string, token_id> by_bytes;
  std::vector<std::string> bytes_of;  // by id - 1000
  struct merge {
    token_id a, b, made;
  };
  std::vector<merge> merges;  // in rank order
  bpe_merge_table table;

  random_model() {
    for (int b = 0; b < 256; ++b) {
      byte_ids[static_cast<std::size_t>(b)] = 1000 + b;
      const std::string s(1, static_cast<char>(b));
      by_bytes[s] = 1000 + b;
      bytes_of.push_back(s);
    }
  }
  [[nodiscard]] const std::string& bytes(token_id id) const { return bytes_of[static_cast<std::size_t>(id - 1000)]; }
  token_id token_for(const std::string& s) {
    if (const auto it = by_bytes.find(s); it != by_bytes.end()) return it->second;
    const auto id = static_cast<token_id>(1000 + bytes_of.size());
    bytes_of.push_back(s);
    by_bytes[s] = id;
    return id;
  }
  void finish() {
    table.reserve(merges.size());
    for (std::size_t r = 0; r < merges.size(); ++r) table.add(merges[r].a, merges[r].b, static_cast<std::int32_t>(r), merges[r].made);
    table.finish();
  }
  [[nodiscard]] std::size_t id_limit() const { return 1000 + bytes_of.size(); }
};

inline const std::vector<std::string> alphabet = {"a", "b", "c", " ", "\xC3\xA9" /* é */, "\xE4\xB8\xAD" /* 中 */, "\xF0\x9F\x98\x80" /* 😀 */};

// Merges of tokens found in texts over `alphabet`. As a trainer does, most lists first make
// every character a token (its bytes merged in a random order); `wild` lists skip that and
// draw from the bytes too, so tokens hold parts of characters. Each merge then joins two
// tokens drawn from those made so far (biased to the early ones), making a new token.
inline random_model make_model(std::mt19937_64& rng, int merge_count, bool wild) {
  random_model m;
  std::vector<token_id> pool;  // tokens that occur in alphabet texts
  auto add = [&](token_id a, token_id b) {
    const std::string s = m.bytes(a) + m.bytes(b);
    if (m.by_bytes.count(s) != 0) return;  // would make a token twice
    const token_id made = m.token_for(s);
    m.merges.push_back({a, b, made});
    pool.push_back(made);
  };
  for (const auto& c : alphabet) {
    if (c.size() == 1 || wild) {
      for (const char b : c) pool.push_back(m.byte_ids[static_cast<unsigned char>(b)]);
      continue;
    }
    std::vector<token_id> parts;  // merge the character's bytes, neighbours in a random order
    for (const char b : c) parts.push_back(m.byte_ids[static_cast<unsigned char>(b)]);
    while (parts.size() > 1) {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, parts.size() - 2)(rng);
      const std::string s = m.bytes(parts[i]) + m.bytes(parts[i + 1]);
      const token_id made = m.token_for(s);
      m.merges.push_back({parts[i], parts[i + 1], made});  // the characters share no bytes: always a new token
      parts[i] = made;
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    }
    pool.push_back(parts[0]);
  }
  for (int k = 0; k < merge_count; ++k) {
    std::uniform_int_distribution<std::size_t> pick(0, pool.size() - 1);
    add(pool[std::min(pick(rng), pick(rng))], pool[std::min(pick(rng), pick(rng))]);
  }
  m.finish();
  return m;
}

// The merge list a tiktoken vocabulary converts to (as Hugging Face converts Llama 3's and
// Qwen's): the tokens of a `make_model` list keep their order (their rank), and each is made
// by every split of its bytes into two tokens, its merges together, ordered by the parts'
// ranks. Tokens are then often made by several merges; with `later_parts`, as the converter
// does, also by splits into a token made after it (such a merge ranks before one of its
// inputs is made: merges no longer apply in rank order).
inline random_model make_tiktoken_model(std::mt19937_64& rng, int merge_count, bool wild, bool later_parts = false) {
  const random_model base = make_model(rng, merge_count, wild);
  random_model m;  // same byte ids; tokens re-made in base's order
  std::map<std::string, std::size_t> rank_of;  // by bytes: bytes 0, merged tokens 1, 2, ...
  for (int b = 0; b < 256; ++b) rank_of[std::string(1, static_cast<char>(b))] = 0;
  for (std::size_t r = 0; r < base.merges.size(); ++r) rank_of[base.bytes(base.merges[r].made)] = r + 1;
  for (std::size_t r = 0; r < base.merges.size(); ++r) {
    const std::string& t = base.bytes(base.merges[r].made);
    std::vector<std::pair<std::pair<std::size_t, std::size_t>, std::pair<std::string, std::string>>> splits;
    for (std::size_t i = 1; i < t.size(); ++i) {
      const auto l = rank_of.find(t.substr(0, i)), rr = rank_of.find(t.substr(i));
      if (l == rank_of.end() || rr == rank_of.end()) continue;
      if (!later_parts && (l->second > r || rr->second > r)) continue;
      splits.push_back({{l->second, rr->second}, {l->first, rr->first}});
    }
    std::sort(splits.begin(), splits.end());
    const token_id made = m.token_for(t);
    for (const auto& sp : splits) m.merges.push_back({m.token_for(sp.second.first), m.token_for(sp.second.second), made});
  }
  m.finish();
  return m;
}

inline std::string random_text(std::mt19937_64& rng, std::size_t max_chars) {
  std::uniform_int_distribution<std::size_t> len(1, max_chars), ch(0, alphabet.size() - 1);
  std::string s;
  const std::size_t n = len(rng);
  const bool runs = (rng() & 3) == 0;  // long runs of one character: ties between equal pairs
  const std::string& only = alphabet[ch(rng)];
  for (std::size_t i = 0; i < n; ++i) s += runs ? only : alphabet[ch(rng)];
  return s;
}

// The definition: the byte tokens, then while some neighbouring pair has a merge, the
// lowest-ranked one, leftmost among equal ranks. O(n^2) lookups.
inline std::vector<token_id> naive_bpe(const random_model& m, const std::string& text) {
  std::vector<token_id> ids;
  for (const char c : text) ids.push_back(m.byte_ids[static_cast<unsigned char>(c)]);
  while (true) {
    std::size_t best = ids.size();
    std::int32_t best_rank = 0;
    for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
      const bpe_merge_target* t = m.table.find(ids[i], ids[i + 1]);
      if (t != nullptr && (best == ids.size() || t->rank < best_rank)) {
        best = i;
        best_rank = t->rank;
      }
    }
    if (best == ids.size()) return ids;
    ids[best] = m.table.find(ids[best], ids[best + 1])->id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

// The code points of valid UTF-8 `s` and where each starts (then s.size()): the naive
// split references of the tests read text one code point at a time.
inline void code_points(const std::string& s, std::vector<std::uint32_t>& cps, std::vector<std::size_t>& at) {
  cps.clear();
  at.clear();
  for (std::size_t i = 0; i < s.size();) {
    std::size_t len = 0;
    cps.push_back(hybridcache::sim::detail::decode_at(reinterpret_cast<const unsigned char*>(s.data()) + i, len));
    at.push_back(i);
    i += len;
  }
  at.push_back(s.size());
}

// The 256 byte tokens as tokenizer.json "vocab" members, spelled in GPT-2's byte alphabet,
// id = the byte, each followed by a comma.
inline std::string byte_vocab_json() {
  std::string vocab;
  const auto map = hybridcache::sim::detail::byte_to_unicode();
  for (std::size_t b = 0; b < 256; ++b) {
    std::string c;
    hybridcache::sim::detail::append_utf8(c, map[b]);
    if (c == "\"" || c == "\\") c = "\\" + c;
    vocab += "\"" + c + "\":" + std::to_string(b) + ",";
  }
  return vocab;
}

}  // namespace bpe_test
