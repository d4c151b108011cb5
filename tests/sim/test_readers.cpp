// Trace readers on small fixtures written here (good and malformed lines), and the
// infinite-cache bound on the real Mooncake trace (skipped when the file is absent).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <hybridcache/sim/marconi_trace.hpp>
#include <hybridcache/sim/mooncake_trace.hpp>
#include <hybridcache/sim/sharegpt_trace.hpp>
#include <hybridcache/sim/synth_v1.hpp>
#include <hybridcache/sim/trace_stats.hpp>

#include "../support/shared_data.hpp"

using namespace hybridcache;
using namespace hybridcache::sim;

namespace {

// Reads the whole text with reader type R; returns the format_error it raised.
template <class R, class... Options>
format_error read_error(const std::string& text, Options... options) {
  std::istringstream in(text);
  R reader(in, options...);
  request r;
  try {
    while (reader.next(r)) {
    }
  } catch (const format_error& e) {
    return e;
  }
  FAIL("no format_error for:\n" << text);
  return format_error(0, "", "");
}

const std::string marconi_line_0 =
    R"({"session_id": 0, "turn_id": 0, "ts": 0.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 6, 7], "output_tokens": [8, 9]})";
const std::string marconi_line_1 =
    R"({"turn_id": 1, "session_id": 0, "ts": 62.345, "extra": {"ignored": [1, "x"]}, "num_input_tokens": 6, "num_output_tokens": 0, "input_tokens": [5, 6, 7, 8, 9, 10], "output_tokens": []})";

// The concept accepts exactly `bool next(request&)`.
struct returns_int {
  int next(request&);
};
struct takes_const {
  bool next(const request&) const;
};
struct no_next {};
static_assert(!request_source<returns_int>);
static_assert(!request_source<no_next>);
static_assert(request_source<takes_const>);  // binding request& to const request& is fine
static_assert(request_source<marconi_reader> && request_source<mooncake_reader> && request_source<synth_v1_source>);

}  // namespace

TEST_CASE("marconi reader: fields, key order, unknown keys, blank lines") {
  std::istringstream in(marconi_line_0 + "\n\n" + marconi_line_1 + "\r\n");
  marconi_reader reader(in);
  request r;
  REQUIRE(reader.next(r));
  CHECK(r.session_id == 0);
  CHECK(r.turn_id == 0);
  CHECK(r.arrival_s == 0.0);
  CHECK(r.input == std::vector<token_id>{5, 6, 7});
  CHECK(r.output == std::vector<token_id>{8, 9});
  CHECK(r.input_tokens == 3);
  CHECK(r.output_tokens == 2);
  CHECK(r.tokens_per_id == 1);
  CHECK(r.source_line == 1);
  REQUIRE(reader.next(r));
  CHECK(r.turn_id == 1);
  CHECK(r.arrival_s == 62.345);
  CHECK(r.input.size() == 6);
  CHECK(r.output.empty());
  CHECK(r.source_line == 3);
  CHECK_FALSE(reader.next(r));
}

TEST_CASE("marconi reader: malformed lines name line and field") {
  const std::string ok = marconi_line_0 + "\n";
  struct bad_case {
    std::string line;
    const char* field;
  };
  const bad_case cases[] = {
      {R"({"session_id": 0, "turn_id": 0, "ts": 1.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 6, 7], "output_tokens": [8, 9])", ""},  // no '}'
      {R"({"session_id": 0, "turn_id": 0, "ts": 1.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 6, 7]})", "output_tokens"},
      {R"({"session_id": 0, "turn_id": 0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 6, 7], "output_tokens": [8, 9]})", "ts"},
      {R"({"session_id": "zero", "turn_id": 0, "ts": 1.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 6, 7], "output_tokens": [8, 9]})", "session_id"},
      {R"({"session_id": 0, "turn_id": 0, "ts": 1.0, "num_input_tokens": 4, "num_output_tokens": 2, "input_tokens": [5, 6, 7], "output_tokens": [8, 9]})", "num_input_tokens"},
      {R"({"session_id": 0, "turn_id": 0, "ts": 1.0, "num_input_tokens": 3, "num_output_tokens": 1, "input_tokens": [5, 6, 7], "output_tokens": [8, 9]})", "num_output_tokens"},
      {R"({"session_id": 0, "turn_id": 0, "ts": 1.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 3000000000, 7], "output_tokens": [8, 9]})", "input_tokens"},
      {R"({"session_id": 0, "turn_id": 0, "ts": 1.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 6.5, 7], "output_tokens": [8, 9]})", "input_tokens"},
      {R"({"session_id": 0, "turn_id": 0, "ts": 1.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": "5 6 7", "output_tokens": [8, 9]})", "input_tokens"},
      {R"({"session_id": 0, "turn_id": 0, "ts": -1.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 6, 7], "output_tokens": [8, 9]})", "ts"},
      {R"({"session_id": 0, "session_id": 1, "turn_id": 0, "ts": 1.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 6, 7], "output_tokens": [8, 9]})", "session_id"},
      {R"([1, 2, 3])", ""},
      {R"({"session_id": 0, "turn_id": 0, "ts": 1.0, "num_input_tokens": 3, "num_output_tokens": 2, "input_tokens": [5, 6, 7], "output_tokens": [8, 9]} trailing)", ""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.line);
    const format_error e = read_error<marconi_reader>(ok + "\n" + c.line + "\n" + ok);
    CHECK(e.line() == 3);  // line 2 is blank
    CHECK(e.field() == c.field);
  }
  // Time going backwards is an error on the later line.
  const std::string later = R"({"session_id": 0, "turn_id": 0, "ts": 5.0, "num_input_tokens": 0, "num_output_tokens": 0, "input_tokens": [], "output_tokens": []})";
  const format_error e = read_error<marconi_reader>(later + "\n" + ok);
  CHECK(e.line() == 2);
  CHECK(e.field() == "ts");
}

