// JSON reader: grammar, numbers, escapes (\uXXXX, surrogate pairs), nesting, errors with
// line, field and column; and the buffered line reader.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <hybridcache/sim/chat_format.hpp>
#include <hybridcache/sim/json.hpp>
#include <hybridcache/sim/json_value.hpp>
#include <hybridcache/sim/line_reader.hpp>

using namespace hybridcache;
using namespace hybridcache::sim;

namespace {

// The format_error a parse raises (fails the test if none).
format_error error_of(std::string_view text, std::int64_t first_line = 1) {
  try {
    (void)parse_json(text, first_line);
  } catch (const format_error& e) {
    return e;
  }
  FAIL("no format_error for: " << text);
  return format_error(0, "", "");
}

}  // namespace

TEST_CASE("json: scalars, numbers and their exact values") {
  CHECK(parse_json("null").is_null());
  CHECK(parse_json(" true ").as_bool());
  CHECK_FALSE(parse_json("false").as_bool());
  CHECK(parse_json("0").as_int() == 0);
  CHECK(parse_json("-0").as_int() == 0);
  CHECK(parse_json("9223372036854775807").as_int() == std::numeric_limits<std::int64_t>::max());
  CHECK(parse_json("-9223372036854775808").as_int() == std::numeric_limits<std::int64_t>::min());
  // Too big for int64: still a number (double), not an integer.
  const json_value big = parse_json("9223372036854775808");
  CHECK_FALSE(big.is_integer());
  CHECK(big.as_double() == 9223372036854775808.0);
  CHECK(parse_json("62.345").as_double() == 62.345);
  CHECK_FALSE(parse_json("62.345").is_integer());
  CHECK(parse_json("1e3").as_double() == 1000.0);
  CHECK_FALSE(parse_json("1e3").is_integer());
  CHECK(parse_json("-2.5E-3").as_double() == -0.0025);
  CHECK(parse_json("1E+2").as_double() == 100.0);
  CHECK(parse_json("0.1").as_double() == 0.1);
  CHECK(parse_json("1e-400").as_double() == 0.0);
  CHECK(std::signbit(parse_json("-1e-400").as_double()));
  CHECK(parse_json("0.0000").as_double() == 0.0);
  CHECK(parse_json("4.9e-324").as_double() > 0.0);
  CHECK(error_of("1e400").field().empty());
  CHECK(std::string(error_of("123456789012345678901234567890e300").what()).find("overflows") != std::string::npos);
  for (const char* bad : {"01", "-", "+1", ".5", "1.", "1e", "1e+", "--1", "0x10", "NaN", "Infinity", "-01"}) {
    CAPTURE(bad);
    (void)error_of(bad);
  }
}

TEST_CASE("json: strings, escapes, \\u and surrogate pairs") {
  CHECK(parse_json(R"("plain")").as_string() == "plain");
  CHECK(parse_json(R"("a\"b\\c\/d\b\f\n\r\t")").as_string() == "a\"b\\c/d\b\f\n\r\t");
  CHECK(parse_json(R"("\u0041\u00e9\u4e2d")").as_string() == "A\xC3\xA9\xE4\xB8\xAD");  // A é 中
  CHECK(parse_json(R"("\uD83D\uDE00")").as_string() == "\xF0\x9F\x98\x80");            // 😀
  CHECK(parse_json(R"("\ud83d\ude00x")").as_string() == "\xF0\x9F\x98\x80x");
  CHECK(parse_json(R"("\u0000")").as_string() == std::string(1, '\0'));
  CHECK(parse_json("\"中文 text\"").as_string() == "中文 text");  // raw UTF-8 passes through
  CHECK(parse_json(R"("")").as_string().empty());
  CHECK(std::string(error_of(R"("\uD83D")").what()).find("unpaired high surrogate") != std::string::npos);
  CHECK(std::string(error_of(R"("\uD83Dx")").what()).find("unpaired high surrogate") != std::string::npos);
  CHECK(std::string(error_of(R"("\uDE00")").what()).find("unpaired low surrogate") != std::string::npos);
  CHECK(std::string(error_of(R"("\uD83D\u0041")").what()).find("not followed by a low surrogate") != std::string::npos);
  CHECK(std::string(error_of(R"("\u12G4")").what()).find("hex digit") != std::string::npos);
  CHECK(std::string(error_of(R"("\u12")").what()).find("escape") != std::string::npos);
  CHECK(std::string(error_of(R"("\x")").what()).find("invalid escape") != std::string::npos);
  CHECK(std::string(error_of("\"abc").what()).find("unterminated") != std::string::npos);
  CHECK(std::string(error_of("\"a\\").what()).find("unterminated") != std::string::npos);
  CHECK(std::string(error_of("\"a\tb\"").what()).find("control character") != std::string::npos);
}

