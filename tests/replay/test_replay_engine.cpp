// The replay engine against a scripted fake cache: call order, pinning under concurrency,
// token accounting for block-granular ids, and the counters it copies.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <hybridcache/model/presets.hpp>
#include <hybridcache/sim/replay.hpp>

using namespace hybridcache;

namespace {

// Remembers every committed sequence; a match reuses the longest committed sequence that is
// a prefix of the input (whole sequences only, like a tree whose checkpoints sit at leaves).
// Logs every call so tests can check the engine's order.
struct fake_cache {
  std::vector<std::vector<sim::token_id>> committed;
  std::vector<std::string> log;
  std::int64_t pinned = 0, max_pinned = 0, used = 0;

  match_result match(std::span<const sim::token_id> in) {
    match_result m;
    m.input_tokens = static_cast<std::int64_t>(in.size());
    for (const auto& s : committed)
      if (s.size() <= in.size() && std::equal(s.begin(), s.end(), in.begin()))
        m.reusable_tokens = std::max<std::int64_t>(m.reusable_tokens, static_cast<std::int64_t>(s.size()));
    m.node = m.reusable_tokens > 0 ? 1 : no_node;
    ++pinned;
    max_pinned = std::max(max_pinned, pinned);
    log.push_back("match " + std::to_string(in.size()));
    return m;
  }
  void commit(std::span<const sim::token_id> seq, std::int64_t input_ids, const match_result&) {
    --pinned;  // commit hands the match's pin back first
    committed.emplace_back(seq.begin(), seq.end());
    used += static_cast<std::int64_t>(seq.size());
    log.push_back("commit " + std::to_string(seq.size()) + "/" + std::to_string(input_ids));
  }
  prefix::cache_counters counters() const {
    prefix::cache_counters c;
    c.checkpoints_admitted = static_cast<std::int64_t>(committed.size());
    c.evictions = 3;
    c.kv_bytes_admitted = used * 10;
    return c;
  }
  double alpha() const { return 0.5; }
  std::int64_t used_bytes() const { return used; }
};
static_assert(sim::replayable_cache<fake_cache>);

sim::request req(std::vector<sim::token_id> in, std::vector<sim::token_id> out, std::int32_t per_id = 1,
                 std::int64_t input_tokens = -1) {
  sim::request r;
  r.input = std::move(in);
  r.output = std::move(out);
  r.tokens_per_id = per_id;
  r.input_tokens = input_tokens >= 0 ? input_tokens : static_cast<std::int64_t>(r.input.size()) * per_id;
  r.output_tokens = static_cast<std::int64_t>(r.output.size()) * per_id;
  return r;
}

}  // namespace

TEST_CASE("replay: single stream matches, records, then commits input ++ output (handing the pin back)") {
  const std::vector<sim::request> reqs{req({5, 6, 7}, {8, 9}), req({5, 6, 7, 8, 9, 10}, {11}), req({1, 2}, {3})};
  const sim::replay_trace trace(reqs);
  CHECK(trace.size() == 3);
  CHECK(trace.input_tokens() == 11);
  CHECK(std::vector<sim::token_id>(trace.sequence(1).begin(), trace.sequence(1).end()) ==
        std::vector<sim::token_id>{5, 6, 7, 8, 9, 10, 11});
  fake_cache cache;
  const auto m = sim::replay(cache, trace, cost_model(presets::marconi_7b()));
  CHECK(cache.log == std::vector<std::string>{"match 3", "commit 5/3", "match 6", "commit 7/6", "match 2", "commit 3/2"});
  CHECK(cache.max_pinned == 1);
  CHECK(m.requests == 3);
  CHECK(m.input_tokens == 11);
  CHECK(m.skipped_tokens == 5);  // request 2 reuses input ++ output of request 1
  CHECK(m.hit_requests == 1);
  CHECK(m.token_hit_rate == doctest::Approx(5.0 / 11.0));
  CHECK(m.cache.checkpoints_admitted == 3);
  CHECK(m.cache.evictions == 3);
  CHECK(m.cache.kv_bytes_admitted == 150);
  CHECK(m.cache.alpha == 0.5);
  CHECK(m.cache.peak_bytes == 15);
  CHECK(m.wall_seconds >= 0.0);
}

