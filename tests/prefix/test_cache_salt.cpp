// Isolation between tenants (issue #13, item 7): requests with different cache salts never
// share a node, a page or a lower-tier entry; no salt is the shared namespace.
//
// The reference model: one independent cache per salt. With room for everything (no
// eviction), a salted cache must answer every request exactly as that salt's own cache
// does: the same reusable tokens and common prefix, whatever the other tenants sent. With
// eviction, no hit may exceed what the same salt committed before (a cross-salt hit would:
// every tenant sends the same conversations).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "hybridcache/stores/pool_state_store.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;

namespace {

/// Branching conversations shared by every tenant: request r extends a random earlier
/// request's sequence (or starts from one of a few system prompts) by a random turn.
struct conversation_source {
  std::mt19937 rng;
  std::vector<std::vector<token_id>> seen;
  explicit conversation_source(std::uint32_t seed) : rng(seed) {
    for (int s = 0; s < 3; ++s) {
      std::vector<token_id> sys(40 + rng() % 40);
      for (auto& t : sys) t = static_cast<token_id>(rng() % 1000);
      seen.push_back(std::move(sys));
    }
  }
  std::vector<token_id> next() {
    std::vector<token_id> v = seen[rng() % seen.size()];
    if (rng() % 4 == 0 && v.size() > 10) v.resize(v.size() - rng() % (v.size() / 2));  // a branch
    const std::size_t turn = 5 + rng() % 60;
    for (std::size_t i = 0; i < turn; ++i) v.push_back(static_cast<token_id>(rng() % 1000));
    seen.push_back(v);
    return v;
  }
};

const cache_salt salts[] = {std::nullopt, cache_salt{0}, cache_salt{1}, make_cache_salt("tenant-b")};
constexpr int n_salts = 4;

std::int64_t common(const std::vector<token_id>& a, const std::vector<token_id>& b) {
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return static_cast<std::int64_t>(i);
}

template <class Scorer>
Scorer make_scorer(const cost_model& m) {
  if constexpr (std::is_same_v<Scorer, lru_scorer>) return lru_scorer{};
  else return flop_aware_scorer(m, {.alpha = 1.0});
}

}  // namespace

TEST_CASE_TEMPLATE("a salted cache answers each tenant exactly as the tenant's own cache", Scorer, lru_scorer,
                   flop_aware_scorer) {
  const cost_model m(presets::marconi_7b());
  using cache_t = prefix_cache<cost_model, judicious_admission, Scorer, counting_store>;
  const auto store = [&] { return counting_store(1'000'000'000'000, m.kv_bytes_per_token(), m.ssm_checkpoint_bytes()); };
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    cache_t shared(m, store(), make_scorer<Scorer>(m));
    std::vector<std::unique_ptr<cache_t>> own;
    for (int i = 0; i < n_salts; ++i) own.push_back(std::make_unique<cache_t>(m, store(), make_scorer<Scorer>(m)));
    conversation_source src(seed);
    std::mt19937 pick(seed * 7);
    std::int64_t hits = 0;
    for (int r = 0; r < 300; ++r) {
      const int t = static_cast<int>(pick() % n_salts);
      const auto seq = src.next();
      const auto input = std::span<const token_id>(seq).first(seq.size() - 3);
      auto a = shared.match(input, salts[t]);
      auto b = own[t]->match(input);
      REQUIRE(a);
      REQUIRE(b);
      CHECK(a->reusable_tokens == b->reusable_tokens);
      CHECK(a->common_prefix == b->common_prefix);
      CHECK(a->salt == salts[t]);
      hits += a->hit() ? 1 : 0;
      REQUIRE(shared.commit(seq, static_cast<std::int64_t>(input.size()), &*a));
      REQUIRE(own[t]->commit(seq, static_cast<std::int64_t>(input.size()), &*b));
    }
    CHECK(hits > 50);  // same-salt hits still happen
    std::int64_t tokens = 0;
    for (auto& c : own) tokens += c->tokens_cached();
    CHECK(shared.tokens_cached() == tokens);  // nothing shared: every tenant holds its own copy
    CHECK(shared.tree().salted_namespaces() == 3);
  }
}

