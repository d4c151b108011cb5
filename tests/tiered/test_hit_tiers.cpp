// Hits split per tier (issue #34 item 2): a lower-tier hit counts each KV entry's tokens under
// the tier its copy is read from (`tiered_hit::tier_tokens`), and the tiered replay adds them to
// `hit_tokens_by_tier` by tier. Before, a hit that read some entries from host and some from
// disk counted all its lower-tier tokens under the slowest tier it read from (disk).
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/sim/tiered_replay.hpp"
#include "hybridcache/stores/tiered_state_store.hpp"
#include "hybridcache/tiered/tier.hpp"

#include "replay_request_support.hpp"

using namespace hybridcache;
using namespace hybridcache::sim;

namespace {

using test::tiered_replay::B;
using test::tiered_replay::make;

tiered_replay_result replay(const std::vector<sim::request>& reqs, const cost_model& m, const char* spec,
                            bool recompute_when_faster = false) {
  tiered_replay_options o;
  o.tiers = tiered::parse_tiers(spec, 1);
  o.prefill_engines = 1;
  o.keep_per_request = true;
  o.recompute_when_faster = recompute_when_faster;
  return run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{}, flop_prefill_time(m));
}

std::int64_t sum(const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); }

// The checks every run passes: per row, its tiers sum to its hits and nothing is read from a
// tier deeper than its source_tier (the deepest one it reads from);
// the rows recounted by tier give the result's hit_tokens_by_tier, which sums to every hit.
void check_split(const tiered_replay_result& r) {
  std::vector<std::int64_t> recount(r.hit_tokens_by_tier.size(), 0);
  for (const auto& row : r.per_request) {
    if (row.refused) continue;
    CHECK(sum(row.hit_tokens_by_tier) == row.hbm_hit_tokens + row.host_hit_tokens);
    REQUIRE(row.hit_tokens_by_tier.size() <= recount.size());
    CHECK(row.hit_tokens_by_tier[0] >= row.hbm_hit_tokens);
    std::size_t deepest = 0;
    for (std::size_t t = 0; t < row.hit_tokens_by_tier.size(); ++t) {
      CHECK(row.hit_tokens_by_tier[t] >= 0);
      recount[t] += row.hit_tokens_by_tier[t];
      if (t > 0 && row.hit_tokens_by_tier[t] > 0) deepest = t;
    }
    CHECK(deepest <= row.source_tier);  // (the checkpoint may come from deeper than any KV)
  }
  CHECK(recount == r.hit_tokens_by_tier);
  CHECK(sum(r.hit_tokens_by_tier) == r.hbm_hit_tokens + r.host_hit_tokens);
}

}  // namespace

TEST_CASE("hit tiers: a hit that reads one entry from host and one from disk counts each under its tier") {
  // Conversation 1 (2 blocks, then extended to 4) is pushed out of HBM by three others; its
  // entries go to a small host tier, from which the older ones cascade to disk. Extended
  // again, it reads blocks [0, 2) from one lower tier and [2, 4) from the other: 2 x 512
  // tokens under each (before: all 4 x 512 under disk, the slowest).
  const cost_model m(presets::jamba_1_5_mini());
  std::vector<sim::request> reqs{make(0, {1, 2}, 2 * B),           make(1, {1, 2, 3, 4}, 4 * B),
                                 make(2, {11, 12, 13, 14}, 4 * B), make(3, {21, 22, 23, 24}, 4 * B),
                                 make(4, {31, 32, 33, 34}, 4 * B), make(5, {1, 2, 3, 4, 5}, 5 * B)};
  // (HBM holds about two of the 4-block conversations with the staging room; host one of
  // conversation 1's two entries with its checkpoint, and the entries of two others.)
  const auto r = replay(reqs, m, "hbm=200MB,host=80MB,disk@/unused=10GB:gbps=2:lat_us=50");
  REQUIRE(r.per_request.size() == reqs.size());
  const auto& last = r.per_request.back();
  MESSAGE("last request: hbm " << last.hbm_hit_tokens << ", below " << last.host_hit_tokens << ", source tier "
                               << last.source_tier << ", by tier " << last.hit_tokens_by_tier[0] << " / "
                               << last.hit_tokens_by_tier[1] << " / " << last.hit_tokens_by_tier[2]);
  CHECK(r.cascades > 0);
  CHECK(last.hbm_hit_tokens == 0);
  CHECK(last.host_hit_tokens == 4 * B);
  CHECK(last.source_tier == 2);
  CHECK(last.hit_tokens_by_tier == std::vector<std::int64_t>{0, 2 * B, 2 * B});
  // The run's totals: the HBM hits of the others, and this hit split over host and disk.
  REQUIRE(r.hit_tokens_by_tier.size() == 3);
  CHECK(r.hit_tokens_by_tier[1] == 2 * B);
  CHECK(r.hit_tokens_by_tier[2] == 2 * B);
  CHECK(r.hit_tokens_by_tier[0] == r.hbm_hit_tokens);
  check_split(r);
}