TEST_CASE("marconi reader reads back the synth-v1 JSONL exactly") {
  const auto generated = generate_synth_v1({.profile = synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000});
  std::istringstream in(synth_v1_jsonl(generated));
  marconi_reader reader(in);
  synth_v1_source source(generated);
  request a, b;
  std::size_t n = 0;
  while (reader.next(a)) {
    REQUIRE(source.next(b));
    CHECK(a.arrival_s == b.arrival_s);
    CHECK(a.session_id == b.session_id);
    CHECK(a.turn_id == b.turn_id);
    CHECK(a.input == b.input);
    CHECK(a.output == b.output);
    ++n;
  }
  CHECK_FALSE(source.next(b));
  CHECK(n == 70);
}

TEST_CASE("mooncake reader: block expansion keeps prefixes equal and distinct ids distinct") {
  const std::string text =
      "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 40, \"hash_ids\": [0, 1, 2]}\n"
      "{\"timestamp\": 27, \"input_length\": 2048, \"output_length\": 1, \"hash_ids\": [0, 1, 2, 3]}\n"
      "{\"timestamp\": 27, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [4]}\n";
  SUBCASE("B = 512: ids as in the file") {
    std::istringstream in(text);
    mooncake_reader reader(in);
    request r;
    REQUIRE(reader.next(r));
    CHECK(r.input == std::vector<token_id>{0, 1, 2});
    CHECK(r.output == std::vector<token_id>{-1});
    CHECK(r.input_tokens == 1100);
    CHECK(r.output_tokens == 40);
    CHECK(r.tokens_per_id == 512);
    CHECK(r.arrival_s == 0.0);
    REQUIRE(reader.next(r));
    CHECK(r.input == std::vector<token_id>{0, 1, 2, 3});
    CHECK(r.output == std::vector<token_id>{-2});
    CHECK(r.arrival_s == 0.027);
    REQUIRE(reader.next(r));
    CHECK(r.output.empty());
    CHECK_FALSE(reader.next(r));
  }
  SUBCASE("B = 16: 32 children per id, the partial last block truncated") {
    std::istringstream in(text);
    mooncake_reader reader(in, {.block_size = 16});
    request first, second, third;
    REQUIRE(reader.next(first));
    REQUIRE(reader.next(second));
    REQUIRE(reader.next(third));
    CHECK(first.input.size() == 69);  // ceil(1100 / 16)
    CHECK(second.input.size() == 128);
    CHECK(first.output.size() == 3);  // ceil(40 / 16)
    CHECK(first.tokens_per_id == 16);
    // The first request's ids are a prefix of the second's (same parents 0, 1, 2).
    CHECK(std::equal(first.input.begin(), first.input.end(), second.input.begin()));
    CHECK(second.input[0] == 0);
    CHECK(second.input[31] == 31);
    CHECK(second.input[32] == 32);   // parent 1, child 0
    CHECK(second.input[127] == 127); // parent 3, child 31
    CHECK(third.input.front() == 128);
    // Children of different parents never coincide.
    std::vector<token_id> all(second.input);
    all.insert(all.end(), third.input.begin(), third.input.end());
    std::sort(all.begin(), all.end());
    CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  }
  SUBCASE("no synthesized output ids") {
    std::istringstream in(text);
    mooncake_reader reader(in, {.block_size = 512, .synthesize_output_ids = false});
    request r;
    REQUIRE(reader.next(r));
    CHECK(r.output.empty());
    CHECK(r.output_tokens == 40);
  }
  CHECK_THROWS_AS(mooncake_reader(*std::make_unique<std::istringstream>(text), {.block_size = 48}), invalid_argument);
  CHECK_THROWS_AS(mooncake_reader(*std::make_unique<std::istringstream>(text), {.block_size = 0}), invalid_argument);
}

