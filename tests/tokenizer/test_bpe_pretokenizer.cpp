// Unit tests of sim/tokenizer/bpe_pretokenizer.hpp that need no Python: the Llama 3 and Qwen 2 splits
// against the regex read naively (alternative by alternative, with its backtracking written
// out), hand-picked pieces, and the tokenizer.json forms of pre-tokenizers and
// post-processors that load or are rejected. Exactness against the package (ids and
// pieces): hf_exact.py (ctest tokenizer.hf_exact).
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <hybridcache/sim/tokenizer/bpe_tokenizer.hpp>
#include <hybridcache/sim/tokenizer/unicode_nfc.hpp>

#include "../support/bpe_random_model.hpp"

using namespace hybridcache::sim;
using hybridcache::token_id;  // the tokenizer returns the library's one token_id

namespace {

using pieces = std::vector<std::string>;

pieces llama3(std::string_view s, std::size_t digits = 3) {
  pieces out;
  llama3_split(s, digits, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,K}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+ over code points, each alternative tried in order at each
// position, its greedy quantifiers backtracking from longest to shortest.
pieces naive_llama3(const std::string& s, std::size_t max_digits) {
  using detail::cclass;
  std::vector<std::uint32_t> cps;
  std::vector<std::size_t> at;
  bpe_test::code_points(s, cps, at);
  const std::size_t n = cps.size();
  auto cls = [&](std::size_t k) { return detail::classify(cps[k]); };
  auto fold = [&](std::size_t k) -> std::uint32_t {  // simple case folding of what the contractions use
    if (k >= n) return 0;
    const std::uint32_t c = cps[k];
    if (c >= 'A' && c <= 'Z') return c + 32;
    return c == 0x17F ? 's' : c;
  };
  auto crlf = [&](std::size_t k) { return k < n && (cps[k] == '\r' || cps[k] == '\n'); };
  auto space = [&](std::size_t k) { return k < n && cls(k) == cclass::space; };
  auto run = [&](std::size_t k, cclass c) {
    while (k < n && cls(k) == c) ++k;
    return k;
  };
  auto match = [&](std::size_t p) -> std::size_t {  // the end of the match at p (> p)
    if (cps[p] == '\'') {
      const std::uint32_t a = fold(p + 1), b = fold(p + 2);
      for (const char* alt : {"s", "t", "re", "ve", "m", "ll", "d"}) {
        const std::string_view x(alt);
        if (a == static_cast<std::uint32_t>(x[0]) && (x.size() == 1 || b == static_cast<std::uint32_t>(x[1]))) return p + 1 + x.size();
      }
    }
    for (const std::size_t lead : {1, 0}) {  // [^\r\n\p{L}\p{N}]? tries one character first
      if (lead == 1 && (crlf(p) || cls(p) == cclass::letter || cls(p) == cclass::number)) continue;
      const std::size_t e = run(p + lead, cclass::letter);
      if (p + lead < n && e > p + lead) return e;
    }
    if (cls(p) == cclass::number) {
      std::size_t e = p;
      while (e < n && e - p < max_digits && cls(e) == cclass::number) ++e;
      return e;
    }
    for (const std::size_t sp : {1, 0}) {  // " ?" tries the space first
      if (sp == 1 && cps[p] != ' ') continue;
      std::size_t e = run(p + sp, cclass::other);
      if (p + sp < n && e > p + sp) {
        while (crlf(e)) ++e;
        return e;
      }
    }
    std::size_t m = p;  // the whitespace run
    while (space(m)) ++m;
    for (std::size_t j = m; j + 1 > p; --j) {  // \s*[\r\n]+
      if (crlf(j)) {
        std::size_t e = j;
        while (crlf(e)) ++e;
        return e;
      }
      if (j == p) break;
    }
    for (std::size_t j = m; j > p; --j)  // \s+(?!\S)
      if (j == n || space(j)) return j;
    return m;  // \s+ (m > p: every character matches one alternative)
  };
  pieces out;
  for (std::size_t p = 0; p < n;) {
    const std::size_t e = match(p);
    out.push_back(s.substr(at[p], at[e] - at[p]));
    p = e;
  }
  return out;
}

std::string with(const std::string& pre, const std::string& post = "null") {
  std::string vocab = bpe_test::byte_vocab_json();
  vocab += "\"ab\":256,\"abc\":257,\"\xC4\xA0" "a\":258,\"bc\":259";
  return R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":300,"content":"<|x|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},{"id":301,"content":"<|bos|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,"pre_tokenizer":)" +
         pre + R"(,"post_processor":)" + post +
         R"(,"decoder":null,"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{)" +
         vocab + R"(},"merges":[["b","c"],"a b",["ab","c"],["Ġ","a"]]}})";
}

// A tokenizer.json Split of `regex` (JSON-escaped) then ByteLevel.
std::string split_then_byte_level(const std::string& regex, const std::string& behavior = "Isolated", bool invert = false,
                                  bool byte_level_regex = false) {
  return R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":")" + regex + R"("},"behavior":")" + behavior +
         R"(","invert":)" + (invert ? "true" : "false") + R"(},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":)" +
         (byte_level_regex ? "true" : "false") + "}]}";
}