TEST_CASE("json: arrays, objects, nesting, member order") {
  const json_value v = parse_json(R"({"a": [1, 2.5, "x", [], {}], "b": {"c": {"d": [null, true]}}, "e\u0041": -7})");
  REQUIRE(v.kind() == json_kind::object);
  REQUIRE(v.as_object().size() == 3);
  CHECK(v.as_object()[0].first == "a");
  CHECK(v.as_object()[2].first == "eA");
  const auto& a = v.find("a")->as_array();
  REQUIRE(a.size() == 5);
  CHECK(a[0].as_int() == 1);
  CHECK(a[1].as_double() == 2.5);
  CHECK(a[2].as_string() == "x");
  CHECK(a[3].as_array().empty());
  CHECK(a[4].as_object().empty());
  CHECK(v.find("b")->find("c")->find("d")->as_array()[1].as_bool());
  CHECK(v.find("eA")->as_int() == -7);
  CHECK(v.find("zz") == nullptr);
  CHECK_THROWS_AS((void)v.find("a")->as_string(), invalid_argument);

  // Deep nesting within the limit parses; beyond it is an error, not a stack overflow.
  const std::string ok = std::string(200, '[') + std::string(200, ']');
  CHECK(parse_json(ok).kind() == json_kind::array);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK(std::string(error_of(deep).what()).find("nesting deeper") != std::string::npos);

  for (const char* bad : {"[1,]", "[,1]", "[1 2]", "{\"a\" 1}", "{\"a\":1,}", "{a:1}", "{\"a\":}", "[", "{", "[1]]", "{} x", "", "  "}) {
    CAPTURE(bad);
    (void)error_of(bad);
  }
}

TEST_CASE("json: errors name the line, the field and the column") {
  json_cursor c(R"({"ids": [1, 2, "three"]})", 41);
  c.begin_object("");
  std::string_view key;
  REQUIRE(c.next_member(key));
  CHECK(key == "ids");
  std::vector<std::int32_t> ids;
  try {
    c.read_int_array(key, ids);
    FAIL("expected a format_error");
  } catch (const format_error& e) {
    CHECK(e.line() == 41);
    CHECK(e.field() == "ids");
    CHECK(std::string(e.what()).find("column 16") != std::string::npos);
  }
  // Multi-line documents: the line of the failing character.
  const format_error e = error_of("[\n  1,\n  2,\n  x\n]", 10);
  CHECK(e.line() == 13);
  // Integers where an integer is required.
  json_cursor f(R"([1.5, 3000000000, -1])");
  f.begin_array("");
  REQUIRE(f.next_element());
  CHECK_THROWS_AS((void)f.read_int("n"), format_error);
  json_cursor g(R"([3000000000, -1])");
  CHECK_THROWS_WITH_AS(g.read_int_array<std::int32_t>("ids", ids), doctest::Contains("outside"), format_error);
  json_cursor h(R"([5, 6, 7])");
  h.read_int_array<std::int32_t>("ids", ids);
  CHECK(ids == std::vector<std::int32_t>{5, 6, 7});
}

