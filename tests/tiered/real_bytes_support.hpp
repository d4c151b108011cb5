// Test support for the real-bytes validation mode (test_real_bytes.cpp, and the Redis case
// in tests/backends/test_redis_backend.cpp): a small conversation trace and the options.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/tiered_replay_options.hpp"
#include "hybridcache/tiered/tier.hpp"

namespace hybridcache::test::real_bytes {

/// Multi-turn conversations of 512-token ids: each turn extends one session's prompt.
inline std::vector<sim::request> sessions(int count, int turns, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<sim::token_id>> hist(static_cast<std::size_t>(count));
  sim::token_id next_id = 0;
  std::vector<sim::request> out;
  for (int k = 0; k < count * turns; ++k) {
    auto& h = hist[rng() % static_cast<std::size_t>(count)];
    for (int a = 0, n = 1 + static_cast<int>(rng() % 4); a < n; ++a) h.push_back(next_id++);
    sim::request r;
    r.arrival_s = 0.4 * k;
    r.input = h;
    r.input_tokens = static_cast<std::int64_t>(h.size()) * 512;
    r.output_tokens = 100;
    r.tokens_per_id = 512;
    out.push_back(std::move(r));
  }
  return out;
}

/// One prefill engine over `spec`, every lower-tier hit loaded.
inline sim::tiered_replay_options options(const std::string& spec) {
  sim::tiered_replay_options o;
  o.tiers = tiered::parse_tiers(spec, 1);
  o.prefill_engines = 1;
  return o;
}

}  // namespace hybridcache::test::real_bytes