const std::string llama3_regex_json =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)";
const std::string qwen2_regex_json =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)";
const std::string gpt2_regex_json = R"('s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+)";

}  // namespace

TEST_CASE("the Llama 3 and Qwen 2 splits, by hand") {
  CHECK(llama3("Hello world") == pieces{"Hello", " world"});
  CHECK(llama3("it's THEY'RE we'Ll") == pieces{"it", "'s", " THEY", "'RE", " we", "'Ll"});
  CHECK(llama3("'said") == pieces{"'s", "aid"});  // the contraction is the first alternative
  CHECK(llama3("x'\xC5\xBF") == pieces{"x", "'\xC5\xBF"});  // U+017F LONG S folds to s
  CHECK(llama3("12345") == pieces{"123", "45"});
  CHECK(llama3("12345", 1) == pieces{"1", "2", "3", "4", "5"});
  CHECK(llama3("3abc") == pieces{"3", "abc"});  // a number is no lead character
  CHECK(llama3("$hello!!\n\nok") == pieces{"$hello", "!!\n\n", "ok"});
  CHECK(llama3("\tword \xE3\x80\x80word") == pieces{"\tword", " ", "\xE3\x80\x80word"});
  CHECK(llama3("a\r\n\r\nb") == pieces{"a", "\r\n\r\n", "b"});
  CHECK(llama3("x  \n  y") == pieces{"x", "  \n", " ", " y"});
  CHECK(llama3("\n x") == pieces{"\n", " x"});  // CR and LF are never a lead
  CHECK(llama3(" ?! \r\n") == pieces{" ?!", " \r\n"});
  CHECK(llama3("end   ") == pieces{"end", "   "});
  CHECK(llama3("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x81") == pieces{"\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x81"});
}

TEST_CASE("the Llama 3 and Qwen 2 splits equal their regex read naively, on random text") {
  std::mt19937_64 rng(3);
  const std::vector<std::string> parts = {
      "a", "Z", "word", " ", "  ", "\t", "\n", "\r", "\r\n", "7", "42", "\xD9\xA3" /* U+0663 */, "!", "$", ",", "'", "'s", "'S",
      "'re", "'LL", "'\xC5\xBF", "\xE3\x80\x80" /* U+3000 */, "\xE4\xBD\xA0" /* CJK */, "\xEF\xBC\x81" /* U+FF01 */,
      "\xC3\xA9", "\xF0\x9F\x98\x80" /* emoji */, "\xE2\x80\x83" /* em space */, "\xCC\x81" /* combining */, "\xC2\x85" /* NEL */};
  std::size_t compared = 0;
  for (int t = 0; t < 6000; ++t) {
    std::string s;
    for (int k = static_cast<int>(rng() % 16); k >= 0; --k) s += parts[rng() % parts.size()];
    for (const std::size_t digits : {std::size_t{3}, std::size_t{1}}) {
      const pieces want = naive_llama3(s, digits);
      REQUIRE(llama3(s, digits) == want);
      pieces checked;
      REQUIRE(llama3_split<true>(s, digits, [&](std::string_view p) { checked.emplace_back(p); }));
      REQUIRE(checked == want);
      ++compared;
    }
  }
  CHECK(compared == 12000);
  // The checked split stops at ill-formed UTF-8, having emitted a prefix of the text.
  pieces got;
  CHECK_FALSE(llama3_split<true>("ab \xE4\xBD cd", 3, [&](std::string_view p) { got.emplace_back(p); }));
  CHECK(got == pieces{"ab"});
}