TEST_CASE("json: integer arrays (fast path and its fallbacks)") {
  auto ints = [](std::string_view text) {
    json_cursor c(text);
    std::vector<std::int64_t> out;
    c.read_int_array("a", out);
    c.expect_end();
    return out;
  };
  CHECK(ints("[]").empty());
  CHECK(ints(" [ ] ").empty());
  CHECK(ints("[0]") == std::vector<std::int64_t>{0});
  CHECK(ints("[ 5 ,6\t,\n7 ]") == std::vector<std::int64_t>{5, 6, 7});
  CHECK(ints("[-3, 0, 999999999999999999, 1234567890123456789, -9223372036854775808]") ==
        std::vector<std::int64_t>{-3, 0, 999999999999999999, 1234567890123456789, std::numeric_limits<std::int64_t>::min()});
  for (const char* bad : {"[1,]", "[,1]", "[1 2]", "[01]", "[1.0]", "[1e2]", "[\"1\"]", "[1", "[1,", "[9223372036854775808]", "[--1]"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(ints(bad), format_error);
  }
  json_cursor c("[1, -1]");
  std::vector<std::uint32_t> u;
  CHECK_THROWS_WITH_AS(c.read_int_array("ids", u, 0, 10), doctest::Contains("element 1 = -1 is outside [0, 10]"), format_error);
}

TEST_CASE("line_reader: lines across buffer refills, CRLF, no final newline, long lines") {
  std::string text;
  std::vector<std::string> expected;
  for (int i = 0; i < 500; ++i) {
    std::string line(static_cast<std::size_t>((i * 37) % 300), static_cast<char>('a' + i % 26));
    if (i % 7 == 0) line += std::to_string(i);
    expected.push_back(line);
    text += line;
    text += (i % 5 == 0) ? "\r\n" : "\n";
  }
  expected.emplace_back(1000, 'z');  // longer than the buffer, no trailing newline
  text += expected.back();
  std::istringstream in(text);
  line_reader reader(in, 64);
  std::string_view line;
  std::size_t n = 0;
  while (reader.next(line)) {
    REQUIRE(n < expected.size());
    CHECK(line == expected[n]);
    ++n;
    CHECK(reader.line_number() == static_cast<std::int64_t>(n));
  }
  CHECK(n == expected.size());
  CHECK_FALSE(reader.next(line));

  std::istringstream empty("");
  line_reader none(empty);
  CHECK_FALSE(none.next(line));
  CHECK_THROWS_AS(line_reader(std::filesystem::path("/nonexistent/trace.jsonl")), invalid_argument);
}

TEST_CASE("json: whitespace runs of every length between tokens (the 8-byte space skip)") {
  // The same document with random whitespace between its tokens: runs of 0-20 spaces (the
  // skip reads 8 bytes at a time, so every length and alignment is met), mixed with tabs,
  // newlines and carriage returns, parses to the same values.
  std::mt19937_64 rng(1908);
  const std::vector<std::string> tokens = {"{", "\"a\"", ":", "[", "1", ",", "\"x y\"", ",", "{", "\"b\"", ":", "true", "}", ",",
                                           "-2.5", ",", "null", "]", ",", "\"c\"", ":", "\"  \"", "}"};
  const json_value compact = parse_json([&] {
    std::string s;
    for (const auto& t : tokens) s += t;
    return s;
  }());
  for (int round = 0; round < 400; ++round) {
    std::string s;
    for (const auto& t : tokens) {
      const int run = static_cast<int>(rng() % 21);
      for (int k = 0; k < run; ++k) {
        const auto r = rng() % 16;
        s += r == 0 ? '\n' : r == 1 ? '\t' : r == 2 ? '\r' : ' ';
      }
      s += t;
    }
    s.append(rng() % 12, ' ');
    CAPTURE(s);
    const json_value v = parse_json(s);
    REQUIRE(v.as_object().size() == 2);
    const auto& a = v.find("a")->as_array();
    REQUIRE(a.size() == 5);
    CHECK(a[0].as_int() == compact.find("a")->as_array()[0].as_int());
    CHECK(a[1].as_string() == "x y");
    CHECK(a[2].find("b")->as_bool());
    CHECK(a[3].as_double() == -2.5);
    CHECK(a[4].is_null());
    CHECK(v.find("c")->as_string() == "  ");
  }
  // The column of an error after a long run of spaces is exact.
  for (std::size_t spaces = 0; spaces < 20; ++spaces) {
    const std::string bad = "[1," + std::string(spaces, ' ') + "x]";
    CAPTURE(bad);
    CHECK(std::string(error_of(bad).what()).find("column " + std::to_string(4 + spaces)) != std::string::npos);
  }
  // Only spaces (and nothing else) is still "no value".
  (void)error_of(std::string(17, ' '));
}

TEST_CASE("json: strings of every length with escapes and control bytes anywhere (the 8-byte scan)") {
  // The scan for the end of a string reads 8 bytes at a time: quotes, backslashes and
  // control bytes at every offset, in strings of 0-40 bytes with multi-byte characters.
  std::mt19937_64 rng(1909);
  const std::vector<std::pair<std::string, std::string>> pieces = {
      {"a", "a"}, {"\xc3\xa9", "\xc3\xa9"}, {"\\\"", "\""}, {"\\\\", "\\"}, {"\\n", "\n"}, {"\\u00e9", "\xc3\xa9"}, {"~", "~"}, {" ", " "}};
  for (int round = 0; round < 2000; ++round) {
    std::string literal = "[\"", expected;
    std::vector<std::size_t> boundaries = {literal.size()};  // between pieces, never inside an escape
    const auto n = rng() % 30;
    for (std::size_t k = 0; k < n; ++k) {
      // Mostly plain bytes, so escapes land at every offset of a word.
      const auto& p = pieces[rng() % 4 == 0 ? rng() % pieces.size() : (rng() % 2 == 0 ? 0 : 6)];
      literal += p.first;
      expected += p.second;
      boundaries.push_back(literal.size());
    }
    literal += "\"]";
    CAPTURE(literal);
    CHECK(parse_json(literal).as_array()[0].as_string() == expected);
    // A raw control byte anywhere in it is an error at its column.
    const std::size_t at = boundaries[rng() % boundaries.size()];
    std::string bad = literal;
    bad.insert(at, 1, static_cast<char>(rng() % 0x20));
    CAPTURE(bad);
    const std::string what = error_of(bad).what();
    CHECK(what.find("raw control character") != std::string::npos);
    CHECK(what.find("column " + std::to_string(at + 1)) != std::string::npos);
  }
}

namespace {

// What a reader gets from an object of integers and an array of strings or pairs: by the
// fast paths (falling back to the general calls for one member or element at a time, as
// bpe_tokenizer does), or by the general calls alone. "error" and its message when it throws.
std::string read_members(std::string_view text, bool fast) {
  std::ostringstream out;
  try {
    json_cursor c(text);
    c.begin_object("");
    std::string_view key;
    auto member = [&](std::string_view k, std::int64_t v) { out << '[' << k << "]=" << v << ';'; };
    while (!(fast && c.plain_int_members(member)) && c.next_member(key)) {
      const std::string k(key);
      member(k, c.read_int(k));
    }
    c.expect_end();
  } catch (const format_error& e) {
    out << "error: " << e.what();
  }
  return out.str();
}

std::string read_elements(std::string_view text, bool fast) {
  std::ostringstream out;
  try {
    json_cursor c(text);
    c.begin_array("");
    auto one = [&](std::string_view s) { out << '[' << s << "];"; };
    auto two = [&](std::string_view a, std::string_view b) { out << '[' << a << '|' << b << "];"; };
    while (!(fast && c.plain_string_elements(one, two)) && c.next_element("")) {
      if (c.peek("") == json_kind::string) {
        one(c.read_string(""));
        continue;
      }
      c.begin_array("");
      if (!c.next_element("")) c.fail("", "a pair needs two strings");
      const std::string a(c.read_string(""));
      if (!c.next_element("")) c.fail("", "a pair needs two strings");
      const std::string b(c.read_string(""));
      if (c.next_element("")) c.fail("", "a pair has two strings");
      two(a, b);
    }
    c.expect_end();
  } catch (const format_error& e) {
    out << "error: " << e.what();
  }
  return out.str();
}

}  // namespace

TEST_CASE("json: the plain-member and plain-string fast paths read what the general calls read, errors included") {
  CHECK(read_members(R"({"a": 1, "b\"": 2, "c":3})", true) == "[a]=1;[b\"]=2;[c]=3;");
  CHECK(read_elements(R"(["a b", ["x", "y\\z"], ["p","q"], "\u0041 B"])", true) == "[a b];[x|y\\z];[p|q];[A B];");
  // Random documents from pieces that are plain, need the general path, or are malformed.
  std::mt19937_64 rng(19);
  const std::vector<std::string> keys = {"\"a\"", "\"\u0120x\"", "\"q\\\"\"", "\"\"", "\"\\u00e9\"", "\"t\tab\"", "\"long-key-of-many-bytes\""};
  const std::vector<std::string> values = {"0", "7", "123456789", "-4", "01", "1.5", "2e3", "\"s\"", "999999999999999999999", "null"};
  const std::vector<std::string> strings = {"\"a b\"", "\"x\"", "\"\\\\ y\"", "\"\\u0120a b\"", "\"\"", "5", "[\"a\",\"b\"]", "[\"a\" , \"\\\"\"]",
                                            "[\"a\"]", "[\"a\",\"b\",\"c\"]", "[1,\"b\"]", "[ ]"};
  const std::vector<std::string> gaps = {"", " ", "\n      ", "\t", "\r\n"};
  auto gap = [&] { return gaps[rng() % gaps.size()]; };
  std::size_t errors = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string obj = "{" + gap(), arr = "[" + gap();
    const int n = static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) {
      const bool bad = rng() % 8 == 0;
      obj += keys[rng() % (bad ? keys.size() : 5)] + gap() + ":" + gap() + values[rng() % (bad ? values.size() : 3)] + gap();
      arr += strings[rng() % (bad ? strings.size() : 5)] + gap();
      if (k + 1 < n || rng() % 16 == 0) obj += "," + gap(), arr += "," + gap();  // sometimes a trailing comma
    }
    obj += rng() % 32 == 0 ? "" : "}";
    arr += rng() % 32 == 0 ? "" : "]";
    CAPTURE(obj);
    CAPTURE(arr);
    const std::string general = read_members(obj, false);
    CHECK(read_members(obj, true) == general);
    CHECK(read_elements(arr, true) == read_elements(arr, false));
    errors += general.find("error") != std::string::npos ? 1 : 0;
  }
  CHECK(errors > 100);  // malformed documents were generated
}

