// CaR's score-based replacement (tiered/car_score.hpp): the board's arithmetic and victim
// order against a naive reference (a list of nodes with scores, pick the minimum) on random
// event sequences, a hand-made sequence whose victims differ from LRU's, the scorer over the
// real radix tree, and the replay's `demotion car` (issue #38 item 1).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/radix_tree.hpp"
#include "hybridcache/sim/tiered_replay.hpp"
#include "hybridcache/tiered/car_score.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

static_assert(utility_scorer<car_scorer, prefix::radix_tree<state_store_archetype>>);

namespace {

// The reference: every node in a plain list with its score, last access, candidacy and
// generation; the victim is found by scanning for the minimum (score, access, id); each
// request keeps the list of what it gave.
struct naive_board {
  struct row {
    double score = 0;
    std::uint64_t access = 0;
    bool candidate = false;
    std::uint32_t gen = 0;
  };
  struct credit {
    node_id n;
    std::uint32_t gen;
    double amount;
  };
  std::vector<row> rows;
  std::map<std::uint64_t, std::vector<credit>> ledger;

  explicit naive_board(std::size_t n) : rows(n) {}
  node_id top() const {
    node_id best = no_node;
    for (node_id n = 0; n < rows.size(); ++n) {
      if (!rows[n].candidate) continue;
      if (best == no_node) {
        best = n;
        continue;
      }
      const row &a = rows[n], &b = rows[best];
      if (a.score < b.score || (a.score == b.score && (a.access < b.access || (a.access == b.access && n < best))))
        best = n;
    }
    return best;
  }
  void give(std::uint64_t r, const std::vector<node_id>& path, double amount) {
    for (const node_id n : path) {
      ledger[r].push_back({n, rows[n].gen, amount});
      rows[n].score += amount;
    }
  }
  void adopt(std::uint64_t r, const std::vector<node_id>& path) {
    std::vector<node_id> fresh;
    for (const node_id n : path) {
      bool given = false;
      if (ledger.count(r))
        for (const auto& c : ledger[r]) given = given || (c.n == n && c.gen == rows[n].gen);
      if (!given) fresh.push_back(n);
    }
    give(r, fresh, car_score::enter_window + car_score::dispatch);
  }
  void complete(std::uint64_t r) {
    const auto it = ledger.find(r);
    if (it == ledger.end()) return;
    for (const auto& c : it->second)
      if (rows[c.n].gen == c.gen) rows[c.n].score -= c.amount;
    ledger.erase(it);
  }
  void forget(node_id n) {
    rows[n] = {0, 0, false, rows[n].gen + 1};
  }
};

}  // namespace

TEST_CASE("car score: the paper's events on a node: +1 window, +1 dispatch, -2 done") {
  car_score_board b;
  b.reserve(4);
  const std::vector<node_id> path{1, 2};
  b.enter_window(7, path);
  CHECK(b.score(1) == 1.0);
  b.dispatch(7, path);
  CHECK(b.score(1) == 2.0);
  CHECK(b.score(2) == 2.0);
  CHECK(b.requests_in_flight() == 1);
  const std::vector<node_id> made{1, 2, 3};  // its insert made node 3 (its output)
  b.adopt(7, made);
  CHECK(b.score(1) == 2.0);  // already credited: unchanged
  CHECK(b.score(3) == 2.0);  // its own node scores as the ones it reuses
  b.complete(7);  // -2 on each node credited at both events (or adopted)
  CHECK(b.score(1) == 0.0);
  CHECK(b.score(2) == 0.0);
  CHECK(b.score(3) == 0.0);
  CHECK(b.requests_in_flight() == 0);
  b.complete(7);  // unknown now: nothing
  CHECK(b.score(1) == 0.0);
  CHECK_THROWS_AS((void)car_score_board({.enter_window = -1.0}), invalid_argument);
}

TEST_CASE("car score: a hand-made sequence evicts in a different order from LRU") {
  // Three leaves touched at 1, 2, 3. LRU would take 1, 2, 3. A request that will reuse node
  // 1 enters the window: CaR takes 2, 3 and only then 1. Once that request has been sent
  // and its generation completed, node 1 is idle again and the oldest: first again.
  car_score_board b;
  b.reserve(4);
  for (node_id n = 1; n <= 3; ++n) b.index(n, n);
  CHECK(b.top() == 1);  // what LRU takes
  const std::vector<node_id> uses{1};
  b.enter_window(42, uses);
  std::vector<node_id> order;
  car_score_board copy = b;
  while (copy.top() != no_node) {
    order.push_back(copy.top());
    copy.unindex(copy.top());
  }
  CHECK(order == std::vector<node_id>{2, 3, 1});
  b.dispatch(42, uses);
  CHECK(b.top() == 2);
  b.complete(42);
  CHECK(b.top() == 1);
  // Equal scores and equal access times: the lower node id.
  car_score_board t;
  t.reserve(8);
  t.index(5, 9);
  t.index(3, 9);
  CHECK(t.top() == 3);
}