TEST_CASE("hit tiers: the store's split sums to the hit and names only tiers it reads from") {
  // A store of HBM, a small host tier and a disk tier, a hit read from both lower tiers; then
  // the same hit shortened (a model without recurrent layers: no checkpoint).
  const cost_model m(presets::jamba_1_5_mini());
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  const std::int64_t hbm = 1000 * kv + 3 * ck;
  using store_t = stores::tiered_state_store<>;
  const stores::tiered_state_store_config cfg{
      .capacity_bytes = hbm,
      .kv_bytes_per_token = kv,
      .checkpoint_bytes = ck,
      .lower_tiers = {{.kind = tiered::tier_kind::host, .capacity_bytes = 550 * kv + 2 * ck},
                      {.kind = tiered::tier_kind::disk, .capacity_bytes = 64 * hbm, .location = "/unused"}}};
  prefix::prefix_cache<cost_model, prefix::judicious_admission, prefix::lru_scorer, store_t> c(m, store_t(cfg),
                                                                                               prefix::lru_scorer{});
  auto seq_of = [](token_id base, int n) {
    std::vector<token_id> s(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) s[static_cast<std::size_t>(i)] = base + i;
    return s;
  };
  auto run = [&](const std::vector<token_id>& seq, std::int64_t input) {
    const std::span<const token_id> in(seq.data(), static_cast<std::size_t>(input));
    auto mt = c.match(in);
    REQUIRE(mt);
    const stores::tiered_hit h = c.store().lookup(in, *mt);
    CHECK(stores::tier_token_sum(h) == h.host_tokens);
    REQUIRE(c.commit(seq, input, &*mt));
    c.store().settle(c.tree(), seq, h);
    const std::string bad = c.store().check_invariants(c.tree());
    REQUIRE_MESSAGE(bad.empty(), bad);
    return h;
  };
  auto a = seq_of(1'000'000, 500);
  (void)run(a, 500);  // a's first turn: 500 tokens
  auto a2 = a;
  for (int i = 0; i < 500; ++i) a2.push_back(2'000'000 + i);
  (void)run(a2, 1000);  // extended to 1,000: two entries, [0, 500) and [500, 1000)
  (void)run(seq_of(3'000'000, 1000), 1000);  // evicts a: one entry fits on host, the other cascades
  (void)run(seq_of(4'000'000, 1000), 1000);
  auto a3 = a2;
  for (int i = 0; i < 50; ++i) a3.push_back(5'000'000 + i);
  const auto h = run(a3, 1050);
  MESSAGE("hit: hbm " << h.hbm_tokens << ", below " << h.host_tokens << ", source tier " << int(h.source_tier.value)
                      << ", by tier " << h.tier_tokens[0] << " / " << h.tier_tokens[1] << " / " << h.tier_tokens[2]
                      << ", end tier " << int(h.end_tier.value) << ", cascades " << c.store().counters().cascades);
  CHECK(c.store().counters().cascades > 0);
  CHECK(h.hbm_tokens == 0);
  CHECK(h.host_tokens == 1000);
  CHECK(h.source_tier == tier_id{2});
  CHECK(h.tier_tokens[1] == 500);
  CHECK(h.tier_tokens[2] == 500);
  CHECK(h.tokens_from(tier_id{0}) == 0);
  CHECK(h.tokens_from(tier_id{3}) == 0);
}