TEST_CASE("mooncake reader: malformed lines name line and field") {
  const std::string ok = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [0, 1]}\n";
  struct bad_case {
    std::string line;
    const char* field;
  };
  const bad_case cases[] = {
      {R"({"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [0]})", "hash_ids"},        // count mismatch
      {R"({"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [0, 1, 2]})", "hash_ids"},  // count mismatch
      {R"({"timestamp": 5, "input_length": 600, "hash_ids": [0, 1]})", "output_length"},                    // missing
      {R"({"timestamp": "5", "input_length": 600, "output_length": 4, "hash_ids": [0, 1]})", "timestamp"},  // wrong type
      {R"({"timestamp": 5, "input_length": -600, "output_length": 4, "hash_ids": [0, 1]})", "input_length"},
      {R"({"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [0, -1]})", "hash_ids"},
      {R"({"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]})" "x", ""},
      {R"({"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": [0, 1)", "hash_ids"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.line);
    const format_error e = read_error<mooncake_reader>(ok + ok + c.line + "\n" + ok);
    CHECK(e.line() == 3);
    CHECK(e.field() == c.field);
  }
  const std::string huge = "{\"timestamp\": 0, \"input_length\": 16, \"output_length\": 0, \"hash_ids\": [100000000]}\n";
  CHECK(read_error<mooncake_reader>(huge, mooncake_options{.block_size = 16}).field() == "hash_ids");
  const std::string backwards = "{\"timestamp\": 9, \"input_length\": 0, \"output_length\": 0, \"hash_ids\": []}\n" + ok;
  CHECK(read_error<mooncake_reader>(backwards).field() == "timestamp");
}

TEST_CASE("infinite-cache bound against a naive model") {
  // Naive: keep every inserted sequence; a hit is the longest common prefix with any.
  const auto generated = generate_synth_v1({.profile = synth_profile::chat, .seed = 11, .sessions = 8, .session_gap_ms = 3000});
  std::vector<std::vector<token_id>> inserted;
  std::int64_t naive_hits = 0, total = 0;
  for (const auto& s : generated) {
    std::size_t best = 0;
    for (const auto& seq : inserted) {
      std::size_t m = 0;
      while (m < seq.size() && m < s.input.size() && seq[m] == s.input[m]) ++m;
      best = std::max(best, m);
    }
    naive_hits += static_cast<std::int64_t>(best);
    total += static_cast<std::int64_t>(s.input.size());
    std::vector<token_id> seq(s.input);
    seq.insert(seq.end(), s.output.begin(), s.output.end());
    inserted.push_back(std::move(seq));
  }
  synth_v1_source source(generated);
  const infinite_cache_result result = infinite_cache_bound(source);
  CHECK(result.requests == static_cast<std::int64_t>(generated.size()));
  CHECK(result.input_ids == total);
  CHECK(result.hit_ids == naive_hits);
  CHECK(result.hit_tokens == naive_hits);
  CHECK(naive_hits > 0);

  // Inserting the input only loses the hits that reach into earlier outputs.
  synth_v1_source again(generated);
  const infinite_cache_result input_only = infinite_cache_bound(again, {.insert_output = false});
  CHECK(input_only.hit_ids < result.hit_ids);
}

