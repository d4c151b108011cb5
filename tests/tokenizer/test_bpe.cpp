// Unit tests of sim/bpe_tokenizer.hpp that need no Python: the UTF-8 replacement rule, the
// GPT-2 split, a hand-written tokenizer.json, and the rejection of unsupported components.
// Exactness against the Hugging Face package: hf_exact.py (ctest tokenizer.hf_exact).
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include <hybridcache/sim/bpe_tokenizer.hpp>

#include "../support/bpe_random_model.hpp"

using namespace hybridcache::sim;

namespace {
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