TEST_CASE("pre-tokenizers: the known splits load, anything else is rejected by name") {
  CHECK(bpe_tokenizer::from_json(with(split_then_byte_level(llama3_regex_json))).pre_tokenizer() == split_pattern::llama3);
  CHECK(bpe_tokenizer::from_json(with(split_then_byte_level(qwen2_regex_json))).pre_tokenizer() == split_pattern::qwen2);
  CHECK(bpe_tokenizer::from_json(with(split_then_byte_level(gpt2_regex_json))).pre_tokenizer() == split_pattern::gpt2);
  const std::string byte_level = R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})";
  CHECK(bpe_tokenizer::from_json(with(byte_level)).pre_tokenizer() == split_pattern::gpt2);
  CHECK(bpe_tokenizer::from_json(with(R"({"type":"Sequence","pretokenizers":[)" + byte_level + "]}")).pre_tokenizer() == split_pattern::gpt2);
  // A piece is encoded as before: " abc" -> [Ġa, bc].
  auto l3 = bpe_tokenizer::from_json(with(split_then_byte_level(llama3_regex_json)));
  CHECK(l3.encode("x abc") == std::vector<token_id>{'x', 258, 259});

  auto rejects = [](const std::string& pre, std::string_view says) {
    try {
      (void)bpe_tokenizer::from_json(with(pre));
      FAIL("accepted: " << pre);
    } catch (const hybridcache::invalid_argument& e) {
      CHECK_MESSAGE(std::string_view(e.what()).find(says) != std::string_view::npos, e.what());
    }
  };
  rejects(split_then_byte_level(R"(\\w+|\\s+)"), "Split regex '\\w+|\\s+'");
  rejects(split_then_byte_level(llama3_regex_json, "Removed"), "behavior");
  rejects(split_then_byte_level(llama3_regex_json, "Isolated", true), "inverted");
  rejects(split_then_byte_level(llama3_regex_json, "Isolated", false, true), "two splits");
  rejects(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":false})", "use_regex = false");
  rejects(R"({"type":"Split","pattern":{"Regex":"a"},"behavior":"Isolated","invert":false})", "pre_tokenizer 'Split'");
  rejects(R"({"type":"Sequence","pretokenizers":[{"type":"Digits"},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]})",
          "Sequence other than [Split, ByteLevel]");
  rejects(R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"String":" "},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]})",
          "without a \"Regex\"");
  rejects(R"({"type":"Metaspace"})", "pre_tokenizer 'Metaspace'");
}

