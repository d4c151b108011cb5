// The fast BPE encoder (sim/tokenizer/bpe_backtracking.hpp) against the definition of BPE: random
// merge lists over a few ASCII and multi-byte characters (so merges overlap, tie, cross
// character boundaries and make part-character tokens), random texts, and a naive reference
// that merges the lowest-ranked pair, leftmost first, until none is left. The package-order
// merger (bpe_merges.hpp, the fallback) is checked against the same reference.
#include <doctest/doctest.h>

#include <array>
#include <map>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <hybridcache/sim/tokenizer/bpe_backtracking.hpp>
#include <hybridcache/sim/tokenizer/bpe_merges.hpp>
#include <hybridcache/sim/tokenizer/bpe_tokenizer.hpp>

#include "../support/bpe_random_model.hpp"

using namespace hybridcache::sim;
using namespace bpe_test;

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

TEST_CASE("the fast encoder equals the definition of BPE on tiktoken-style lists (tokens made by several merges)") {
  for (const bool later : {false, true}) {  // splits into tokens made later too, as the converter writes
  CAPTURE(later);
  std::mt19937_64 rng(later ? 4319 : 2319);
  std::size_t cases = 0, fast = 0, several = 0, enabled = 0;
  const int models = later ? 240 : 60;  // out of rank order: the replayed fits, more lists
  for (int model = 0; model < models; ++model) {
    const random_model m = make_tiktoken_model(rng, 10 + model * 3, model % 4 == 3, later);
    std::map<token_id, int> makers;
    for (const auto& mg : m.merges) ++makers[mg.made];
    for (const auto& [t, k] : makers) several += k > 1 ? 1 : 0;
    bpe_backtracking_encoder encoder;
    encoder.build(m.table, m.byte_ids, m.id_limit());
    if (!encoder.enabled()) continue;
    ++enabled;
    bpe_word_merger merger;
    for (int t = 0; t < (later ? 100 : 200); ++t) {
      const std::string text = random_text(rng, model % 3 == 0 ? 80 : 24);
      const std::vector<token_id> want = naive_bpe(m, text);
      std::vector<token_id> merged;
      merger.merge(text, m.byte_ids, m.table, merged);
      REQUIRE(merged == want);
      std::vector<token_id> got;
      ++cases;
      // Half the texts with a merger for characters outside the trie (wild lists have them).
      auto merge_char = [&](std::string_view c, std::vector<token_id>& ids) { merger.merge(c, m.byte_ids, m.table, ids); };
      if (t % 2 == 0 ? encoder.encode(text, m.table, got) : encoder.encode(text, m.table, got, merge_char)) {
        ++fast;
        REQUIRE_MESSAGE(got == want, "model ", model, " text '", text, "'");
      }
    }
  }
  MESSAGE(enabled, " of ", models, " tiktoken-style lists", std::string(later ? " (later parts too)" : ""), " enable the fast encoder; ", several,
          " tokens made by several merges; ", cases, " texts, ", fast, " by the fast encoder");
  CHECK(enabled * 6 >= static_cast<std::size_t>(models) * 5);  // such lists are well-formed in the wider sense
  CHECK(several > 200);          // and do make tokens several ways
  CHECK(fast > cases * 3 / 4);
  }
}

