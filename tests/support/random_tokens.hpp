// Random token ids for prefix-cache tests: n ids in [0, 50000) from a seeded mt19937, so a
// test's sequences are the same on every run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "hybridcache/concepts/ids.hpp"

namespace hybridcache::test {

inline std::vector<token_id> random_tokens(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<token_id> v(n);
  for (auto& t : v) t = static_cast<token_id>(rng() % 50000);
  return v;
}

}  // namespace hybridcache::test
