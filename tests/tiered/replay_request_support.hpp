// Test support for the tiered replay tests (test_replay.cpp, test_hit_tiers.cpp): one trace
// request of block ids (512 tokens each unless told), 100 output tokens.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "hybridcache/sim/trace.hpp"

namespace hybridcache::test::tiered_replay {

inline constexpr std::int64_t B = 512;

inline sim::request make(double t_s, std::vector<sim::token_id> ids, std::int64_t tokens, std::int32_t per_id = B) {
  sim::request r;
  r.arrival_s = t_s;
  r.input = std::move(ids);
  r.input_tokens = tokens;
  r.output_tokens = 100;
  r.tokens_per_id = per_id;
  return r;
}

}  // namespace hybridcache::test::tiered_replay