TEST_CASE("car score: an erased node forgets its score; a withdrawal never reaches the id's next node") {
  car_score_board b;
  b.reserve(4);
  const std::vector<node_id> uses{2};
  b.enter_window(1, uses);
  b.dispatch(1, uses);
  b.forget(2);  // evicted (or merged) while the request is in flight
  CHECK(b.score(2) == 0.0);
  b.index(2, 5);  // the id is reused by a new node
  b.complete(1);  // would have been -2 on the old node
  CHECK(b.score(2) == 0.0);
  CHECK(b.top() == 2);
}

TEST_CASE("car score: random event sequences agree with the naive reference") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 rng(seed);
    const std::size_t nodes = 1 + rng() % 24;
    car_score_board b;
    b.reserve(nodes);
    naive_board ref(nodes);
    std::vector<std::uint64_t> live_requests;
    std::uint64_t next_request = 0, clock = 0;
    for (int step = 0; step < 400; ++step) {
      const auto n = static_cast<node_id>(rng() % nodes);
      std::vector<node_id> path;
      for (std::size_t k = 0, len = rng() % 5; k < len; ++k) path.push_back(static_cast<node_id>(rng() % nodes));
      switch (rng() % 8) {
        case 0:
        case 1: {  // (re)index as a candidate, with ties in access times on purpose
          const std::uint64_t at = (clock += rng() % 2);
          b.index(n, at);
          ref.rows[n].candidate = true;
          ref.rows[n].access = at;
          break;
        }
        case 2:
          b.unindex(n);
          ref.rows[n].candidate = false;
          break;
        case 3:
          b.forget(n);
          ref.forget(n);
          break;
        case 4: {  // a request enters the window
          const std::uint64_t r = next_request++;
          live_requests.push_back(r);
          b.enter_window(r, path);
          ref.give(r, path, car_score::enter_window);
          break;
        }
        case 5:  // one in flight is dispatched (its path may have changed)
          if (!live_requests.empty()) {
            const std::uint64_t r = live_requests[rng() % live_requests.size()];
            b.dispatch(r, path);
            ref.give(r, path, car_score::dispatch);
          }
          break;
        case 6:  // one's own KV enters the cache while it generates
          if (!live_requests.empty()) {
            const std::uint64_t r = live_requests[rng() % live_requests.size()];
            b.adopt(r, path);
            ref.adopt(r, path);
          }
          break;
        default:  // one completes
          if (!live_requests.empty()) {
            const std::size_t k = rng() % live_requests.size();
            b.complete(live_requests[k]);
            ref.complete(live_requests[k]);
            live_requests.erase(live_requests.begin() + static_cast<std::ptrdiff_t>(k));
          }
      }
      REQUIRE(b.top() == ref.top());
      for (node_id m = 0; m < nodes; ++m) REQUIRE(b.score(m) == ref.rows[m].score);
      REQUIRE(b.requests_in_flight() == ref.ledger.size());
    }
    // Every request completes: no score outlives its requests.
    for (const auto r : live_requests) {
      b.complete(r);
      ref.complete(r);
    }
    for (node_id m = 0; m < nodes; ++m) CHECK(b.score(m) == 0.0);
  }
}

TEST_CASE("car score: the scorer over the radix tree takes unpinned leaves by score, then LRU") {
  using tree_t = prefix::radix_tree<state_store_archetype>;
  tree_t tree;
  car_score_board board;
  car_scorer s(board);
  s.reserve(16);
  const std::vector<token_id> a{1, 2}, c{3, 4}, d{5, 6};
  const node_id na = tree.add_leaf(tree_t::root(), a, {}, 1);
  const node_id nc = tree.add_leaf(tree_t::root(), c, {}, 2);
  const node_id nd = tree.add_leaf(tree_t::root(), d, {}, 3);
  for (const node_id n : {na, nc, nd}) s.on_update(tree, n);
  CHECK(s.select_victim(tree, 4) == na);  // all score 0: least recently used
  const std::vector<node_id> uses{na};
  s.board().enter_window(0, uses);
  CHECK(s.select_victim(tree, 4) == nc);
  const std::vector<node_id> path{nc};
  s.on_match(tree, path, no_node, 5);  // a hit refreshes nc: nd is now the oldest idle leaf
  CHECK(s.select_victim(tree, 5) == nd);
  tree.pin(nd);
  s.on_update(tree, nd);  // pinned: not a candidate
  CHECK(s.select_victim(tree, 5) == nc);
  CHECK(s.action(tree, nc) == evict_action::remove_leaf);
  s.on_erase(tree, nc);
  CHECK(s.select_victim(tree, 5) == na);  // the only candidate left, score 1
}