TEST_CASE_TEMPLATE("under eviction no hit exceeds what the same salt committed", Scorer, lru_scorer, flop_aware_scorer) {
  const cost_model m(presets::marconi_7b());
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  prefix_cache<cost_model, judicious_admission, Scorer, counting_store> c(m, counting_store(3000 * kv + 12 * ck, kv, ck),
                                                          make_scorer<Scorer>(m));
  conversation_source src(11);
  std::mt19937 pick(5);
  std::map<int, std::vector<std::vector<token_id>>> committed;
  std::int64_t hits = 0, evictions = 0;
  for (int r = 0; r < 600; ++r) {
    const int t = static_cast<int>(pick() % n_salts);
    const auto seq = src.next();
    const auto input = std::span<const token_id>(seq).first(seq.size() - 3);
    const std::vector<token_id> in(input.begin(), input.end());
    auto a = c.match(input, salts[t]);
    REQUIRE(a);
    std::int64_t bound = 0;
    for (const auto& s : committed[t]) bound = std::max(bound, common(s, in));
    CHECK(a->common_prefix <= bound);
    CHECK(a->reusable_tokens <= bound);
    hits += a->hit() ? 1 : 0;
    auto res = c.commit(seq, static_cast<std::int64_t>(input.size()), &*a);
    if (!res) {
      REQUIRE(c.release(*a));
      continue;
    }
    evictions += res->evictions;
    committed[t].push_back(seq);
  }
  CHECK(hits > 30);
  CHECK(evictions > 100);
  // A tenant whose last node went gives its namespace up: the table holds only live ones.
  c.clear();
  CHECK(c.tree().salted_namespaces() == 0);
  CHECK(c.tokens_cached() == 0);
}

TEST_CASE("a commit names its namespace once: a match of one salt cannot commit into another") {
  const cost_model m(presets::marconi_7b());
  prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> c(
      m, counting_store(1'000'000'000, m.kv_bytes_per_token(), m.ssm_checkpoint_bytes()), lru_scorer{});
  const std::vector<token_id> a(50, 7);
  auto ma = c.match(a, cache_salt{1});
  REQUIRE(ma);
  const auto before = c.tokens_cached();
  const auto r = c.commit(a, 50, &*ma, {}, cache_salt{2});
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::invalid_argument);
  CHECK(c.tokens_cached() == before);
  REQUIRE(c.commit(a, 50, &*ma, {}, cache_salt{1}));  // the pin is still held: the same salt may commit
  // Without a match, the salt argument names the namespace.
  REQUIRE(c.commit(a, 50, nullptr, {}, cache_salt{3}));
  CHECK(c.match(a, cache_salt{3})->common_prefix == 50);
  CHECK(c.match(a, cache_salt{4})->common_prefix == 0);
  CHECK(c.match(a)->common_prefix == 0);
  CHECK(c.tree().salted_namespaces() == 2);
  CHECK(make_cache_salt("x") != make_cache_salt("y"));
  CHECK(make_cache_salt("x") == make_cache_salt("x"));
}

TEST_CASE("the lifecycle keeps tenants apart: no page, node or hit crosses a salt") {
  using namespace hybridcache::memory;
  const cost_model m(presets::jamba_1_5_mini());
  using pool_t = host_asymmetric_pool<no_rebalancer>;
  using store_t = pool_state_store<pool_t>;
  using cache_t = prefix_cache<cost_model, judicious_admission, lru_scorer, store_t>;
  pool_t pool({.capacity_bytes = std::uint64_t{512} << 20, .kv_page_bytes = kv_page_bytes(m),
               .ssm_block_bytes = checkpoint_block_bytes(m)});
  cache_t c(m, store_t(pool, 16, m.attention_layers(), m.recurrent_layers()), lru_scorer{});
  request_lifecycle<cache_t> requests(c);
  conversation_source src(3);
  std::mt19937 pick(9);
  std::map<int, std::vector<std::vector<token_id>>> committed;
  std::int64_t hits = 0;
  for (int r = 0; r < 200; ++r) {
    const int t = static_cast<int>(pick() % n_salts);
    const auto seq = src.next();
    const auto prompt = std::span<const token_id>(seq).first(seq.size() - 3);
    auto tk = requests.begin(prompt, {.output_tokens = 3, .salt = salts[t]});
    if (!tk) continue;
    const auto& st = **requests.state(*tk);
    std::int64_t bound = 0;
    const std::vector<token_id> in(prompt.begin(), prompt.end());
    for (const auto& s : committed[t]) bound = std::max(bound, common(s, in));
    CHECK(st.match.reusable_tokens <= bound);
    hits += st.match.hit() ? 1 : 0;
    std::vector<std::int64_t> captured;
    for (const auto& site : st.plan.sites) captured.push_back(site.position);
    captured.push_back(static_cast<std::int64_t>(seq.size()));
    std::sort(captured.begin(), captured.end());
    captured.erase(std::unique(captured.begin(), captured.end()), captured.end());
    auto f = requests.finish(*tk, seq, captured);
    REQUIRE(f);
    committed[t].push_back(seq);
  }
  CHECK(hits > 20);
  c.clear();
  CHECK(pool.live_handles() == 0);
}