TEST_CASE("json: skip_value names an escaped key in its errors after nested keys reuse the key buffer") {
  // The key "k1" is unescaped into the cursor's key buffer; the value skipped under it holds
  // a longer escaped key that reallocates that buffer, and then a syntax error. The error
  // must still name "k1" (it read freed memory: a fuzz finding in the swe-agent reader).
  const std::string long_key = "\\u0061" + std::string(200, 'b');
  // A short name (in the string's own buffer) and a long one (on the heap: freed by the
  // reallocation, which ASan reports).
  for (const std::string& suffix : {std::string(), std::string(40, 'z')})
    for (const std::string& tail : {std::string("x]"), std::string("1 2]")}) {
      const std::string doc = R"({"k\u0031)" + suffix + R"(": [{")" + long_key + R"(": 1}, )" + tail + "}";
      json_cursor c(doc);
      c.begin_object("");
      std::string_view key;
      REQUIRE(c.next_member(key));
      CHECK(key == "k1" + suffix);
      try {
        c.skip_value(key);
        FAIL("expected a format_error");
      } catch (const format_error& e) {
        CHECK(e.field() == "k1" + suffix);
      }
    }
  // The same through a reader: a swe-agent document whose skipped top-level key is escaped.
  const std::string traj = R"({"inf\u006f": [{")" + long_key + R"(": 1}, x], "history": []})";
  chat_conversation conv;
  std::string field;
  try {
    parse_swe_agent_traj(traj, conv);
  } catch (const format_error& e) {
    field = e.field();
  }
  CHECK(field == "info");
}