TEST_CASE("hit tiers: over random runs, the tiers sum to every hit and match a recount of the rows") {
  // Random multi-turn conversations over hbm + host + disk (+ redis), token ids and 512-token
  // ids, with and without reload-or-recompute (which shortens hits of a model without
  // recurrent layers): the per-tier split always sums to the hits.
  std::mt19937_64 rng(34);
  const cost_model jamba(presets::jamba_1_5_mini()), llama(presets::llama2_7b());
  const char* specs[] = {"hbm=160MB,host=60MB,disk@/unused=400MB:gbps=2:lat_us=50",
                         "hbm=200MB,host=100MB,disk@/unused=200MB:gbps=4:lat_us=20,redis@h:1=4GB:gbps=1:lat_us=300",
                         "hbm=300MB,host=2GB"};
  std::int64_t below = 0, multi = 0;
  for (int run = 0; run < 12; ++run) {
    const bool tokens = run % 2 == 0;
    const std::int32_t per_id = tokens ? 1 : static_cast<std::int32_t>(B);
    std::vector<std::vector<sim::token_id>> hist(6);
    std::vector<sim::request> reqs;
    sim::token_id next = 1;
    for (int k = 0; k < 60; ++k) {
      auto& h = hist[rng() % hist.size()];
      const int add = tokens ? 50 + static_cast<int>(rng() % 600) : 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < add; ++i) h.push_back(next++);
      // A last block shorter than the others now and then (ids x 512 clamped to the tokens).
      const std::int64_t n = static_cast<std::int64_t>(h.size()) * per_id - (tokens ? 0 : static_cast<std::int64_t>(rng() % 300));
      reqs.push_back(make(0.3 * k, h, n, per_id));
    }
    const cost_model& m = run % 3 == 0 ? llama : jamba;
    const auto r = replay(reqs, m, specs[run % 3], run % 4 >= 2);
    CAPTURE(run);
    check_split(r);
    below += r.host_hit_tokens;
    for (const auto& row : r.per_request) {
      std::size_t used = 0;
      for (std::size_t t = 1; t < row.hit_tokens_by_tier.size(); ++t) used += row.hit_tokens_by_tier[t] > 0 ? 1 : 0;
      multi += used > 1 ? 1 : 0;
    }
  }
  MESSAGE(below << " tokens hit below HBM; " << multi << " hits read from more than one lower tier");
  CHECK(below > 0);
  CHECK(multi > 0);
}

TEST_CASE("hit tiers: a store of eight tiers splits exactly down to the last; a ninth tier is refused") {
  // One conversation, then sixteen others that push it down through HBM, the host tier and
  // five small disk tiers to the eighth tier; then the conversation continues and reads its
  // prefix from deep down. Before, tiers 7 and deeper shared one slot of `tier_tokens` (a
  // store took up to 255 tiers); now every tier has its own and a longer list is refused.
  const cost_model m(presets::jamba_1_5_mini());
  std::vector<sim::request> reqs{make(0, {1, 2}, 2 * B)};
  for (int other = 1; other <= 16; ++other) {
    const token_id base = 1000 * other;
    reqs.push_back(make(other, {base, base + 1}, 2 * B));
  }
  reqs.push_back(make(17, {1, 2, 3}, 3 * B));
  std::string spec = "hbm=200MB,host=50MB";
  for (int d = 1; d <= 5; ++d) spec += ",disk@/unused" + std::to_string(d) + "=50MB:gbps=2:lat_us=50";
  const auto r = replay(reqs, m, (spec + ",disk@/unused6=10GB:gbps=1:lat_us=80").c_str());
  REQUIRE(r.hit_tokens_by_tier.size() == 8);
  const auto& last = r.per_request.back();
  std::string split;
  for (const auto n : last.hit_tokens_by_tier) split += " " + std::to_string(n);
  MESSAGE("last request: below HBM " << last.host_hit_tokens << ", source tier " << last.source_tier << ", by tier"
                                     << split << "; cascades " << r.cascades);
  CHECK(r.cascades > 0);
  CHECK(last.host_hit_tokens == 2 * B);  // its whole first turn, from the eighth tier
  CHECK(last.source_tier == 7);
  CHECK(last.hit_tokens_by_tier == std::vector<std::int64_t>{0, 0, 0, 0, 0, 0, 0, 2 * B});
  check_split(r);
  // Nine tiers: refused with the limit in the message.
  CHECK_THROWS_WITH_AS(replay(reqs, m, (spec + ",disk@/unused6=50MB,disk@/unused7=10GB").c_str()),
                       doctest::Contains("at most 8"), invalid_argument);
}
