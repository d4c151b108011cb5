// The one byte-size grammar (core/byte_size.hpp): a table of accepted and refused texts,
// and randomized checks against a reference model that computes in 128-bit integers.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <string_view>

#include "hybridcache/core/byte_size.hpp"

using namespace hybridcache;
using E = byte_size_error;

namespace {

constexpr std::int64_t KiB = std::int64_t{1} << 10;
constexpr std::int64_t MiB = std::int64_t{1} << 20;
constexpr std::int64_t GiB = std::int64_t{1} << 30;
constexpr std::int64_t TiB = std::int64_t{1} << 40;
constexpr std::int64_t PiB = std::int64_t{1} << 50;
constexpr std::int64_t max64 = std::numeric_limits<std::int64_t>::max();

__extension__ typedef __int128 i128;

std::string message_of(std::string_view text) {
  try {
    (void)parse_byte_size_or_throw(text, "--size");
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

// Compile-time: the scanner is constexpr.
static_assert(scan_byte_size("4.1GB").bytes == 4'100'000'000);
static_assert(scan_byte_size("0.5KiB").bytes == 512);
static_assert(scan_byte_size("1.5B").error == E::not_whole);
static_assert(parse_byte_size("1e19").error() == errc::invalid_argument);

TEST_CASE("byte sizes: accepted texts and their exact values") {
  const struct {
    const char* text;
    std::int64_t bytes;
  } accepted[] = {
      {"0", 0},
      {"000", 0},
      {"0KiB", 0},
      {"0.0e999999999999999999999", 0},
      {"7", 7},
      {" 7 ", 7},
      {"\t7\n", 7},
      {"7B", 7},
      {"7 b", 7},
      {"500000000", 500'000'000},
      {"5e8", 500'000'000},
      {"5e10", 50'000'000'000},
      {"5E10", 50'000'000'000},
      {"5e+10", 50'000'000'000},
      {"1.5e9", 1'500'000'000},
      {"1.5e3KB", 1'500'000},
      {"15e-1KB", 1'500},
      {"4.1GB", 4'100'000'000},
      {"2.45KB", 2'450},
      {"1.001KB", 1'001},
      {"2.097152MB", 2'097'152},
      {"2.45TB", 2'450'000'000'000},
      {"5GB", 5'000'000'000},
      {"5gb", 5'000'000'000},
      {"5gB", 5'000'000'000},
      {"2TB", 2'000'000'000'000},
      {"1PB", 1'000'000'000'000'000},
      {"10 GiB", 10 * GiB},
      {"512 MiB", 512 * MiB},
      {"1kib", KiB},
      {"1KIB", KiB},
      {"64KiB", 64 * KiB},
      {"4GiB", 4 * GiB},
      {"1.5TiB", 3 * (TiB / 2)},
      {"1PiB", PiB},
      {"0.5KiB", 512},
      {"0.25KiB", 256},
      {"0.0009765625KiB", 1},  // 2^-10 KiB
      {"8.88178419700125232338905334472656250e-16PiB", 1},  // 2^-50 PiB
      {".5KB", 500},
      {"5.", 5},
      {"5.e3", 5'000},
      {"3.000", 3},
      {"00012", 12},
      {"1000000000000000000000e-3", 1'000'000'000'000'000'000},
      {"9223372036854775807", max64},
      {"9223372036854775807B", max64},
      {"9.223372036854775807e18", max64},
      {"0.9223372036854775807e19", max64},
      {"8191.99999999999999911182158029987476766109466552734375PiB", max64},  // 8192 PiB - 1 B
      {"8388607TiB", 8388607 * TiB},
      {"8388607.75TiB", 8388607 * TiB + 3 * (TiB / 4)},
  };
  for (const auto& a : accepted) {
    CAPTURE(a.text);
    const auto r = scan_byte_size(a.text);
    CHECK(to_string(r.error) == "none");
    CHECK(r.bytes == a.bytes);
    CHECK(parse_byte_size(a.text).value() == a.bytes);
    CHECK(parse_byte_size_or_throw(a.text, "x") == a.bytes);
  }
}

TEST_CASE("byte sizes: refused texts and why") {
  const struct {
    const char* text;
    E why;
  } refused[] = {
      {"", E::empty},
      {"   ", E::empty},
      {"GB", E::no_number},
      {"KiB", E::no_number},
      {".", E::no_number},
      {".e5", E::no_number},
      {"inf", E::no_number},
      {"nan", E::no_number},
      {"-1", E::sign},
      {"-0", E::sign},
      {"-5e8", E::sign},
      {"+1", E::sign},
      {"1e+", E::bad_exponent},
      {"1e-", E::bad_exponent},
      {"1e+GB", E::bad_exponent},
      {"1e", E::unknown_unit},
      {"5EB", E::unknown_unit},
      {"8EiB", E::unknown_unit},
      {"1GBB", E::unknown_unit},
      {"1KBiB", E::unknown_unit},
      {"0x10", E::unknown_unit},
      {"5XB", E::unknown_unit},
      {"1bytes", E::unknown_unit},
      {"1iB", E::unknown_unit},
      {"4K", E::ambiguous_unit},
      {"4k", E::ambiguous_unit},
      {"5 G", E::ambiguous_unit},
      {"1T", E::ambiguous_unit},
      {"1P", E::ambiguous_unit},
      {"64Gi", E::ambiguous_unit},
      {"1 2", E::trailing_text},
      {"1GB 2", E::trailing_text},
      {"5GB5", E::unknown_unit},
      {"1.2.3GB", E::trailing_text},
      {"1,5GB", E::trailing_text},
      {"1GB GB", E::trailing_text},
      {"1e5.5", E::trailing_text},
      {"1.5B", E::not_whole},
      {"1.5", E::not_whole},
      {"0.3KiB", E::not_whole},  // 307.2
      {"0.5", E::not_whole},
      {"1e-1", E::not_whole},
      {"1.0005KB", E::not_whole},
      {"0.000000000000000000000001GiB", E::not_whole},
      {"1.999999999999999999999999KiB", E::not_whole},
      {"8388607.999999TiB", E::not_whole},
      {"0.00048828125KiB", E::not_whole},  // 2^-11 KiB = half a byte
      {"1e-999999999999999999999", E::not_whole},
      {"9223372036854775808", E::too_large},
      {"9223372036854775807.5", E::not_whole},
      {"9223372036854775808.5", E::too_large},
      {"99999999999999999999999", E::too_large},
      {"1e19", E::too_large},
      {"1e30", E::too_large},
      {"1e999999999999999999999", E::too_large},
      {"10000000TB", E::too_large},
      {"8388608TiB", E::too_large},  // 2^63
      {"8192PiB", E::too_large},
      {"9223372036854775807KB", E::too_large},
  };
  for (const auto& r : refused) {
    CAPTURE(r.text);
    const auto s = scan_byte_size(r.text);
    CHECK(to_string(s.error) == to_string(r.why));
    CHECK(s.bytes == 0);
    CHECK_FALSE(parse_byte_size(r.text).has_value());
    if (r.why == E::too_large) CHECK_THROWS_AS((void)parse_byte_size_or_throw(r.text, "x"), overflow_error);
    else CHECK_THROWS_AS((void)parse_byte_size_or_throw(r.text, "x"), invalid_argument);
  }
}

TEST_CASE("byte sizes: one-line messages name the text, the field and what was expected") {
  CHECK(message_of("5XB").find("--size '5XB': unknown unit 'XB'") != std::string::npos);
  CHECK(message_of("5XB").find("KiB") != std::string::npos);
  CHECK(message_of("4K").find("unit 'K' is ambiguous: write KB (10^3) or KiB (2^10)") != std::string::npos);
  CHECK(message_of("4g").find("write GB (10^9) or GiB (2^30)") != std::string::npos);
  CHECK(message_of("64Gi").find("unit 'Gi' is incomplete: write GiB") != std::string::npos);
  CHECK(message_of("1.5B").find("not a whole number of bytes") != std::string::npos);
  CHECK(message_of("1e30").find("int64") != std::string::npos);
  CHECK(message_of("-1").find("negative") != std::string::npos);
  CHECK(message_of("GB").find("not a size: no number") != std::string::npos);
  CHECK(message_of("1 2").find("unexpected '2'") != std::string::npos);
  CHECK(message_of("1e+").find("exponent 'e+' has no digits") != std::string::npos);
  CHECK(message_of("").find("--size '': empty") != std::string::npos);
  const std::string m = message_of("1\n2");
  CHECK(m.find('\n') == std::string::npos);
  CHECK(m.find("'1\\x0a2'") != std::string::npos);
  CHECK(scan_byte_size(" 1GB  junk  ").part == "junk");
}

namespace {

// The reference model: a size built from parts, its value computed in __int128.
struct parts {
  std::string text;
  std::optional<std::int64_t> bytes;  // nullopt: not whole or too large
};

struct unit_def {
  const char* name;
  int pow10;
  int pow2;
};
constexpr unit_def units[] = {{"", 0, 0},    {"B", 0, 0},    {"KB", 3, 0},   {"MB", 6, 0},   {"GB", 9, 0},
                              {"TB", 12, 0}, {"PB", 15, 0},  {"KiB", 0, 10}, {"MiB", 0, 20}, {"GiB", 0, 30},
                              {"TiB", 0, 40}, {"PiB", 0, 50}};

// mantissa m (< 10^18) x 10^exp10 x 2^pow2, exact; nullopt unless a whole int64.
std::optional<std::int64_t> reference_value(std::uint64_t m, int exp10, int pow2) {
  if (m == 0) return 0;
  i128 num = static_cast<i128>(m) << pow2;  // < 10^18 x 2^50 < 2^110
  if (exp10 >= 0) {
    for (int i = 0; i < exp10; ++i) {
      num *= 10;
      if (num > max64) return std::nullopt;
    }
  } else {
    if (-exp10 > 36) return std::nullopt;  // 10^37 > num: a fraction of a byte
    i128 den = 1;
    for (int i = 0; i < -exp10; ++i) den *= 10;
    if (num % den != 0) return std::nullopt;
    num /= den;
  }
  if (num > max64) return std::nullopt;
  return static_cast<std::int64_t>(num);
}

std::string random_case(std::string s, std::mt19937_64& rng) {
  for (char& c : s)
    if (rng() % 2) c = static_cast<char>(c >= 'a' ? c - 'a' + 'A' : c - 'A' + 'a');
  return s;
}

parts random_size(std::mt19937_64& rng) {
  auto pick = [&](std::uint64_t n) { return static_cast<int>(rng() % n); };
  // Mantissa: up to 18 significant digits, written with a point somewhere and padding zeros.
  const int sig = 1 + pick(18);
  std::uint64_t m = 0;
  std::string digits;
  for (int i = 0; i < sig; ++i) {
    const int d = (i == 0 && pick(8) != 0) ? 1 + pick(9) : pick(10);
    m = m * 10 + static_cast<std::uint64_t>(d);
    digits += static_cast<char>('0' + d);
  }
  digits = std::string(static_cast<std::size_t>(pick(3)), '0') + digits;
  const int point = pick(static_cast<int>(digits.size()) + 1);  // digits before the point
  const int trailing = pick(3);                                  // zeros after the last digit
  std::string number = digits.substr(0, static_cast<std::size_t>(point));
  std::string fraction = digits.substr(static_cast<std::size_t>(point));
  if (!fraction.empty() || pick(4) == 0) {
    fraction += std::string(static_cast<std::size_t>(trailing), '0');
    number += "." + fraction;
  }
  // Zeros after the last digit change nothing: value = m x 10^-(digits after the point).
  int exp10 = -(static_cast<int>(digits.size()) - point);
  std::string text = number;
  if (pick(2)) {
    const int e = pick(41) - 20;
    text += pick(2) ? "e" : "E";
    if (e >= 0 && pick(2)) text += "+";
    text += std::to_string(e);
    exp10 += e;
  }
  const unit_def& u = units[pick(std::size(units))];
  text += std::string(static_cast<std::size_t>(pick(2)), ' ') + random_case(u.name, rng);
  text = std::string(static_cast<std::size_t>(pick(2)), ' ') + text + std::string(static_cast<std::size_t>(pick(2)), ' ');
  return {text, reference_value(m, exp10 + u.pow10, u.pow2)};
}

}  // namespace

TEST_CASE("byte sizes: random valid texts match the 128-bit reference model") {
  std::mt19937_64 rng(20240611);
  int whole = 0, refused = 0;
  for (int i = 0; i < 200'000; ++i) {
    const parts p = random_size(rng);
    const auto r = scan_byte_size(p.text);
    CAPTURE(p.text);
    if (p.bytes) {
      ++whole;
      REQUIRE(r.ok());
      REQUIRE(r.bytes == *p.bytes);
    } else {
      ++refused;
      REQUIRE((r.error == E::not_whole || r.error == E::too_large));
    }
  }
  // Both outcomes are exercised in earnest.
  CHECK(whole > 20'000);
  CHECK(refused > 20'000);
}

TEST_CASE("byte sizes: every int64 and its exact multiples of a unit read back") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100'000; ++i) {
    const auto v = static_cast<std::int64_t>(rng() >> (1 + rng() % 63));
    CAPTURE(v);
    REQUIRE(scan_byte_size(std::to_string(v)).bytes == v);
    REQUIRE(scan_byte_size(std::to_string(v) + "B").bytes == v);
    const unit_def& u = units[2 + rng() % (std::size(units) - 2)];
    const std::int64_t scale = u.pow2 ? std::int64_t{1} << u.pow2 : [&] {
      std::int64_t s = 1;
      for (int k = 0; k < u.pow10; ++k) s *= 10;
      return s;
    }();
    // v / scale units, with its exact decimal fraction written out.
    const std::int64_t q = v / scale, rem = v % scale;
    std::string frac;
    if (rem != 0) {
      // rem / scale as a terminating decimal: multiply by 10 until whole (at most 50 digits).
      i128 r = rem;
      while (r != 0) {
        r *= 10;
        frac += static_cast<char>('0' + static_cast<int>(r / scale));
        r %= scale;
      }
    }
    const std::string text = std::to_string(q) + (frac.empty() ? "" : "." + frac) + u.name;
    CAPTURE(text);
    REQUIRE(scan_byte_size(text).bytes == v);
  }
}

TEST_CASE("byte sizes: random strings are accepted exactly when the grammar says so") {
  // The grammar as a regular expression; the scanner must agree on every string, and on
  // the accepted ones give the reference value.
  const std::regex grammar(R"(^\s*(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?\s*([A-Za-z][A-Za-z0-9]*)?\s*$)");
  constexpr std::string_view alphabet = "0123456789.eE+- kKmMgGtTpPbBiIx";
  std::mt19937_64 rng(99);
  int matched = 0;
  for (int i = 0; i < 300'000; ++i) {
    std::string s;
    const std::size_t len = rng() % 11;
    for (std::size_t k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    // Bias toward plausible sizes: often start with a digit.
    if (rng() % 2) s.insert(s.begin(), static_cast<char>('0' + rng() % 10));
    CAPTURE(s);
    const auto r = scan_byte_size(s);
    std::smatch m;
    bool ok = std::regex_match(s, m, grammar) && (m[1].length() + m[2].length() > 0);
    std::optional<std::int64_t> expect;
    if (ok) {
      int pow10 = 0, pow2 = 0;
      std::string unit = m[4].str();
      for (char& c : unit) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
      bool known = false;
      for (const auto& u : units) {
        std::string name = u.name;
        for (char& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
        if (name == unit) {
          known = true;
          pow10 = u.pow10;
          pow2 = u.pow2;
        }
      }
      ok = known;
      if (ok) {
        ++matched;
        const std::string digits = m[1].str() + m[2].str();  // at most 11 digits
        const std::uint64_t mant = std::stoull(digits);
        long long e = 0;
        if (m[3].matched) e = std::stoll(m[3].str());
        const long long exp10 = e - static_cast<long long>(m[2].length()) + pow10;
        if (exp10 > 60) expect = mant == 0 ? std::optional<std::int64_t>(0) : std::nullopt;
        else if (exp10 < -60) expect = mant == 0 ? std::optional<std::int64_t>(0) : std::nullopt;
        else expect = reference_value(mant, static_cast<int>(exp10), pow2);
      }
    }
    if (!ok) {
      REQUIRE_FALSE(r.ok());
      REQUIRE(r.error != E::not_whole);
      REQUIRE(r.error != E::too_large);
    } else if (expect) {
      REQUIRE(r.ok());
      REQUIRE(r.bytes == *expect);
    } else {
      REQUIRE((r.error == E::not_whole || r.error == E::too_large));
    }
  }
  CHECK(matched > 10'000);
}
