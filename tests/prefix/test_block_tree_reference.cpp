// block_tree_reference: the Marconi reference simulator's vLLM+ block tree
// (radix_cache_vllm.py @ 08016617). Unit tests of its rules on tiny trees, and its rows on
// synth-v1 traces (marconi_7b, match(input) then insert(input ++ output) per request),
// checked against the reference run side by side (docs/replay.md).
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "hybridcache/core/presets.hpp"
#include "hybridcache/prefix/block_tree_reference.hpp"
#include "hybridcache/sim/synth_v1.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;

namespace {

using tokens = std::vector<token_id>;

// Blocks of 4 ids; a node costs 10 (state) + its ids (KV 1 B per id).
block_tree_reference small_tree(std::int64_t capacity, std::int64_t block = 4) {
  return block_tree_reference(
      {.block_ids = block, .capacity_bytes = capacity, .kv_bytes_per_id = 1, .recurrent_layers = 2, .state_bytes_per_layer = 5});
}

std::int64_t skipped(block_tree_reference& t, const tokens& in) { return t.match(in).reusable_tokens; }

tokens node_tokens(const block_tree_reference& t, node_id n) {
  const auto s = t.tokens(n);
  return {s.begin(), s.end()};
}

std::vector<std::int64_t> replay(block_tree_reference& t, const std::vector<sim::synth_request>& trace) {
  std::vector<std::int64_t> out;
  out.reserve(trace.size());
  for (const auto& r : trace) {
    const match_result m = t.match(r.input);
    out.push_back(m.reusable_tokens);
    tokens seq = r.input;
    seq.insert(seq.end(), r.output.begin(), r.output.end());
    t.commit(seq, static_cast<std::int64_t>(r.input.size()), m);
  }
  return out;
}

// FNV-1a over the row's values (little-endian int64 bytes).
std::uint64_t row_hash(const std::vector<std::int64_t>& row) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int64_t v : row)
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<std::uint64_t>(v) >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  return h;
}

}  // namespace

TEST_CASE("block tree: a partial last block is filled in place and moves last among its siblings") {
  auto t = small_tree(1'000'000);
  t.insert(tokens{1, 2, 3});  // root -> [1 2 3] (partial)
  t.insert(tokens{1, 2});     // [1 2 3] agrees on 2 only: a new partial child [1 2]
  REQUIRE(t.children(t.root()).size() == 2);
  CHECK(node_tokens(t, t.children(t.root())[0]) == tokens{1, 2, 3});
  CHECK(node_tokens(t, t.children(t.root())[1]) == tokens{1, 2});
  CHECK(t.stored_ids() == 5);
  // Lookup: no full block agrees; the first child (in child order) agreeing entirely ends it.
  CHECK(skipped(t, {1, 2, 3, 9}) == 3);
  CHECK(skipped(t, {1, 2, 7, 9}) == 2);
  // [1 2] agrees entirely and nothing agrees longer: it is filled up to [1 2 5 6], moves
  // last, and the rest goes below it.
  t.insert(tokens{1, 2, 5, 6, 7});
  REQUIRE(t.children(t.root()).size() == 2);
  CHECK(node_tokens(t, t.children(t.root())[0]) == tokens{1, 2, 3});
  const node_id filled = t.children(t.root())[1];
  CHECK(node_tokens(t, filled) == tokens{1, 2, 5, 6});
  REQUIRE(t.children(filled).size() == 1);
  CHECK(node_tokens(t, t.children(filled)[0]) == tokens{7});
  CHECK(t.node_count() == 3);
  CHECK(t.stored_ids() == 8);
  CHECK(t.used_bytes() == 3 * 10 + 8);
  CHECK(skipped(t, {1, 2, 5, 6, 7, 8}) == 5);
  CHECK(skipped(t, {1, 2, 5, 6, 8}) == 4);
}