TEST_CASE("Mooncake conversation trace: infinite-cache bound is 36.64 % of blocks" * doctest::test_suite("shared_data")) {
  const std::filesystem::path path = hybridcache::test::shared_path("data/traces/mooncake/conversation_trace.jsonl");
  if (!hybridcache::test::shared_available(path)) return;
  mooncake_reader reader(path);
  const auto start = std::chrono::steady_clock::now();
  const infinite_cache_result b512 = infinite_cache_bound(reader);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("Mooncake parse + bound (B=512): " << seconds << " s");
  CHECK(b512.requests == 12'031);
  CHECK(b512.input_ids == 288'500);
  CHECK(b512.hit_ids == 105'710);  // = total - unique (182,790)
  CHECK(b512.id_hit_rate() == doctest::Approx(0.3664).epsilon(0.0005));
  CHECK(b512.input_tokens == 144'793'823);
  CHECK(b512.hit_tokens == 54'098'411);

  mooncake_reader reader16(path, {.block_size = 16});
  const infinite_cache_result b16 = infinite_cache_bound(reader16);
  CHECK(b16.input_ids == 9'055'233);
  CHECK(b16.hit_ids == 3'381'208);
}

TEST_CASE("marconi writer: any id trace round-trips through Marconi JSONL") {
  SUBCASE("ShareGPT-built requests") {
    const std::string text =
        R"({"conversations": [{"from": "human", "value": "one two"}, {"from": "gpt", "value": "x"}, {"from": "human", "value": "three four five"}, {"from": "gpt", "value": "y"}]})"
        "\n"
        R"({"conversations": [{"from": "human", "value": "\u4e2d\u6587"}, {"from": "gpt", "value": "ok"}]})"
        "\n";
    std::istringstream a(text), b(text);
    sharegpt_reader source(a, {.sessions_per_second = 0.3}), again(b, {.sessions_per_second = 0.3});
    std::ostringstream jsonl;
    CHECK(write_marconi_jsonl(jsonl, source) == 3);
    std::istringstream in(jsonl.str());
    marconi_reader reader(in);
    const auto original = collect(again);
    const auto read_back = collect(reader);
    REQUIRE(read_back.size() == original.size());
    for (std::size_t i = 0; i < original.size(); ++i) {
      CHECK(read_back[i].arrival_s == original[i].arrival_s);  // Python repr round-trips exactly
      CHECK(read_back[i].session_id == original[i].session_id);
      CHECK(read_back[i].turn_id == original[i].turn_id);
      CHECK(read_back[i].input == original[i].input);
      CHECK(read_back[i].output == original[i].output);
    }
  }
  SUBCASE("synth-v1 requests give the generator's exact bytes") {
    const auto generated = generate_synth_v1({.profile = synth_profile::agent, .seed = 5, .sessions = 3, .session_gap_ms = 1500});
    synth_v1_source source(generated);
    std::ostringstream jsonl;
    (void)write_marconi_jsonl(jsonl, source);
    CHECK(jsonl.str() == synth_v1_jsonl(generated));
  }
  SUBCASE("Mooncake requests keep their negative output ids") {
    std::istringstream in("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 700, \"hash_ids\": [0, 1]}\n");
    mooncake_reader source(in);
    std::ostringstream jsonl;
    (void)write_marconi_jsonl(jsonl, source);
    std::istringstream back(jsonl.str());
    marconi_reader reader(back);
    request r;
    REQUIRE(reader.next(r));
    CHECK(r.input == std::vector<token_id>{0, 1});
    CHECK(r.output == std::vector<token_id>{-1, -2});
  }
  request lengths_only;
  lengths_only.input_tokens = 10;
  std::string out;
  CHECK_THROWS_AS(append_marconi_jsonl(out, lengths_only), invalid_argument);
}

TEST_CASE("summarize_trace: counts, lengths, span, sessions") {
  const auto generated = generate_synth_v1({.profile = synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000});
  synth_v1_source source(generated);
  const trace_summary s = summarize_trace(source);
  CHECK(s.requests == 70);
  CHECK(s.input_tokens == 227'356);
  CHECK(s.output_tokens == 25'509);
  CHECK(s.max_input_tokens == 8'282);  // the last request of the fixture is the longest
  CHECK(s.sessions <= 12);
  std::int64_t max_output = 0;
  for (const auto& r : generated) max_output = std::max<std::int64_t>(max_output, static_cast<std::int64_t>(r.output.size()));
  CHECK(s.max_output_tokens == max_output);
  CHECK(s.first_arrival_s == 0.0);
  CHECK(s.last_arrival_s == static_cast<double>(generated.back().ts_ms) / 1000.0);
  CHECK(s.has_ids);
  CHECK(s.mean_input_tokens() == doctest::Approx(227'356.0 / 70));

  std::istringstream in("{\"timestamp\": 1000, \"input_length\": 600, \"output_length\": 7, \"hash_ids\": [0, 1]}\n"
                        "{\"timestamp\": 4000, \"input_length\": 100, \"output_length\": 9, \"hash_ids\": [0]}\n");
  mooncake_reader mooncake(in);
  const trace_summary m = summarize_trace(mooncake);
  CHECK(m.requests == 2);
  CHECK(m.sessions == 0);
  CHECK(m.duration_s() == 3.0);
  CHECK(m.max_output_tokens == 9);
  std::istringstream empty("");
  marconi_reader none(empty);
  CHECK(summarize_trace(none).mean_input_tokens() == 0.0);
}
