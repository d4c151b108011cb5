// The liveness property of the request lifecycle (issue #31), as one randomized run any
// store's test can drive: see random_run.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "hybridcache/prefix/lifecycle.hpp"
#include "random_tokens.hpp"

namespace hybridcache::test::liveness {

using prefix::begin_options;
using prefix::request_ticket;
using hybridcache::token_id;

struct run_counts {
  int admitted = 0, refused_never = 0, waited = 0, fallbacks = 0, host_loads = 0;
};

/// One random run: multi-turn conversations that continue and branch, `max_in_flight`
/// requests at once. `make_rig()` builds a cache and its lifecycle (`->requests`), the same
/// each time: one for the run, and one empty oracle per request. Every begin the oracle
/// admits must succeed (at once with nothing in flight, else once the others end).
template <class MakeRig>
run_counts random_run(std::uint32_t seed, int max_in_flight, MakeRig make_rig) {
  auto real_rig = make_rig();
  auto& real = *real_rig;
  std::mt19937 rng(seed);
  std::vector<std::vector<token_id>> done;
  struct live {
    request_ticket t;
    std::vector<token_id> seq;
  };
  std::deque<live> flying;
  run_counts out;
  auto end_one = [&](std::size_t i) {
    live l = std::move(flying[i]);
    flying.erase(flying.begin() + static_cast<std::ptrdiff_t>(i));
    if (rng() % 8 == 0) {
      REQUIRE(real.requests.abort(l.t));
      return;
    }
    const auto* s = *real.requests.state(l.t);
    std::vector<std::int64_t> captured;
    for (const auto& site : s->plan.sites) captured.push_back(site.position);
    captured.push_back(static_cast<std::int64_t>(l.seq.size()));
    std::sort(captured.begin(), captured.end());
    captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
    auto f = real.requests.finish(l.t, l.seq, captured);
    REQUIRE_MESSAGE(f, f.message());
    done.push_back(std::move(l.seq));
  };
  for (int step = 0; step < 400; ++step) {
    std::vector<token_id> prompt;
    if (!done.empty() && rng() % 5 != 0) {
      const auto& base = done[done.size() - 1 - rng() % std::min<std::size_t>(done.size(), 10)];
      prompt.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % base.size()));
    }
    const auto suffix = test::random_tokens(8 + rng() % 90, static_cast<std::uint32_t>(rng()));
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    const std::int64_t output = 1 + static_cast<std::int64_t>(rng() % 24);
    const begin_options opts{.output_tokens = output};
    bool oracle_admits = false;
    {
      auto empty = make_rig();
      auto t = empty->requests.begin(prompt, opts);
      oracle_admits = t.has_value();
      if (!t) REQUIRE(t.error() == errc::out_of_capacity);
    }
    auto t = real.requests.begin(prompt, opts);
    if (!t) {
      INFO("step " << step << ", " << flying.size() << " in flight: " << t.message());
      REQUIRE(t.error() == errc::out_of_capacity);
      if (!oracle_admits) {
        ++out.refused_never;
        continue;
      }
      REQUIRE_MESSAGE(!flying.empty(), "refused with nothing in flight although an empty cache admits it");
      ++out.waited;
      while (!flying.empty()) end_one(0);  // the requests in flight end
      t = real.requests.begin(prompt, opts);
      REQUIRE_MESSAGE(t, "refused after every request in flight ended: " << t.message());
    } else {
      CHECK(oracle_admits);  // the real cache never admits what no empty cache could hold
    }
    ++out.admitted;
    const auto* s = *real.requests.state(*t);
    out.host_loads += s->loaded_at > 0 ? 1 : 0;
    REQUIRE(real.requests.wait_loaded(*t));  // a hit loaded below HBM lands before prefill
    auto seq = prompt;
    const auto tail = test::random_tokens(static_cast<std::size_t>(rng() % (output + 1)), static_cast<std::uint32_t>(rng()));
    seq.insert(seq.end(), tail.begin(), tail.end());
    flying.push_back({*t, std::move(seq)});
    while (static_cast<int>(flying.size()) >= max_in_flight || (!flying.empty() && rng() % 3 == 0))
      end_one(rng() % flying.size());
  }
  while (!flying.empty()) end_one(0);
  return out;
}

}  // namespace hybridcache::test::liveness