TEST_CASE("block tree: a partly shared block is stored twice; the lookup needs whole blocks") {
  auto t = small_tree(1'000'000);
  t.insert(tokens{1, 2, 3, 4, 5, 6, 7, 8});
  t.insert(tokens{1, 2, 9, 9, 5});
  REQUIRE(t.children(t.root()).size() == 2);  // [1 2 3 4] and a duplicate-prefix [1 2 9 9]
  CHECK(t.stored_ids() == 13);
  CHECK(t.node_count() == 4);
  CHECK(skipped(t, {1, 2, 3, 4, 5, 6, 7, 8, 1}) == 8);
  CHECK(skipped(t, {1, 2, 3, 4, 5, 6, 7}) == 4);  // [5 6 7 8] is a full block: 3 ids agreeing are not enough
  CHECK(skipped(t, {1, 2, 9, 9, 5, 0}) == 5);
  CHECK(skipped(t, {1, 2}) == 0);
  // Re-inserting a cached sequence adds nothing.
  t.insert(tokens{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(t.stored_ids() == 13);
}

TEST_CASE("block tree: the estimate counts the root as a block, so the cache overshoots, then LRU evicts") {
  // Blocks of 2 ids; each node 12 B; capacity 36 B = three nodes.
  auto t = small_tree(36, 2);
  t.insert(tokens{1, 2});  // ticks 1-2 (insert, estimate walk): A stamped 2
  t.insert(tokens{3, 4});  // B: 4
  t.insert(tokens{5, 6});  // C: 6
  CHECK(t.used_bytes() == 36);
  CHECK(skipped(t, {1, 2, 0}) == 2);  // tick 7: A (a full block entered) stamped 7
  CHECK(t.last_access(t.children(t.root())[0]) == 7);
  // Estimate for [7 8]: 2 - 2·(0 + root) = 0 new ids -> no eviction; inserted anyway.
  t.insert(tokens{7, 8});
  CHECK(t.used_bytes() == 48);
  CHECK(t.counters().evictions == 0);
  // Next insert: 48 + 0 > 36 -> evict 12 B: the least recently used leaf, B.
  t.insert(tokens{9, 10});
  CHECK(t.counters().evictions == 1);
  CHECK(t.counters().checkpoints_evicted == 1);
  CHECK(t.used_bytes() == 48);
  CHECK(skipped(t, {3, 4}) == 0);
  CHECK(skipped(t, {1, 2}) == 2);
  CHECK(skipped(t, {5, 6}) == 2);
  CHECK(skipped(t, {7, 8}) == 2);
  CHECK(skipped(t, {9, 10}) == 2);
}

TEST_CASE("block tree: a parent whose last child goes is a candidate in the same round") {
  // Blocks of 2 ids, 12 B per node, capacity 12 B (one node).
  auto u = small_tree(12, 2);
  // Estimate 6 - 2 = 4 ids, 2 states: 24 B > 12 -> an eviction round on the empty tree pops
  // the root and ends; the chain of three nodes is inserted anyway (36 B).
  u.insert(tokens{1, 2, 3, 4, 5, 6});
  CHECK(u.used_bytes() == 36);
  CHECK(u.node_count() == 3);
  // [7 8]: estimate 0; used 36 > 12 -> evict 24 B: leaf [5 6], then its parent [3 4] (pushed when it became a leaf).
  u.insert(tokens{7, 8});
  CHECK(u.counters().checkpoints_evicted == 2);
  CHECK(skipped(u, {1, 2, 3, 4}) == 2);
  CHECK(skipped(u, {7, 8}) == 2);
  CHECK(u.node_count() == 2);
}

TEST_CASE("block tree: bad input throws and leaves the tree unchanged") {
  CHECK_THROWS_AS(small_tree(100, 0), invalid_argument);
  CHECK_THROWS_AS(block_tree_reference({.block_ids = 4, .capacity_bytes = -1}), invalid_argument);
  auto t = small_tree(1'000);
  t.insert(tokens{1, 2, 3});
  const auto before = t.used_bytes();
  const auto ticks = t.now();
  const tokens seq{1, 2, 3, 4};
  CHECK_THROWS_AS(t.commit(seq, 5, match_result{}), invalid_argument);
  CHECK(t.used_bytes() == before);
  CHECK(t.now() == ticks);
  CHECK(t.stored_ids() == 3);
}

TEST_CASE("block tree on the fixture (chat, seed 7, 12 sessions, 5e8 B) reproduces the reference vLLM+ row") {
  const auto trace = sim::generate_synth_v1(
      {.profile = sim::synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000});
  const cost_model m(presets::marconi_7b());
  auto t = block_tree_reference::from_costs(m, 500'000'000);
  const std::vector<std::int64_t> reference_row = {
      0, 0, 672, 0, 0, 736, 0, 0, 0, 736, 0, 0, 0, 0, 0, 0, 0, 0, 0, 672, 0, 736, 0, 0, 0, 0, 0, 0,
      0, 0, 0, 0, 672, 0, 0, 2788, 736, 0, 3317, 0, 0, 736, 0, 0, 0, 0, 0, 0, 4913, 0, 0, 0, 0, 0, 0, 672,
      672, 672, 0, 0, 0, 0, 0, 0, 0, 672, 0, 0, 0, 8161};
  const auto row = replay(t, trace);
  CHECK(row == reference_row);
  CHECK(std::accumulate(row.begin(), row.end(), std::int64_t{0}) == 27563);  // 12.1233 % of 227,356
}

TEST_CASE("block tree on chat seed 1 (100 sessions, 692 requests, 5e9 B) reproduces the reference row") {
  // Verified against radix_cache_vllm.py run side by side (docs/replay.md): every request equal.
  const auto trace = sim::generate_synth_v1(
      {.profile = sim::synth_profile::chat, .seed = 1, .sessions = 100, .session_gap_ms = 2000});
  REQUIRE(trace.size() == 692);
  const cost_model m(presets::marconi_7b());
  auto t = block_tree_reference::from_costs(m, 5'000'000'000);
  const auto row = replay(t, trace);
  CHECK(std::accumulate(row.begin(), row.end(), std::int64_t{0}) == 172331);  // 6.9811 % of 2,468,524
  CHECK(row_hash(row) == 4714765332734285891ull);  // the reference's per-request row, hashed
}