TEST_CASE("the fast encoder with a merger for characters outside its trie equals the definition of BPE") {
  // Models whose characters are partly not tokens (`wild`: their bytes merge with their
  // neighbours' instead), so texts hold characters no trie token starts with: those are
  // merged alone and kept only where they fit, else the whole text goes back.
  std::mt19937_64 rng(1919);
  std::size_t cases = 0, mixed = 0, fell_back = 0;
  for (int model = 0; model < 80; ++model) {
    const random_model m = make_model(rng, 4 + model * 2, model % 4 != 0);
    bpe_backtracking_encoder encoder;
    encoder.build(m.table, m.byte_ids, m.id_limit());
    REQUIRE(encoder.enabled());
    bpe_word_merger merger;
    for (int t = 0; t < 200; ++t) {
      const std::string text = random_text(rng, model % 3 == 0 ? 60 : 16);
      const std::vector<token_id> want = naive_bpe(m, text);
      std::vector<token_id> got = {7};  // appends after what is there
      std::size_t merged_chars = 0;
      const bool fast = encoder.encode(text, m.table, got, [&](std::string_view c, std::vector<token_id>& ids) {
        ++merged_chars;
        CHECK(!c.empty());
        merger.merge(c, m.byte_ids, m.table, ids);
      });
      ++cases;
      if (fast) {
        mixed += merged_chars > 0 ? 1 : 0;
        got.erase(got.begin());
        CHECK_MESSAGE(got == want, "model ", model, " text '", text, "'");
      } else {
        ++fell_back;
        CHECK(got == std::vector<token_id>{7});  // untouched
      }
    }
  }
  MESSAGE(cases, " texts: ", mixed, " encoded with characters merged alone, ", fell_back, " left to the merger");
  CHECK(mixed > cases / 10);  // the path is exercised ...
  CHECK(fell_back > 0);       // ... and so is the refusal where merged characters do not fit
}

namespace {
// A random model as a tokenizer.json (vocab spelled in GPT-2's byte alphabet, merges as pairs).
std::string model_json(const random_model& m) {
  const auto map = detail::byte_to_unicode();
  auto spell = [&](const std::string& bytes) {
    std::string out = "\"";
    for (const char c : bytes) {
      std::string u;
      detail::append_utf8(u, map[static_cast<unsigned char>(c)]);
      out += u == "\"" || u == "\\" ? "\\" + u : u;
    }
    return out + "\"";
  };
  std::string vocab, merges;
  for (std::size_t i = 0; i < m.bytes_of.size(); ++i) vocab += (i ? "," : "") + spell(m.bytes_of[i]) + ":" + std::to_string(1000 + i);
  for (std::size_t r = 0; r < m.merges.size(); ++r)
    merges += std::string(r ? "," : "") + "[" + spell(m.bytes(m.merges[r].a)) + "," + spell(m.bytes(m.merges[r].b)) + "]";
  return R"({"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},"model":{"type":"BPE","vocab":{)" +
         vocab + R"(},"merges":[)" + merges + "]}}";
}
}  // namespace

TEST_CASE("the tokenizer equals the definition of BPE per pre-token, characters outside the trie cached") {
  // Through bpe_tokenizer: the split, the short-piece cache (which also holds the ids of
  // characters merged alone for the fast encoder), the fast encoder and the merger. Each
  // text is encoded twice, the second time from the cache where pieces and characters repeat.
  std::mt19937_64 rng(2019);
  std::size_t texts = 0;
  for (int model = 0; model < 24; ++model) {
    const random_model m = make_model(rng, 6 + model * 3, model % 3 != 0);
    auto tokenizer = bpe_tokenizer::from_json(model_json(m));
    REQUIRE(tokenizer.fast_encoder());
    for (int t = 0; t < 150; ++t) {
      const std::string text = random_text(rng, 40);
      std::vector<token_id> want;
      byte_level_split(text, [&](std::string_view piece) {
        const std::vector<token_id> ids = naive_bpe(m, std::string(piece));
        want.insert(want.end(), ids.begin(), ids.end());
      });
      CHECK_MESSAGE(tokenizer.encode(text) == want, "model ", model, " text '", text, "'");
      CHECK(tokenizer.encode(text) == want);
      ++texts;
    }
  }
  CHECK(texts == 24 * 150);
}

namespace {
// Builds the encoder for a hand-made list over a, b, c: it must be on, equal the definition
// on short texts, and encode "abc" as the one token `abc`.
void check_small_list(random_model& m, token_id abc) {
  m.finish();
  bpe_backtracking_encoder encoder;
  encoder.build(m.table, m.byte_ids, m.id_limit());
  REQUIRE(encoder.enabled());
  for (const std::string text : {"abc", "abcabc", "aabcc", "ab", "cab", "abcab", "bcabc", "aaabbbccc"}) {
    std::vector<token_id> got;
    if (encoder.encode(text, m.table, got)) CHECK_MESSAGE(got == naive_bpe(m, text), text);
  }
  std::vector<token_id> got;
  REQUIRE(encoder.encode("abc", m.table, got));
  CHECK(got == std::vector<token_id>{abc});
}
}  // namespace