TEST_CASE("replay: with concurrency N a request finishes when N more have arrived, pinned until then") {
  // Turn 2 of a conversation arrives while turn 1 is still running: it cannot reuse turn 1.
  const std::vector<sim::request> reqs{req({1, 2, 3}, {4}), req({1, 2, 3, 4, 5}, {6}), req({1, 2, 3, 4, 5, 6, 7}, {8})};
  const sim::replay_trace trace(reqs);
  fake_cache serial, batched;
  const auto a = sim::replay(serial, trace, cost_model(presets::marconi_7b()));
  const auto b = sim::replay(batched, trace, cost_model(presets::marconi_7b()), {.concurrency = 2});
  CHECK(a.skipped_tokens == 4 + 6);
  CHECK(b.skipped_tokens == 4);  // request 3 sees request 1 only (request 2 still running)
  CHECK(batched.max_pinned == 2);
  CHECK(batched.pinned == 0);  // every match released at the end
  CHECK(batched.log ==
        std::vector<std::string>{"match 3", "match 5", "commit 4/3", "match 7", "commit 6/5", "commit 8/7"});
  fake_cache bad;
  CHECK_THROWS_AS((void)sim::replay(bad, trace, cost_model(presets::marconi_7b()), {.concurrency = 0}),
                  invalid_argument);
  CHECK(bad.log.empty());
}

TEST_CASE("replay: block-granular ids count real tokens, a partial last block is not over-counted") {
  // Two 512-token-id requests: 3 ids = 1200 real tokens (last block partial), then a
  // request that extends it. The second reuses 3 ids = 1536 tokens, capped at its length.
  const std::vector<sim::request> reqs{req({10, 11, 12}, {-1}, 512, 1200), req({10, 11, 12, -1}, {-2}, 512, 1400)};
  const sim::replay_trace trace(reqs);
  fake_cache cache;
  const auto m = sim::replay(cache, trace, cost_model(presets::marconi_7b()));
  CHECK(m.input_tokens == 2600);
  CHECK(m.skipped_tokens == 1400);  // min(4 ids · 512, 1400)
}

TEST_CASE("replay_trace rejects length-only requests") {
  sim::request r;
  r.input_tokens = 100;
  r.source_line = 7;
  const std::vector<sim::request> reqs{r};
  CHECK_THROWS_AS(sim::replay_trace{reqs}, invalid_argument);
}

TEST_CASE("replay: progress is reported at the end") {
  const std::vector<sim::request> reqs{req({1}, {2})};
  const sim::replay_trace trace(reqs);
  fake_cache cache;
  std::vector<std::pair<std::size_t, std::size_t>> calls;
  (void)sim::replay(cache, trace, cost_model(presets::marconi_7b()), {}, marconi_reference_ttft{},
                    [&](std::size_t d, std::size_t t) { calls.emplace_back(d, t); });
  CHECK(calls == std::vector<std::pair<std::size_t, std::size_t>>{{1, 1}});
}

TEST_CASE("replay_trace::read_all streams a source; a rejected request leaves the trace unchanged") {
  struct two_then_bad {
    int n = 0;
    bool next(sim::request& r) {
      r = n < 2 ? req({n + 1, n + 2}, {n + 3}) : sim::request{};
      if (n >= 2) r.input_tokens = 5;  // a length-only request: no ids
      return n++ < 3;
    }
  };
  static_assert(sim::request_source<two_then_bad>);
  two_then_bad src;
  CHECK_THROWS_AS((void)sim::replay_trace::read_all(src), invalid_argument);
  sim::replay_trace t;
  t.append(req({1, 2}, {3}));
  sim::request bad;
  bad.input_tokens = 4;
  CHECK_THROWS_AS(t.append(bad), invalid_argument);
  CHECK(t.size() == 1);
  CHECK(std::vector<sim::token_id>(t.sequence(0).begin(), t.sequence(0).end()) == std::vector<sim::token_id>{1, 2, 3});
  struct three {
    int n = 0;
    bool next(sim::request& r) {
      r = req({n, n + 1}, {n + 2});
      return n++ < 3;
    }
  };
  three ok;
  const auto all = sim::replay_trace::read_all(ok);
  CHECK(all.size() == 3);
  CHECK(all.input_tokens() == 6);
  CHECK(all.input(2)[0] == 2);
}
