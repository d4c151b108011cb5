// synth-v1 generator: bit-exact with shared/fixtures/marconi/gen_trace.py (sha256 of the
// JSONL), Python float repr, splitmix64, and the SHA-256 used to check them.
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#include <hybridcache/sim/python_float.hpp>
#include <hybridcache/sim/synth_v1.hpp>

#include "../support/sha256.hpp"
#include "../support/shared_data.hpp"

using namespace hybridcache;
using namespace hybridcache::sim;
using hybridcache::test::sha256_hex;

namespace {

struct trace_totals {
  std::size_t requests = 0;
  std::int64_t input_tokens = 0;
  std::int64_t output_tokens = 0;
};

trace_totals totals(const std::vector<synth_request>& requests) {
  trace_totals t;
  t.requests = requests.size();
  for (const auto& r : requests) {
    t.input_tokens += static_cast<std::int64_t>(r.input.size());
    t.output_tokens += static_cast<std::int64_t>(r.output.size());
  }
  return t;
}

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-2 test vectors") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces to exercise the block buffering.
  hybridcache::test::sha256 h;
  const std::string chunk(997, 'a');
  std::size_t fed = 0;
  while (fed + chunk.size() <= 1'000'000) {
    h.update(chunk);
    fed += chunk.size();
  }
  h.update(std::string(1'000'000 - fed, 'a'));
  CHECK(h.hex_digest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("python_float_repr follows CPython's repr") {
  CHECK(python_float_repr(0.0) == "0.0");
  CHECK(python_float_repr(-0.0) == "-0.0");
  CHECK(python_float_repr(1.0) == "1.0");
  CHECK(python_float_repr(62345 / 1000.0) == "62.345");
  CHECK(python_float_repr(102373 / 1000.0) == "102.373");
  CHECK(python_float_repr(1 / 1000.0) == "0.001");
  CHECK(python_float_repr(0.1 + 0.2) == "0.30000000000000004");
  CHECK(python_float_repr(1e-4) == "0.0001");
  CHECK(python_float_repr(1.5e-5) == "1.5e-05");
  CHECK(python_float_repr(1e16) == "1e+16");
  CHECK(python_float_repr(1234567890123456.0) == "1234567890123456.0");
  CHECK(python_float_repr(1.2345e22) == "1.2345e+22");
  CHECK(python_float_repr(-2.5e-300) == "-2.5e-300");
  CHECK(python_float_repr(5e-324) == "5e-324");
  CHECK(python_float_repr(1.7976931348623157e308) == "1.7976931348623157e+308");
  CHECK(python_float_repr(100.0) == "100.0");
  CHECK(python_float_repr(123456.789) == "123456.789");
}

TEST_CASE("splitmix64 produces the reference sequence") {
  // Reference values: splitmix64 seeded with 0 (Vigna's splitmix64.c).
  splitmix64 rng(0);
  CHECK(rng.next() == 0xE220A8397B1DCDAFULL);
  CHECK(rng.next() == 0x6E789E6AA1B965F4ULL);
  CHECK(rng.next() == 0x06C45D188009454FULL);
  splitmix64 a(7), b(7);
  for (int i = 0; i < 1000; ++i) {
    const auto x = a.uniform(3, 31999);
    CHECK(x == 3 + static_cast<std::int64_t>(b.next() % 31997));
    CHECK(x >= 3);
    CHECK(x <= 31999);
  }
}

TEST_CASE("synth-v1 chat seed 7 is byte-identical to gen_trace.py (shared fixture)") {
  const auto requests = generate_synth_v1({.profile = synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000});
  const trace_totals t = totals(requests);
  CHECK(t.requests == 70);
  CHECK(t.input_tokens == 227'356);
  CHECK(t.output_tokens == 25'509);
  const std::string jsonl = synth_v1_jsonl(requests);
  CHECK(sha256_hex(jsonl) == "ff4a8743d6f4a64ea09e197f77c0f69587133b7e2a39e6a5d1fd8c8665562d26");

  // The golden input lengths of anchors/marconi.md 1(i), in file order (first and last few).
  CHECK(requests.front().input.size() == 814);
  CHECK(requests[1].input.size() == 1000);
  CHECK(requests[2].input.size() == 754);
  CHECK(requests.back().input.size() == 8282);

  // Structure: sorted by (ts, session, turn); each turn's prompt extends the previous
  // prompt + output of the same session.
  for (std::size_t i = 1; i < requests.size(); ++i) CHECK(requests[i - 1].ts_ms <= requests[i].ts_ms);
  for (const auto& r : requests) {
    if (r.turn_id == 0) continue;
    const synth_request* prev = nullptr;
    for (const auto& q : requests)
      if (q.session_id == r.session_id && q.turn_id == r.turn_id - 1) prev = &q;
    REQUIRE(prev != nullptr);
    REQUIRE(r.input.size() > prev->input.size() + prev->output.size());
    CHECK(std::equal(prev->input.begin(), prev->input.end(), r.input.begin()));
    CHECK(std::equal(prev->output.begin(), prev->output.end(), r.input.begin() + static_cast<std::ptrdiff_t>(prev->input.size())));
  }
}

TEST_CASE("synth-v1 chat seed 7 equals the fixture file in shared/" * doctest::test_suite("shared_data")) {
  const auto path = hybridcache::test::shared_path("fixtures/marconi/chat_seed7.jsonl");
  if (!hybridcache::test::shared_available(path)) return;
  const auto requests = generate_synth_v1({.profile = synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000});
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream file;
  file << in.rdbuf();
  CHECK(file.str() == synth_v1_jsonl(requests));
}

TEST_CASE("synth-v1 writer streams the same bytes and the source yields the same requests") {
  const auto requests = generate_synth_v1({.profile = synth_profile::agent, .seed = 3, .sessions = 4, .session_gap_ms = 500});
  std::ostringstream out;
  write_synth_v1_jsonl(out, requests);
  CHECK(out.str() == synth_v1_jsonl(requests));
  synth_v1_source source(requests);
  request r;
  std::size_t n = 0;
  while (source.next(r)) {
    const synth_request& s = requests[n++];
    CHECK(r.arrival_s == static_cast<double>(s.ts_ms) / 1000.0);
    CHECK(r.session_id == s.session_id);
    CHECK(r.turn_id == s.turn_id);
    CHECK(r.input == s.input);
    CHECK(r.output == s.output);
    CHECK(r.input_tokens == static_cast<std::int64_t>(s.input.size()));
    CHECK(r.has_ids());
  }
  CHECK(n == requests.size());
  // Every agent session starts with the one shared 1,200-token prompt.
  for (const auto& s : requests) {
    CHECK(s.input.size() >= 1200);
    CHECK(std::equal(s.input.begin(), s.input.begin() + 1200, requests.front().input.begin()));
  }
}

TEST_CASE("synth-v1 Marconi equivalence traces match gen_trace.py (anchors/marconi.md 1(i))") {
  SUBCASE("chat, seed 1, 100 sessions, gap 2000 ms") {
    const auto requests = generate_synth_v1({.profile = synth_profile::chat, .seed = 1, .sessions = 100, .session_gap_ms = 2000});
    const trace_totals t = totals(requests);
    CHECK(t.requests == 692);
    CHECK(t.input_tokens == 2'468'524);
    CHECK(t.output_tokens == 270'380);
    CHECK(sha256_hex(synth_v1_jsonl(requests)) == "7b4032549f6acae41c2c47be16da300d15e8cc58ac5f140592b0f2be588f6a60");
  }
  SUBCASE("agent, seed 2, 100 sessions, gap 4000 ms") {
    const auto requests = generate_synth_v1({.profile = synth_profile::agent, .seed = 2, .sessions = 100, .session_gap_ms = 4000});
    const trace_totals t = totals(requests);
    CHECK(t.requests == 570);
    CHECK(t.input_tokens == 2'627'196);
    CHECK(t.output_tokens == 81'823);
    CHECK(sha256_hex(synth_v1_jsonl(requests)) == "42a4596f3d4a631c326f7bc38ba93f6ea5df06b3a559fd508778b02982c428ab");
  }
}

TEST_CASE("synth-v1 rejects bad arguments") {
  CHECK_THROWS_AS((void)generate_synth_v1({.sessions = -1}), invalid_argument);
  CHECK_THROWS_AS((void)generate_synth_v1({.session_gap_ms = -5}), invalid_argument);
  CHECK_THROWS_AS((void)generate_synth_v1({.sessions = 1000, .session_gap_ms = std::int64_t{1} << 60}), invalid_argument);
  CHECK_THROWS_AS((void)parse_synth_profile("chatty"), invalid_argument);
  CHECK(parse_synth_profile("agent") == synth_profile::agent);
  CHECK(generate_synth_v1({.sessions = 0}).empty());
}
