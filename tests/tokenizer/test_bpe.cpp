// Unit tests of sim/tokenizer/bpe_tokenizer.hpp that need no Python: the UTF-8 replacement rule, the
// GPT-2 split, a hand-written tokenizer.json, and the rejection of unsupported components.
// Exactness against the Hugging Face package: hf_exact.py (ctest tokenizer.hf_exact).
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <hybridcache/sim/tokenizer/bpe_tokenizer.hpp>

#include "../support/bpe_random_model.hpp"

using namespace hybridcache::sim;
using hybridcache::token_id;  // the tokenizer returns the library's one token_id

namespace {
// The GPT-2 pattern read off its alternatives one code point at a time, classes by binary
// search (detail::classify): the reference for the split's table and fast paths.
std::vector<std::string> naive_split(const std::string& s) {
  std::vector<std::uint32_t> cps;
  std::vector<std::size_t> at;
  bpe_test::code_points(s, cps, at);
  const std::size_t n = cps.size();
  auto cls = [&](std::size_t k) { return detail::classify(cps[k]); };
  auto run = [&](std::size_t k, detail::cclass c) {
    while (k < n && cls(k) == c) ++k;
    return k;
  };
  std::vector<std::string> out;
  for (std::size_t p = 0; p < n;) {
    std::size_t e = p;
    const auto is = [&](std::size_t k, char c) { return k < n && cps[k] == static_cast<std::uint32_t>(c); };
    if (is(p, '\'') && (is(p + 1, 's') || is(p + 1, 't') || is(p + 1, 'm') || is(p + 1, 'd'))) {
      e = p + 2;
    } else if (is(p, '\'') && ((is(p + 1, 'r') && is(p + 2, 'e')) || (is(p + 1, 'v') && is(p + 2, 'e')) || (is(p + 1, 'l') && is(p + 2, 'l')))) {
      e = p + 3;
    } else if (cls(p) != detail::cclass::space) {
      e = run(p, cls(p));
    } else if (is(p, ' ') && p + 1 < n && cls(p + 1) != detail::cclass::space) {
      e = run(p + 1, cls(p + 1));
    } else {
      e = run(p, detail::cclass::space);
      if (e < n && e - p >= 2) --e;  // \s+(?!\S) leaves the last space to the next piece
    }
    out.push_back(s.substr(at[p], at[e] - at[p]));
    p = e;
  }
  return out;
}

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  byte_level_split(s, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

// Vocab: the 256 byte characters (ids = the byte), then merges.
std::string tiny_json(const std::string& extra_model = "", const std::string& pre = R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})") {
  std::string vocab = bpe_test::byte_vocab_json();
  vocab += "\"ab\":256,\"abc\":257,\"\xC4\xA0" "a\":258,\"bc\":259";
  return R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":300,"content":"<|x|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,"pre_tokenizer":)" +
         pre + R"(,"post_processor":null,"decoder":null,"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false)" +
         extra_model + R"(,"vocab":{)" + vocab + R"(},"merges":[["b","c"],"a b",["ab","c"],["Ġ","a"]]}})";
}
}  // namespace