TEST_CASE("post-processors: TemplateProcessing's special tokens, only when asked") {
  const std::string bos_template =
      R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|bos|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"<|x|>","type_id":0}}],"pair":[],"special_tokens":{"<|bos|>":{"id":"<|bos|>","ids":[301],"tokens":["<|bos|>"]},"<|x|>":{"id":"<|x|>","ids":[300],"tokens":["<|x|>"]}}})";
  const std::string byte_level = R"({"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true})";
  const std::string pre = R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})";
  for (const std::string& post : {bos_template, R"({"type":"Sequence","processors":[)" + byte_level + "," + bos_template + "]}"}) {
    auto tok = bpe_tokenizer::from_json(with(pre, post));
    CHECK(tok.special_tokens().prefix == std::vector<token_id>{301});
    CHECK(tok.special_tokens().suffix == std::vector<token_id>{300});
    CHECK(tok.encode("abc") == std::vector<token_id>{'a', 259});  // what the trace readers use
    std::vector<token_id> with_specials{7};
    tok.encode_with_special_tokens("abc", with_specials);
    CHECK(with_specials == std::vector<token_id>{7, 301, 'a', 259, 300});
  }
  auto plain = bpe_tokenizer::from_json(with(pre, byte_level));
  std::vector<token_id> ids;
  plain.encode_with_special_tokens("abc", ids);
  CHECK(ids == plain.encode("abc"));

  auto rejects = [&](const std::string& post, std::string_view says) {
    try {
      (void)bpe_tokenizer::from_json(with(pre, post));
      FAIL("accepted: " << post);
    } catch (const hybridcache::invalid_argument& e) {
      CHECK_MESSAGE(std::string_view(e.what()).find(says) != std::string_view::npos, e.what());
    }
  };
  rejects(R"({"type":"RobertaProcessing"})", "post_processor 'RobertaProcessing'");
  rejects(R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|bos|>","type_id":0}}],"special_tokens":{"<|bos|>":{"id":"<|bos|>","ids":[301]}}})",
          "sequence \"A\" once");
  rejects(R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|bos|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"special_tokens":{}})",
          "has no \"ids\"");
  rejects(R"({"type":"TemplateProcessing","single":[{"Sequence":{"id":"B","type_id":0}}],"special_tokens":{}})", "sequence \"A\" once");
  rejects(R"({"type":"Sequence","processors":[)" + bos_template + "," + bos_template + "]}", "two TemplateProcessing");
}

TEST_CASE("NFC with the package's data, by hand") {
  const nfc_normalizer& nfc = nfc_normalizer::get();
  auto norm = [&](std::string_view s) {
    std::string out;
    std::vector<std::uint32_t> scratch;
    nfc.normalize(s, out, scratch);
    return out;
  };
  CHECK(norm("e\xCC\x81") == "\xC3\xA9");                        // e + U+0301 -> U+00E9
  CHECK(norm("\xE2\x84\xAB") == "\xC3\x85");                     // U+212B ANGSTROM SIGN -> U+00C5 (a singleton)
  CHECK(norm("\xEF\xA4\x80") == "\xE8\xB1\x88");                 // U+F900 -> U+8C48 (a compatibility ideograph)
  CHECK(norm("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // jamo L V T -> U+AC01
  CHECK(norm("a\xCC\x81\xCC\xA3") == "\xE1\xBA\xA1\xCC\x81");    // reordered (220 before 230), then a + U+0323 composes
  CHECK(norm("a\xCC\x81\xCC\x81") == "\xC3\xA1\xCC\x81");        // the second acute is blocked by the first
  CHECK(norm("\xE0\xA5\x98") == "\xE0\xA4\x95\xE0\xA4\xBC");     // U+0958: an excluded composite stays decomposed
  CHECK(norm("\xCD\x84") == "\xCC\x88\xCC\x81");                 // U+0344: a decomposition starting with a mark
  CHECK(norm("\xE1\xB7\xBA" "a") == "\xE1\xB7\xBA" "a");         // U+1DFA: newer than the package's data, left alone
  CHECK(nfc.combining_class(0x0301) == 230);
  CHECK(nfc.combining_class(0x1DFA) == 0);
  CHECK(nfc.inert("hello \xE4\xBD\xA0\xE5\xA5\xBD \xC3\xA9"));  // ASCII, CJK, a precomposed letter
  CHECK_FALSE(nfc.inert("e\xCC\x81"));
  CHECK_FALSE(nfc.inert("\xE2\x84\xAB"));
  CHECK_FALSE(nfc.inert("\xE1\x84\x80\xE1\x85\xA1"));
  // scan's three-byte shortcut (by block) against the definition, on every code point; a
  // character NFC changes alone is one `scan` reports.
  std::size_t changing = 0;
  for (std::uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string c;
    detail::append_utf8(c, cp);
    const auto want = nfc.attention(cp) ? nfc_normalizer::text_state::changes : nfc_normalizer::text_state::inert;
    REQUIRE(nfc.scan(c) == want);
    REQUIRE(nfc.scan("x" + c + "y") == want);
    if (norm(c) != c) {
      ++changing;
      REQUIRE(want == nfc_normalizer::text_state::changes);
    }
  }
  CHECK(changing > 1000);  // singletons (CJK compatibility ideographs), excluded composites, ...
  // A long run of marks (20,000 pairs of classes 230 and 220) is sorted, not insertion-sorted.
  std::string marks = "a";
  for (int k = 0; k < 20000; ++k) marks += "\xCC\x81\xCC\xA3";  // U+0301, U+0323
  const std::string sorted = norm(marks);
  std::string want = "\xE1\xBA\xA1";  // a + U+0323 composes to U+1EA1; the rest stay, 220s first
  for (int k = 1; k < 20000; ++k) want += "\xCC\xA3";
  for (int k = 0; k < 20000; ++k) want += "\xCC\x81";
  CHECK(sorted == want);
  CHECK(norm(sorted) == sorted);
  CHECK(nfc.scan("ab\xE4\xBD") == nfc_normalizer::text_state::ill_formed);
  CHECK(nfc.scan("\xED\xA0\x80") == nfc_normalizer::text_state::ill_formed);  // a surrogate
  CHECK(nfc.scan("\xE0\x80\x80") == nfc_normalizer::text_state::ill_formed);  // overlong
}

TEST_CASE("normalizers: NFC loads and applies before the split; others are rejected") {
  const std::string pre = R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})";
  auto with_normalizer = [&](const std::string& normalizer) {
    std::string json = with(pre);
    const std::string null_normalizer = R"("normalizer":null)";
    json.replace(json.find(null_normalizer), null_normalizer.size(), R"("normalizer":)" + normalizer);
    return json;
  };
  for (const std::string& n : {std::string(R"({"type":"NFC"})"), std::string(R"({"type":"Sequence","normalizers":[{"type":"NFC"}]})")}) {
    auto tok = bpe_tokenizer::from_json(with_normalizer(n));
    CHECK(tok.encode("e\xCC\x81<|x|>\xE2\x84\xAB") == tok.encode("\xC3\xA9<|x|>\xC3\x85"));
    CHECK(tok.encode("x\xFF") == tok.encode("x\xEF\xBF\xBD"));  // ill-formed input: replaced, then normalized
  }
  auto plain = bpe_tokenizer::from_json(with(pre));
  CHECK(plain.encode("e\xCC\x81") != plain.encode("\xC3\xA9"));
  for (const std::string& n : {std::string(R"({"type":"NFKC"})"), std::string(R"({"type":"Lowercase"})"),
                               std::string(R"({"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Lowercase"}]})")}) {
    CHECK_THROWS_AS((void)bpe_tokenizer::from_json(with_normalizer(n)), hybridcache::invalid_argument);
  }
}