TEST_CASE("tiered replay: demotion car drives the prefix cache's victims by CaR's score") {
  const cost_model m(presets::jamba_1_5_mini());
  // Multi-turn sessions of 512-token ids under a tight HBM: a session's next turn is often
  // queued (and scored) while LRU would evict its history.
  std::mt19937_64 rng(11);
  std::vector<std::vector<sim::token_id>> hist(10);
  sim::token_id next_id = 0;
  std::vector<sim::request> reqs;
  for (int k = 0; k < 120; ++k) {
    auto& h = hist[rng() % hist.size()];
    for (int a = 0, add = 1 + static_cast<int>(rng() % 3); a < add; ++a) h.push_back(next_id++);
    sim::request r;
    r.arrival_s = 0.05 * k;
    r.input = h;
    r.input_tokens = static_cast<std::int64_t>(h.size()) * 512;
    r.output_tokens = 200;
    r.tokens_per_id = 512;
    reqs.push_back(std::move(r));
  }
  sim::tiered_replay_options o;
  o.tiers = parse_tiers("hbm=500MB,host=4GB", 1);
  o.prefill_engines = 1;
  o.tpot_ms = 20;
  const flop_prefill_time prefill(m);
  const auto lru = sim::run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{}, prefill);
  auto oc = o;
  oc.demotion = sim::demotion_kind::car;
  car_score_board board;
  const auto car = sim::run_tiered_replay<prefix::judicious_admission>(reqs, m, oc, car_scorer(board), prefill);
  MESSAGE("hbm hits: lru " << lru.hbm_hit_tokens << ", car " << car.hbm_hit_tokens << "; host hits: lru "
                           << lru.host_hit_tokens << ", car " << car.host_hit_tokens << "; ttft p50: lru "
                           << lru.ttft_p50_ms << ", car " << car.ttft_p50_ms);
  CHECK(car.requests == lru.requests);
  // With both weights 0 every score stays 0 and CaR is LRU (ties by node id, as lru_scorer's):
  // the same run to the last counter, so the difference above is the score's alone.
  car_score_board zero({.enter_window = 0.0, .dispatch = 0.0});
  const auto flat = sim::run_tiered_replay<prefix::judicious_admission>(reqs, m, oc, car_scorer(zero), prefill);
  CHECK(flat.hbm_hit_tokens == lru.hbm_hit_tokens);
  CHECK(flat.host_hit_tokens == lru.host_hit_tokens);
  CHECK(flat.bytes_loaded == lru.bytes_loaded);
  CHECK(flat.ttft_p50_ms == lru.ttft_p50_ms);
  CHECK((car.hbm_hit_tokens != lru.hbm_hit_tokens || car.host_hit_tokens != lru.host_hit_tokens));
  CHECK(board.requests_in_flight() == 0);  // every request's credits were withdrawn
  // Same again under CaR's queue (credits at window refills), and deterministic.
  oc.scheduler = sim::scheduler_kind::car;
  car_score_board b1, b2;
  const auto q1 = sim::run_tiered_replay<prefix::judicious_admission>(reqs, m, oc, car_scorer(b1), prefill);
  const auto q2 = sim::run_tiered_replay<prefix::judicious_admission>(reqs, m, oc, car_scorer(b2), prefill);
  CHECK(q1.hbm_hit_tokens == q2.hbm_hit_tokens);
  CHECK(q1.ttft_p50_ms == q2.ttft_p50_ms);
  CHECK(b1.requests_in_flight() == 0);
  // The scorer and the option go together.
  CHECK_THROWS_AS((void)sim::run_tiered_replay<prefix::judicious_admission>(reqs, m, oc, prefix::lru_scorer{}, prefill),
                  invalid_argument);
  car_score_board b3;
  CHECK_THROWS_AS((void)sim::run_tiered_replay<prefix::judicious_admission>(reqs, m, o, car_scorer(b3), prefill),
                  invalid_argument);
}