TEST_CASE("utf8_replace_invalid follows Python's errors='replace'") {
  std::string out;
  utf8_replace_invalid("a\xFF" "b", out);
  CHECK(out == "a\xEF\xBF\xBD" "b");
  utf8_replace_invalid("\xE4\xB8", out);  // truncated 3-byte sequence: one U+FFFD
  CHECK(out == "\xEF\xBF\xBD");
  utf8_replace_invalid("\xED\xA0\x80", out);  // a surrogate: three
  CHECK(out == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  utf8_replace_invalid("\xF0\x9F\x98" "x", out);
  CHECK(out == "\xEF\xBF\xBD" "x");
  CHECK(is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  CHECK_FALSE(is_valid_utf8("\xC0\xAF"));
}

TEST_CASE("the GPT-2 split") {
  CHECK(split("Hello world") == std::vector<std::string>{"Hello", " world"});
  CHECK(split("it's they'll") == std::vector<std::string>{"it", "'s", " they", "'ll"});
  CHECK(split("a   b") == std::vector<std::string>{"a", "  ", " b"});
  CHECK(split("a  !") == std::vector<std::string>{"a", " ", " !"});
  CHECK(split("x\n\ny") == std::vector<std::string>{"x", "\n", "\n", "y"});
  CHECK(split("end   ") == std::vector<std::string>{"end", "   "});
  CHECK(split("abc123 456!?") == std::vector<std::string>{"abc", "123", " 456", "!?"});
  CHECK(split("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x81") == std::vector<std::string>{"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x81"});
}

TEST_CASE("the split equals the pattern read naively, three-byte fast path included") {
  // The fast path's claim: a block marked single-class holds only code points of that
  // class, and every overlong or surrogate prefix is marked mixed.
  const auto& table = detail::class_table::get();
  std::size_t single = 0;
  for (std::uint32_t lead = 0xE0; lead <= 0xEF; ++lead) {
    for (std::uint32_t b1 = 0x80; b1 <= 0xBF; ++b1) {
      const std::uint8_t c = table.block3(static_cast<unsigned char>(lead), static_cast<unsigned char>(b1));
      if ((lead == 0xE0 && b1 < 0xA0) || (lead == 0xED && b1 >= 0xA0)) {
        REQUIRE(c == detail::class_table::mixed);
        continue;
      }
      if (c == detail::class_table::mixed) continue;
      ++single;
      const std::uint32_t first = ((lead & 0x0Fu) << 12) | ((b1 & 0x3Fu) << 6);
      for (std::uint32_t cp = first; cp < first + 64; ++cp) REQUIRE(static_cast<std::uint8_t>(detail::classify(cp)) == c);
    }
  }
  CHECK(single >= 7 * 64);  // U+5000-U+9FFF, U+B000-U+CFFF at least
  CHECK(table.block3(0xE4, 0xB8) == static_cast<std::uint8_t>(detail::cclass::letter));  // U+4E00: the ideographs start
  // Random texts of letters, digits, spaces, punctuation and three-byte characters from
  // single-class and mixed ranges, with ill-formed sequences among them half the time.
  std::mt19937_64 rng(1919);
  const std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges = {
      {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x4DB0, 0x4E10}, {0x3000, 0x30FF}, {0x0800, 0x0FFF}, {0xE000, 0xE0FF}, {0xFF00, 0xFFEF}, {0x2000, 0x2070}};
  const std::vector<std::string> ascii = {"a", "Z", " ", "  ", "\n", "\t", "7", "!", ",", "'s", "'ll"};
  const std::vector<std::string> ill = {"\xE5\xA5", "\xE5" "a", "\xE5\xA5" "b", "\xED\xA0\x80", "\xE0\x80\x80", "\xE5\xC0\x80", "\xBF", "\xE9\xBF"};
  std::size_t valid = 0, invalid = 0;
  for (int t = 0; t < 6000; ++t) {
    std::string s;
    for (int k = static_cast<int>(rng() % 24); k >= 0; --k) {
      const auto pick = rng() % 10;
      if (pick < 5) {
        const auto& [lo, hi] = ranges[rng() % ranges.size()];
        detail::append_utf8(s, lo + static_cast<std::uint32_t>(rng() % (hi - lo + 1)));
      } else if (pick < 9 || t % 2 == 0) {
        s += ascii[rng() % ascii.size()];
      } else {
        s += ill[rng() % ill.size()];
      }
    }
    std::vector<std::string> checked;
    const bool ok = byte_level_split<true>(s, [&](std::string_view p) { checked.emplace_back(p); });
    REQUIRE(ok == is_valid_utf8(s));
    if (!ok) {
      ++invalid;
      continue;
    }
    ++valid;
    const std::vector<std::string> want = naive_split(s);
    CHECK(checked == want);
    CHECK(split(s) == want);
  }
  CHECK(valid > 2000);
  CHECK(invalid > 1000);
}

TEST_CASE("the checked split stops at ill-formed UTF-8 and otherwise splits as the plain one") {
  std::mt19937_64 rng(7);
  const std::vector<std::string> parts = {"a", " ", "'s", "\n", "1", "!", "\xE4\xBD\xA0", "\xC3\xA9", "\xF0\x9F\x98\x80", "\xE2\x80\x83",
                                          "\xFF", "\xC0\xAF", "\xED\xA0\x80", "\xE0\x80\x80", "\xF4\x90\x80\x80", "\xE4\xB8", "\x80"};
  std::size_t ill = 0;
  for (int t = 0; t < 4000; ++t) {
    std::string s;
    for (int k = static_cast<int>(rng() % 12); k >= 0; --k) s += parts[rng() % (t % 2 == 0 ? 10 : parts.size())];
    std::vector<std::string> checked;
    const bool ok = byte_level_split<true>(s, [&](std::string_view p) { checked.emplace_back(p); });
    CHECK(ok == is_valid_utf8(s));
    if (ok) {
      CHECK(checked == split(s));
    } else {
      ++ill;
      std::size_t covered = 0;  // what it emitted before stopping is a prefix of the text
      for (const auto& p : checked) covered += p.size();
      CHECK(s.compare(0, covered, [&] { std::string c; for (const auto& p : checked) c += p; return c; }()) == 0);
    }
  }
  CHECK(ill > 100);
}

TEST_CASE("a hand-written tokenizer.json") {
  auto tok = bpe_tokenizer::from_json(tiny_json());
  CHECK(tok.merge_count() == 4);
  // "abc": b+c (rank 0) first, then a+bc has no merge: [a, bc]
  CHECK(tok.encode("abc") == std::vector<token_id>{'a', 259});
  CHECK(tok.encode("ab") == std::vector<token_id>{256});
  CHECK(tok.encode(" a") == std::vector<token_id>{258});
  CHECK(tok.encode("x<|x|>y") == std::vector<token_id>{'x', 300, 'y'});
  CHECK(tok.encode("\xFF") == std::vector<token_id>{0xEF, 0xBF, 0xBD});
  auto ignore = bpe_tokenizer::from_json(tiny_json(R"(,"ignore_merges":true)"));
  CHECK(ignore.encode("abc") == std::vector<token_id>{257});
}

TEST_CASE("unsupported components are rejected, never approximated") {
  CHECK_THROWS_AS((void)bpe_tokenizer::from_json(tiny_json("", R"({"type":"Whitespace"})")), hybridcache::invalid_argument);
  CHECK_THROWS_AS((void)bpe_tokenizer::from_json(tiny_json("", R"({"type":"ByteLevel","add_prefix_space":true,"use_regex":true})")),
                  hybridcache::invalid_argument);
  CHECK_THROWS_AS((void)bpe_tokenizer::from_json(tiny_json(R"(,"byte_fallback":true)")), hybridcache::invalid_argument);
  CHECK_THROWS_AS((void)bpe_tokenizer::from_json("{\"model\": [1,"), hybridcache::format_error);
  CHECK_THROWS_AS((void)bpe_tokenizer::from_file("/nonexistent/tokenizer.json"), hybridcache::invalid_argument);
}
