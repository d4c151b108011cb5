// The fast BPE encoder (sim/bpe_backtracking.hpp) against the definition of BPE: random
// merge lists over a few ASCII and multi-byte characters (so merges overlap, tie, cross
// character boundaries and make part-character tokens), random texts, and a naive reference
// that merges the lowest-ranked pair, leftmost first, until none is left. The package-order
// merger (bpe_merges.hpp, the fallback) is checked against the same reference.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <hybridcache/sim/bpe_backtracking.hpp>
#include <hybridcache/sim/bpe_merges.hpp>
#include <hybridcache/sim/bpe_tokenizer.hpp>

using namespace hybridcache::sim;

namespace {

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

const std::vector<std::string> alphabet = {"a", "b", "c", " ", "\xC3\xA9" /* é */, "\xE4\xB8\xAD" /* 中 */, "\xF0\x9F\x98\x80" /* 😀 */};

// Merges of tokens found in texts over `alphabet`. As a trainer does, most lists first make
// every character a token (its bytes merged in a random order); `wild` lists skip that and
// draw from the bytes too, so tokens hold parts of characters. Each merge then joins two
// tokens drawn from those made so far (biased to the early ones), making a new token.
random_model make_model(std::mt19937_64& rng, int merge_count, bool wild) {
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

std::string random_text(std::mt19937_64& rng, std::size_t max_chars) {
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
std::vector<token_id> naive_bpe(const random_model& m, const std::string& text) {
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

}  // namespace

TEST_CASE("the fast encoder equals the definition of BPE on random merge lists") {
  std::mt19937_64 rng(19);
  std::size_t cases = 0, fast = 0, fell_back = 0;
  for (int model = 0; model < 60; ++model) {
    const random_model m = make_model(rng, 10 + model * 3, model % 4 == 3);
    bpe_backtracking_encoder encoder;
    encoder.build(m.table, m.byte_ids, m.id_limit());
    REQUIRE(encoder.enabled());  // make_model writes well-formed lists only
    bpe_word_merger merger;
    for (int t = 0; t < 200; ++t) {
      const std::string text = random_text(rng, model % 3 == 0 ? 80 : 24);
      const std::vector<token_id> want = naive_bpe(m, text);
      std::vector<token_id> merged;
      merger.merge(text, m.byte_ids, m.table, merged);
      CHECK(merged == want);
      std::vector<token_id> got = {7};  // appends after what is there
      ++cases;
      if (encoder.encode(text, m.table, got)) {
        ++fast;
        got.erase(got.begin());
        CHECK_MESSAGE(got == want, "model ", model, " text '", text, "'");
      } else {
        ++fell_back;
        CHECK(got == std::vector<token_id>{7});  // untouched
      }
    }
  }
  MESSAGE(cases, " texts: ", fast, " by the fast encoder, ", fell_back, " left to the merger");
  CHECK(fast > cases * 3 / 4);  // the test exercises the fast encoder, not just its refusal
  CHECK(fell_back > 0);         // and part-character tokens make it refuse sometimes
}

TEST_CASE("a merge list that is not well-formed keeps the fast encoder off") {
  random_model m;
  const token_id a = m.byte_ids['a'], b = m.byte_ids['b'], c = m.byte_ids['c'];
  const token_id ab = m.token_for("ab"), bc = m.token_for("bc"), abc = m.token_for("abc");
  SUBCASE("a token made by two merges") {
    m.merges = {{a, b, ab}, {b, c, bc}, {ab, c, abc}, {a, bc, abc}};
  }
  SUBCASE("an input made by a later merge") {
    m.merges = {{ab, c, abc}, {a, b, ab}};
  }
  m.finish();
  bpe_backtracking_encoder encoder;
  encoder.build(m.table, m.byte_ids, m.id_limit());
  CHECK_FALSE(encoder.enabled());
  std::vector<token_id> out;
  CHECK_FALSE(encoder.encode("abc", m.table, out));
  CHECK(out.empty());
}

TEST_CASE("the tokenizer reports whether its merge list allows the fast encoder") {
  // tests/tokenizer/test_bpe.cpp's tiny tokenizer: well-formed, every byte in the vocab.
  std::string vocab;
  const auto map = bpe_detail::byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    bpe_detail::append_utf8(ch, map[static_cast<std::size_t>(b)]);
    if (ch == "\"" || ch == "\\") ch = "\\" + ch;
    vocab += "\"" + ch + "\":" + std::to_string(b) + ",";
  }
  const std::string head = R"({"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},"model":{"type":"BPE","vocab":{)";
  auto good = bpe_tokenizer::from_json(head + vocab + R"("ab":256,"abc":257},"merges":["a b","ab c"]}})");
  CHECK(good.fast_encoder());
  CHECK(good.encode("abcab abc") == std::vector<token_id>{257, 256, 32, 257});
  auto twice = bpe_tokenizer::from_json(head + vocab + R"("ab":256,"bc":258,"abc":257},"merges":["a b","b c","ab c","a bc"]}})");
  CHECK_FALSE(twice.fast_encoder());
  CHECK(twice.encode("abcab abc") == std::vector<token_id>{257, 256, 32, 257});
}
