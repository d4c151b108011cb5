// Concurrent match/commit/release on one cache with `mutex_lock` (CI runs this suite
// under ThreadSanitizer: ctest label `concurrency`).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/counting_store.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;

TEST_SUITE("concurrency") {
  TEST_CASE("mutex_lock: threads matching, committing and releasing stay consistent") {
    const cost_model m(presets::marconi_7b());
    const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
    prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store, mutex_lock> c(
        m, counting_store(24 * ck + 400 * kv, kv, ck), flop_aware_scorer(m, {.alpha = 0.5}));
    constexpr int threads = 4, ops = 400;
    std::atomic<std::int64_t> hits{0}, commits{0}, refused{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
        std::vector<token_id> sys = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
        for (int i = 0; i < ops; ++i) {
          std::vector<token_id> s = sys;
          s.resize(static_cast<std::size_t>(rng() % 12 + 1));
          const int extra = static_cast<int>(rng() % 30 + 1);
          for (int k = 0; k < extra; ++k) s.push_back(static_cast<token_id>(rng() % 3 + 20));
          const auto in = std::max<std::int64_t>(1, static_cast<std::int64_t>(s.size()) - static_cast<std::int64_t>(rng() % 4));
          const std::vector<token_id> input(s.begin(), s.begin() + in);
          auto mr = c.match(input);
          REQUIRE(mr);
          if (mr->hit()) hits.fetch_add(1);
          if (rng() % 4 == 0) {
            REQUIRE(c.release(*mr));
          } else {
            auto cr = c.commit(s, in, &*mr);
            if (cr) {
              commits.fetch_add(1);
            } else {
              // Refused up front: the continuation does not fit beside the paths other
              // threads hold pinned and the prefix it extends. Nothing changed; the
              // match is still pinned and is released here.
              REQUIRE(cr.error() == errc::out_of_capacity);
              REQUIRE(c.release(*mr));
              refused.fetch_add(1);
            }
          }
        }
      });
    }
    for (auto& th : pool) th.join();
    CHECK(c.counters().matches == threads * ops);
    CHECK(c.counters().commits == commits.load());
    CHECK(c.counters().hits == hits.load());
    CHECK(hits.load() > 0);
    CHECK(commits.load() > 10 * refused.load());
    CHECK(c.store().used_bytes() <= c.store().capacity_bytes());
    CHECK(c.store().used_bytes() == c.store().kv_bytes(c.tokens_cached()) + c.checkpoints_cached() * ck);
    // Every pin was released: nothing remains pinned.
    bool pinned = false;
    c.tree().preorder([&](node_id n) { pinned = pinned || c.tree().at(n).pins != 0; });
    CHECK(!pinned);
  }
}