TEST_CASE("model fields real files hold: empty prefixes and an unk token that cannot be emitted") {
  const std::string pre = R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})";
  auto with_model = [&](const std::string& fields) {
    std::string json = with(pre);
    const std::string at = R"("byte_fallback":false)";
    json.replace(json.find(at), at.size(), at + fields);
    return json;
  };
  auto tok = bpe_tokenizer::from_json(with_model(R"(,"continuing_subword_prefix":"","end_of_word_suffix":"")"));
  CHECK(tok.encode("abc") == std::vector<token_id>{'a', 259});
  CHECK(bpe_tokenizer::from_json(with_model(R"(,"unk_token":"<|x|>")")).encode("abc") == std::vector<token_id>{'a', 259});
  // Without byte 'z' (id 122) the unknown token could be emitted: rejected.
  std::string missing = with_model(R"(,"unk_token":"<|x|>")");
  missing.erase(missing.find(R"("z":122,)"), std::string_view(R"("z":122,)").size());
  CHECK_THROWS_AS((void)bpe_tokenizer::from_json(missing), hybridcache::invalid_argument);
  for (const std::string& bad : {std::string(R"(,"continuing_subword_prefix":"##")"), std::string(R"(,"end_of_word_suffix":"</w>")"),
                                 std::string(R"(,"dropout":0.1)"), std::string(R"(,"unk_token":7)")}) {
    CHECK_THROWS_AS((void)bpe_tokenizer::from_json(with_model(bad)), hybridcache::invalid_argument);
  }
}