TEST_CASE("a token made by two merges: its history is the one its own bytes give") {
  random_model m;
  const token_id a = m.byte_ids['a'], b = m.byte_ids['b'], c = m.byte_ids['c'];
  const token_id ab = m.token_for("ab"), bc = m.token_for("bc"), abc = m.token_for("abc");
  // "abc": b c (rank 0) first, so "abc" is made by (a, bc) (rank 3), not by (ab, c) (rank 2).
  m.merges = {{b, c, bc}, {a, b, ab}, {ab, c, abc}, {a, bc, abc}};
  check_small_list(m, abc);
}

TEST_CASE("an input made by a later merge: merges out of rank order, histories from the tokens' bytes") {
  random_model m;
  const token_id a = m.byte_ids['a'], b = m.byte_ids['b'], c = m.byte_ids['c'];
  const token_id ab = m.token_for("ab"), abc = m.token_for("abc");
  m.merges = {{ab, c, abc}, {a, b, ab}};  // "ab c" ranks before "ab" is made: it applies right after
  check_small_list(m, abc);
  bpe_backtracking_encoder encoder;
  encoder.build(m.table, m.byte_ids, m.id_limit());
  CHECK_FALSE(encoder.in_rank_order());
}

TEST_CASE("a merge list whose byte is made by a merge, or with a cycle, keeps the fast encoder off") {
  random_model m;
  const token_id a = m.byte_ids['a'], b = m.byte_ids['b'];
  SUBCASE("a byte made by a merge") { m.merges = {{a, b, m.byte_ids['c']}}; }
  SUBCASE("a cycle: ab makes ab2, ab2 b makes ab") {
    const token_id ab = m.token_for("ab"), ab2 = m.token_for("abb");
    m.merges = {{a, b, ab}, {ab, b, ab2}, {ab2, b, ab}};
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
  // Every byte in the vocab; "abc" made once (well-formed), then twice.
  const std::string vocab = byte_vocab_json();
  const std::string head = R"({"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},"model":{"type":"BPE","vocab":{)";
  auto good = bpe_tokenizer::from_json(head + vocab + R"("ab":256,"abc":257},"merges":["a b","ab c"]}})");
  CHECK(good.fast_encoder());
  CHECK(good.encode("abcab abc") == std::vector<token_id>{257, 256, 32, 257});
  auto twice = bpe_tokenizer::from_json(head + vocab + R"("ab":256,"bc":258,"abc":257},"merges":["a b","b c","ab c","a bc"]}})");
  CHECK(twice.fast_encoder());  // "abc" made two ways: still the fast encoder (its history: its bytes')
  CHECK(twice.encode("abcab abc") == std::vector<token_id>{257, 256, 32, 257});
  auto later = bpe_tokenizer::from_json(head + vocab + R"("ab":256,"abc":257},"merges":["ab c","a b"]}})");
  CHECK(later.fast_encoder());  // an input made by a later merge: still the fast encoder
  CHECK(later.encode("abcab abc") == std::vector<token_id>{257, 256, 32, 257});
}

TEST_CASE("learning histories from long tokens has a budget: a long chain out of rank order keeps the encoder off") {
  // "a", "aa", "aaa", ... each made from the previous one and "a", the merges listed in
  // reverse (so out of rank order): learning each token's history would be O(n^2) for n
  // bytes, n up to 20,000 (1.3e12 lookups): the build gives up, the merger answers.
  random_model m;
  const token_id a = m.byte_ids['a'];
  std::vector<random_model::merge> chain;
  token_id prev = a;
  std::string s = "a";
  for (int k = 0; k < 20000; ++k) {
    s += "a";
    const token_id next = m.token_for(s);
    chain.push_back({prev, a, next});
    prev = next;
  }
  m.merges.assign(chain.rbegin(), chain.rend());
  m.finish();
  bpe_backtracking_encoder encoder;
  encoder.build(m.table, m.byte_ids, m.id_limit());
  CHECK_FALSE(encoder.enabled());
}
