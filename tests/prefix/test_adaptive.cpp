// The adaptive selector (issue #14 item 3) against obviously-right models:
//
// - switching_scorer following one rule throughout answers every request exactly as that
//   scorer alone (each part's own last-access times behave like the tree's);
// - switching_scorer switched at random picks the victims of naive O(n) models of the same
//   rules (naive LRU, the reference FLOP-aware scan, naive GDSF) switched the same way;
// - adaptive_scorer equals a naive selector built from independent caches: one plain
//   prefix_cache per candidate fed the same requests gives the shadows' FLOPs, a direct
//   transcription of the decision rule gives the switches, and a switching cache switched at
//   those requests gives the live cache's every answer;
// - it runs under request_lifecycle (the runtime's path), refuses bad options, and on synth
//   traces follows GDSF where GDSF wins and stays on SGLang+'s rule where nothing beats it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <utility>
#include <span>
#include <vector>

#include "hybridcache/compose/adaptive_scorer.hpp"
#include "hybridcache/compose/bundles.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/switching_scorer.hpp"
#include "hybridcache/sim/reference/reference_scorer.hpp"
#include "hybridcache/sim/synth_v1.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "../support/naive_scorers.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;
using namespace hybridcache::compose;

namespace {

using seq_t = std::vector<token_id>;

/// A request that shares a random prefix with an earlier one (or none) and goes on with
/// fresh tokens from a small vocabulary, so requests branch inside edges.
seq_t branching_seq(std::mt19937_64& rng, const std::vector<seq_t>& seen, std::size_t max_len) {
  seq_t s;
  if (!seen.empty() && rng() % 4 != 0) {
    const seq_t& base = seen[rng() % seen.size()];
    s.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng() % base.size()));
  }
  const std::size_t extra = 1 + rng() % max_len;
  for (std::size_t i = 0; i < extra; ++i) s.push_back(static_cast<token_id>(1 + rng() % 3));
  return s;
}

/// Drives two caches with the same request (match, then commit) and requires identical
/// answers; `between(reused)` runs after the matches, before the commits (where the live
/// cache's selector decides). Returns the evictions of the commit (0 when both refused it).
template <class A, class B, class Between>
std::int64_t same_request(A& a, B& b, const seq_t& s, std::int64_t in, Between&& between) {
  const std::span<const token_id> input(s.data(), static_cast<std::size_t>(in));
  auto ma = a.match(input);
  auto mb = b.match(input);
  REQUIRE(ma);
  REQUIRE(mb);
  REQUIRE(ma->reusable_tokens == mb->reusable_tokens);
  between(ma->reusable_tokens);
  auto ca = a.commit(s, in, &*ma);
  auto cb = b.commit(s, in, &*mb);
  REQUIRE(ca.has_value() == cb.has_value());
  if (!ca) {
    REQUIRE(a.release(*ma));
    REQUIRE(b.release(*mb));
    return 0;
  }
  REQUIRE(ca->evictions == cb->evictions);
  REQUIRE(a.store().used_bytes() == b.store().used_bytes());
  REQUIRE(a.tree().size() == b.tree().size());
  return ca->evictions;
}
template <class A, class B>
std::int64_t same_request(A& a, B& b, const seq_t& s, std::int64_t in) {
  return same_request(a, b, s, in, [](std::int64_t) {});
}

const cost_model& model() {
  static const cost_model m(presets::marconi_7b());
  return m;
}

lru_flop_gdsf_scorer library_parts(double alpha, std::size_t initial, flop_index index = flop_index::bounded_walk,
                                   flop_candidates rule = flop_candidates::protect_branches) {
  return lru_flop_gdsf_scorer(lru_scorer{}, flop_aware_scorer(model(), {.alpha = alpha, .candidates = rule, .index = index}),
                              gdsf_scorer(model(), {.candidates = rule}), initial);
}

}  // namespace

TEST_CASE("switching_scorer following one rule throughout equals that scorer alone") {
  const cost_model& m = model();
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  std::int64_t evictions[3] = {0, 0, 0};
  for (std::uint64_t seed = 1; seed <= 90; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    const std::size_t rule = seed % 3;
    const double alpha = static_cast<double>(rng() % 21) / 10.0;
    const std::int64_t cap = 6 * ck + 250 * kv;
    // The paper's candidate rule merges single-child nodes often: the merged node's time
    // must carry over to its child in each part's own table, as the tree does.
    const flop_candidates cands = seed % 2 == 0 ? flop_candidates::paper : flop_candidates::protect_branches;
    prefix_cache<cost_model, judicious_admission, lru_flop_gdsf_scorer, counting_store> both(
        m, counting_store(cap, kv, ck), library_parts(alpha, rule, flop_index::bounded_walk, cands));
    std::vector<seq_t> seen;
    auto run = [&](auto& alone) {
      for (int op = 0; op < 60; ++op) {
        const seq_t s = branching_seq(rng, seen, 50);
        evictions[rule] += same_request(both, alone, s, static_cast<std::int64_t>(1 + rng() % s.size()));
        seen.push_back(s);
      }
    };
    if (rule == 0) {
      prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> alone(m, counting_store(cap, kv, ck), lru_scorer{});
      run(alone);
    } else if (rule == 1) {
      prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> alone(
          m, counting_store(cap, kv, ck), flop_aware_scorer(m, {.alpha = alpha, .candidates = cands}));
      run(alone);
    } else {
      prefix_cache<cost_model, judicious_admission, gdsf_scorer, counting_store> alone(m, counting_store(cap, kv, ck),
                                                                       gdsf_scorer(m, {.candidates = cands}));
      run(alone);
    }
  }
  for (std::int64_t e : evictions) CHECK(e > 300);
}

TEST_CASE("switching_scorer switched at random picks the naive models' victims") {
  const cost_model& m = model();
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  using naive_parts = switching_scorer<test::naive_lru, sim::reference_flop_scorer, test::naive_gdsf>;
  std::int64_t evictions = 0, switches = 0;
  for (std::uint64_t seed = 1; seed <= 80; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 31337);
    const std::int64_t cap = 6 * ck + 250 * kv;
    // The exact threshold walk: the reference scan is the exact argmin.
    prefix_cache<cost_model, judicious_admission, lru_flop_gdsf_scorer, counting_store> fast(
        m, counting_store(cap, kv, ck), library_parts(0.0, 0, flop_index::threshold_walk));
    prefix_cache<cost_model, judicious_admission, naive_parts, counting_store> naive(
        m, counting_store(cap, kv, ck),
        naive_parts(test::naive_lru{}, sim::reference_flop_scorer(m, {}), test::naive_gdsf(m)));
    std::vector<seq_t> seen;
    for (int op = 0; op < 80; ++op) {
      if (rng() % 3 == 0) {
        const std::size_t rule = rng() % 3;
        const double alpha = static_cast<double>(rng() % 21) / 10.0;
        REQUIRE(fast.switch_rule(rule, alpha));
        REQUIRE(naive.switch_rule(rule, alpha));
        ++switches;
      }
      REQUIRE(fast.scorer().active_rule() == naive.scorer().active_rule());
      const seq_t s = branching_seq(rng, seen, 50);
      evictions += same_request(fast, naive, s, static_cast<std::int64_t>(1 + rng() % s.size()));
      seen.push_back(s);
    }
  }
  CHECK(evictions > 2000);
  CHECK(switches > 1500);
}

namespace {

/// Every node slot of two trees alike (ids, extents, tokens, checkpoints, pins, links): the
/// same victims were taken, in the same order, by the same actions.
template <class TA, class TB>
void same_tree(const TA& a, const TB& b) {
  REQUIRE(a.id_bound() == b.id_bound());
  for (node_id n = 0; n < a.id_bound(); ++n) {
    const auto &x = a.at(n), &y = b.at(n);
    REQUIRE(x.live == y.live);
    if (!x.live) continue;
    REQUIRE(x.tokens == y.tokens);
    REQUIRE(x.end == y.end);
    REQUIRE(x.has_checkpoint == y.has_checkpoint);
    REQUIRE(x.pins == y.pins);
    REQUIRE(x.parent == y.parent);
    REQUIRE(x.children == y.children);
    REQUIRE(x.first_child == y.first_child);
    REQUIRE(x.branched == y.branched);
  }
}

}  // namespace

TEST_CASE("switching_scorer: only the followed part's index kept current gives every victim of all parts kept current") {
  // index_upkeep::followed (the default) suspends LRU and FLOP-aware while another part is
  // followed and rebuilds the index on the first hook after a switch back; every_part keeps
  // all three current. Same requests, same switches: the trees stay equal node for node.
  const cost_model& m = model();
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  std::int64_t evictions = 0, switches = 0;
  std::uint64_t rebuilds = 0;
  const flop_index indexes[] = {flop_index::bounded_walk, flop_index::efficiency_classes, flop_index::threshold_walk};
  for (std::uint64_t seed = 1; seed <= 90; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 7919);
    const flop_index index = indexes[seed % 3];
    const flop_candidates cands = (seed / 3) % 2 == 0 ? flop_candidates::protect_branches : flop_candidates::paper;
    const lru_config lru_cfg{.ties = (seed / 6) % 2 == 0 ? lru_ties::by_node_id : lru_ties::python_heapq};
    // Bounded walks of 2 steps: the class heads decide often, which a stale index would change.
    const flop_aware_config fc{.alpha = 1.0, .candidates = cands, .index = index, .walk_limit = seed % 4 == 0 ? 2 : 64};
    auto parts = [&](index_upkeep u) {
      return lru_flop_gdsf_scorer(lru_scorer(lru_cfg), flop_aware_scorer(m, fc), gdsf_scorer(m, {.candidates = cands}),
                                  seed % 3, u);
    };
    const std::int64_t cap = 6 * ck + 250 * kv;
    prefix_cache<cost_model, judicious_admission, lru_flop_gdsf_scorer, counting_store> lazy(m, counting_store(cap, kv, ck),
                                                                                             parts(index_upkeep::followed));
    prefix_cache<cost_model, judicious_admission, lru_flop_gdsf_scorer, counting_store> eager(
        m, counting_store(cap, kv, ck), parts(index_upkeep::every_part));
    REQUIRE(lazy.scorer().upkeep() == index_upkeep::followed);
    std::vector<seq_t> seen;
    for (int op = 0; op < 80; ++op) {
      const std::uint64_t r = rng() % 6;
      if (r < 2) {  // switch (sometimes twice with no hook between: no rebuild needed then)
        for (std::uint64_t k = 0; k <= r; ++k) {
          const std::size_t rule = rng() % 3;
          const double alpha = static_cast<double>(rng() % 21) / 10.0;
          REQUIRE(lazy.switch_rule(rule, alpha));
          REQUIRE(eager.switch_rule(rule, alpha));
          ++switches;
        }
      }
      const seq_t s = branching_seq(rng, seen, 50);
      evictions += same_request(lazy, eager, s, static_cast<std::int64_t>(1 + rng() % s.size()));
      seen.push_back(s);
      same_tree(lazy.tree(), eager.tree());
      const std::size_t active = lazy.scorer().active_rule();
      for (std::size_t p = 0; p < 2; ++p) CHECK(lazy.scorer().suspended(p) == (p != active));  // after a hook
      CHECK_FALSE(lazy.scorer().suspended(2));                                                 // GDSF: never
      if (active == 1) CHECK(lazy.scorer().part<1>().candidates() == eager.scorer().part<1>().candidates());
      if (active == 0 && lru_cfg.ties == lru_ties::by_node_id)
        CHECK(lazy.scorer().part<0>().candidates() == eager.scorer().part<0>().candidates());
    }
    CHECK(eager.scorer().index_rebuilds() == 0);
    rebuilds += lazy.scorer().index_rebuilds();
  }
  CHECK(evictions > 2000);
  CHECK(switches > 1500);
  CHECK(rebuilds > 500);
}

TEST_CASE("switching_scorer: switch_to refuses a rule out of range or a bad alpha and changes nothing") {
  lru_flop_gdsf_scorer s = library_parts(0.5, 1);
  CHECK(s.rules() == 3);
  CHECK_FALSE(s.switch_to(3, 0.0));
  CHECK_FALSE(s.switch_to(1, -1.0));
  CHECK_FALSE(s.switch_to(1, std::nan("")));
  CHECK(s.active_rule() == 1);
  CHECK(s.alpha() == 0.5);
  CHECK(s.switch_to(2, 0.0));
  CHECK(s.active_rule() == 2);
  CHECK(s.takes_inner_nodes());
  CHECK(s.switch_to(0, 0.0));
  CHECK_FALSE(s.takes_inner_nodes());  // LRU takes leaves only: the cache's fit check follows
  CHECK_THROWS_AS(library_parts(0.0, 3), invalid_argument);
}

namespace {

/// The naive selector: one plain cache per candidate, the decision rule written out, the
/// baseline guard too.
struct naive_selector {
  adaptive_config cfg;
  std::vector<double> score, lead, lead_sq, total;
  std::size_t followed = 0;
  std::int64_t requests = 0, last_switch = 0, reverts = 0, switched = 0;
  double live = 0.0, base = 0.0;  // the guard's sums
  double s_live = 0.0, s_base = 0.0;      // ... once the sampled shadows decide
  double cal_live = 0.0, cal_base = 0.0;  // sampled requests before the first switch
  bool standing = true;           // the guard has not stood down
  bool sampled_scores = false;    // the scores are the miniatures'

  explicit naive_selector(adaptive_config c) : cfg(std::move(c)) {
    const std::size_t k = cfg.candidates.size();
    score.assign(k, 0.0);
    lead.assign(k, 0.0);
    lead_sq.assign(k, 0.0);
    total.assign(k, 0.0);
  }
  /// Following candidate c is allowed while this is >= 0 (always without a guard).
  double budget(std::size_t c) const {
    if (!cfg.baseline_slack || !standing) return 1.0;
    const double lead_over_base = score[c] - 1.05 * score[0];  // guard_lead_margin = 0.05
    const double keep = 1.0 - *cfg.baseline_slack;
    return live - keep * base + s_live - keep * kappa() * s_base +
           (sampled_scores ? kappa() : 1.0) * (lead_over_base > 0.0 ? lead_over_base : 0.0);
  }
  /// The live cache over the baseline's miniature, before the first switch (1 unmeasured).
  double kappa() const { return cal_base > 0.0 ? cal_live / cal_base : 1.0; }
  /// A sampled request's live gain against the baseline miniature's gain.
  void calibrate(double live_gain, double mini_base) {
    if (!cfg.baseline_slack || !standing || switched != 0) return;
    cal_live += live_gain;
    cal_base += mini_base;
  }
  /// Takes this request's FLOPs per candidate and the live cache's; true when the live cache
  /// switches now. `exact`: the gains are the exact shadows' (only those can disagree with
  /// the live cache before the first switch: the guard then stands down).
  bool observe(const std::vector<double>& gain, double live_gain, bool exact = true) {
    for (std::size_t i = 0; i < gain.size(); ++i) {
      score[i] = score[i] * *cfg.decay + gain[i];
      total[i] += gain[i];
      const double d = (gain[i] - gain[followed]) * 1e-12;
      lead[i] = lead[i] * *cfg.decay + d;
      lead_sq[i] = lead_sq[i] * *cfg.decay * *cfg.decay + d * d;
    }
    if (cfg.baseline_slack && standing) {
      if (!exact) {  // the baseline's miniature: summed apart, compared x kappa()
        s_live += live_gain;
        s_base += gain[0];
        calibrate(live_gain, gain[0]);
      } else if (switched == 0 && live_gain != gain[0]) {  // the shadow does not model the live cache
        standing = false;
      } else {
        live += live_gain;
        base += gain[0];
      }
    }
    ++requests;
    if (followed != 0 && budget(followed) < 0.0) {  // back to the baseline, no hysteresis
      followed = 0;
      ++reverts;
    } else {
      std::size_t best = followed;
      for (std::size_t i = 0; i < score.size(); ++i)
        if (score[i] > score[best]) best = i;
      const bool go = best != followed && requests - last_switch >= cfg.min_dwell &&
                      score[best] > score[followed] * (1.0 + cfg.switch_margin) &&
                      lead[best] > cfg.confidence * std::sqrt(lead_sq[best]) && (best == 0 || budget(best) >= 0.0);
      if (!go) return false;
      followed = best;
    }
    last_switch = requests;
    ++switched;
    std::fill(lead.begin(), lead.end(), 0.0);
    std::fill(lead_sq.begin(), lead_sq.end(), 0.0);
    return true;
  }
};

/// A random guard for the equivalence tests: none, zero slack, the default, a loose one.
std::optional<double> random_slack(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: return std::nullopt;
    case 1: return 0.0;
    case 2: return 0.02;
    default: return 0.1;
  }
}

template <class Scorer>
using plain_cache = prefix_cache<cost_model, judicious_admission, Scorer, counting_store>;

/// The ids a plain cache reuses for `input`, then its insert (refused: released).
template <class Cache>
std::int64_t shadow_step(Cache& c, const seq_t& s, std::int64_t in) {
  auto mm = c.match(std::span<const token_id>(s.data(), static_cast<std::size_t>(in)));
  REQUIRE(mm);
  const std::int64_t reused = mm->reusable_tokens;
  if (!c.commit(s, in, &*mm)) REQUIRE(c.release(*mm));
  return reused;
}

}  // namespace

TEST_CASE("adaptive_scorer equals a naive selector built from independent caches") {
  const cost_model& m = model();
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  std::int64_t switches = 0, evictions = 0, reverts = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 1000003);
    adaptive_config cfg;
    cfg.candidates = {{0, 0.0}, {1, 0.0}, {1, 1.0}, {1, 2.0}, {2, 0.0}};
    cfg.decay = seed % 2 == 0 ? 0.9 : 0.97;
    cfg.switch_margin = static_cast<double>(rng() % 3) / 100.0;
    cfg.confidence = seed % 3 == 0 ? 0.0 : 0.5;
    cfg.min_dwell = static_cast<std::int64_t>(rng() % 4);
    cfg.baseline_slack = random_slack(rng);
    const std::int64_t cap = 5 * ck + 200 * kv;
    marconi_adaptive_cache<> live(m, counting_store(cap, kv, ck), make_marconi_adaptive_scorer(m, cfg));
    // The naive model's three parts: the candidates' own caches, the rule, and the live cache.
    plain_cache<lru_scorer> s0(m, counting_store(cap, kv, ck), lru_scorer{});
    plain_cache<flop_aware_scorer> s1(m, counting_store(cap, kv, ck), flop_aware_scorer(m, {.alpha = 0.0}));
    plain_cache<flop_aware_scorer> s2(m, counting_store(cap, kv, ck), flop_aware_scorer(m, {.alpha = 1.0}));
    plain_cache<flop_aware_scorer> s3(m, counting_store(cap, kv, ck), flop_aware_scorer(m, {.alpha = 2.0}));
    plain_cache<gdsf_scorer> s4(m, counting_store(cap, kv, ck), gdsf_scorer(m));
    naive_selector rule(cfg);
    prefix_cache<cost_model, judicious_admission, lru_flop_gdsf_scorer, counting_store> follower(m, counting_store(cap, kv, ck),
                                                                                 library_parts(0.0, 0));
    std::vector<seq_t> seen;
    for (int op = 0; op < 120; ++op) {
      const seq_t s = branching_seq(rng, seen, 60);
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const std::vector<double> gain{
          static_cast<double>(m.hit_flops(shadow_step(s0, s, in))), static_cast<double>(m.hit_flops(shadow_step(s1, s, in))),
          static_cast<double>(m.hit_flops(shadow_step(s2, s, in))), static_cast<double>(m.hit_flops(shadow_step(s3, s, in))),
          static_cast<double>(m.hit_flops(shadow_step(s4, s, in)))};
      // The live cache's selector decides between its match and its commit, knowing the hit.
      evictions += same_request(live, follower, s, in, [&](std::int64_t reused) {
        if (rule.observe(gain, static_cast<double>(m.hit_flops(reused)))) {
          const candidate_rule& c = cfg.candidates[rule.followed];
          REQUIRE(follower.switch_rule(c.rule, c.alpha));
          ++switches;
        }
      });
      REQUIRE(live.scorer().followed() == rule.followed);
      seen.push_back(s);
    }
    for (std::size_t i = 0; i < rule.score.size(); ++i) {
      CHECK(live.scorer().scores()[i] == rule.score[i]);
      CHECK(live.scorer().shadow_flops()[i] == rule.total[i]);
    }
    const adaptive_overhead o = live.scorer().overhead();
    CHECK(o.live_flops == rule.live);
    CHECK(o.baseline_flops == rule.base);
    CHECK(o.guard_reverts == rule.reverts);
    CHECK(o.guard == (!cfg.baseline_slack ? guard_state::off : rule.standing ? guard_state::on : guard_state::mismatch));
    reverts += rule.reverts;
    CHECK(o.requests == 120);
    CHECK(o.shadows == 5);
    CHECK(o.shadow_nodes > 0);
    CHECK(o.shadow_bytes > 0);
    CHECK(o.shadow_seconds > 0.0);
  }
  CHECK(switches > 60);
  CHECK(evictions > 2000);
  CHECK(reverts > 5);  // the guard acted, so its rule was compared, not only its absence
}

TEST_CASE("adaptive_scorer under request_lifecycle: every finished request reaches the shadows, capacity holds") {
  const cost_model& m = model();
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  const std::int64_t cap = 5 * ck + 200 * kv;
  marconi_adaptive_cache<> cache(m, counting_store(cap, kv, ck),
                                 make_marconi_adaptive_scorer(m, {.decay = 0.9, .switch_margin = 0.0, .confidence = 0.0}));
  request_lifecycle<marconi_adaptive_cache<>> requests(cache);
  std::mt19937_64 rng(5);
  std::vector<seq_t> seen;
  std::int64_t finished = 0;
  for (int op = 0; op < 150; ++op) {
    const seq_t s = branching_seq(rng, seen, 60);
    const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
    auto t = requests.begin(std::span<const token_id>(s.data(), static_cast<std::size_t>(in)),
                            {.output_tokens = static_cast<std::int64_t>(s.size()) - in});
    if (!t) {
      REQUIRE(t.error() == errc::out_of_capacity);
      continue;
    }
    const auto& st = **requests.state(*t);
    std::vector<std::int64_t> captured;
    for (const auto& site : st.plan.sites) captured.push_back(site.position);
    const auto len = static_cast<std::int64_t>(s.size());
    if (len > st.match.reusable_tokens && (captured.empty() || captured.back() != len)) captured.push_back(len);
    auto f = requests.finish(*t, s, captured);
    REQUIRE(f);
    ++finished;
    REQUIRE(cache.store().used_bytes() <= cap);
    seen.push_back(s);
  }
  CHECK(finished > 100);
  CHECK(cache.scorer().overhead().requests == finished);
  CHECK(cache.scorer().overhead().switches > 0);
}

namespace {

/// `n` fresh ids from a large vocabulary (requests that share nothing by chance).
seq_t fresh_seq(std::mt19937_64& rng, std::size_t n) {
  seq_t s(n);
  for (auto& t : s) t = static_cast<token_id>(1 + rng() % 100000);
  return s;
}

}  // namespace

TEST_CASE("the baseline guard stands down for good when requests overlap; the selector then decides as without one") {
  const cost_model& m = model();
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  const std::int64_t cap = 5 * ck + 200 * kv;
  const adaptive_config base{.decay = 0.9, .switch_margin = 0.0, .confidence = 0.0};
  adaptive_config unguarded = base;
  unguarded.baseline_slack.reset();
  std::int64_t differs = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    // Three caches on one stream: guarded one request at a time (the control: the guard acts
    // there), guarded with two requests in flight at request `at`, and no guard at all.
    marconi_adaptive_cache<> control(m, counting_store(cap, kv, ck), make_marconi_adaptive_scorer(m, base));
    marconi_adaptive_cache<> overlapped(m, counting_store(cap, kv, ck), make_marconi_adaptive_scorer(m, base));
    marconi_adaptive_cache<> none(m, counting_store(cap, kv, ck), make_marconi_adaptive_scorer(m, unguarded));
    std::mt19937_64 rng(seed * 31337);
    std::vector<seq_t> seen;
    const int at = static_cast<int>(seed % 3);  // before any switch: the sums had no say yet
    for (int op = 0; op < 150; ++op) {
      const seq_t s = branching_seq(rng, seen, 60);
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const std::span<const token_id> input(s.data(), static_cast<std::size_t>(in));
      if (op == at) {  // this request and the previous one's twin in flight together
        const seq_t& other = seen.empty() ? s : seen.back();
        auto a = overlapped.match(input);
        auto b = overlapped.match(std::span<const token_id>(other.data(), 1));
        REQUIRE((a && b));
        CHECK(overlapped.scorer().overhead().guard == guard_state::on);
        if (!overlapped.commit(s, in, &*a)) REQUIRE(overlapped.release(*a));
        CHECK(overlapped.scorer().overhead().guard == guard_state::overlap);
        CHECK(overlapped.scorer().overhead().guard_suspended_at == op);
        REQUIRE(overlapped.release(*b));
        (void)shadow_step(none, s, in);
        (void)shadow_step(control, s, in);
      } else {
        (void)shadow_step(overlapped, s, in);
        (void)shadow_step(none, s, in);
        (void)shadow_step(control, s, in);
      }
      REQUIRE(overlapped.scorer().followed() == none.scorer().followed());
      differs += control.scorer().followed() != none.scorer().followed() ? 1 : 0;
      seen.push_back(s);
    }
    const adaptive_overhead o = overlapped.scorer().overhead();
    CHECK(o.guard == guard_state::overlap);
    CHECK(o.guard_reverts == 0);
    CHECK(o.switches == none.scorer().overhead().switches);
    CHECK(control.scorer().overhead().guard == guard_state::on);  // one at a time, the shadows agree
  }
  CHECK(differs > 0);  // the guard changes decisions where it stands: standing down is not a no-op
}

TEST_CASE("the baseline guard stands down when the baseline shadow disagrees with the live cache before a switch") {
  const cost_model& m = model();
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  const std::int64_t cap = 5 * ck + 200 * kv;
  marconi_adaptive_cache<> cache(m, counting_store(cap, kv, ck), make_marconi_adaptive_scorer(m, {}));
  std::mt19937_64 rng(9);
  const seq_t a = fresh_seq(rng, 40);
  auto turn = [&](const seq_t& head) {  // a next turn: head ++ 20 fresh ids, its input 45 ids
    seq_t s = head;
    for (const token_id t : fresh_seq(rng, 20)) s.push_back(t);
    return s;
  };
  (void)shadow_step(cache, a, 30);
  (void)shadow_step(cache, turn(a), 45);  // resumes after a's state at 40, on the live cache and the shadow alike
  CHECK(cache.scorer().overhead().guard == guard_state::on);
  CHECK(cache.scorer().overhead().live_flops > 0.0);
  CHECK(cache.scorer().overhead().live_flops == cache.scorer().overhead().baseline_flops);
  // A commit without a match: the runtime computed it uncached (the live cache saved
  // nothing), where the baseline shadow, which matches every request, resumes at 40.
  REQUIRE(cache.commit(turn(a), 45));
  const adaptive_overhead o = cache.scorer().overhead();
  CHECK(o.guard == guard_state::mismatch);
  CHECK(o.guard_suspended_at == 2);
  CHECK(o.live_flops == o.baseline_flops);  // the disagreeing request was not summed
  CHECK(o.switches == 0);
}

TEST_CASE("the baseline guard under request_lifecycle: two requests in flight suspend it for good") {
  const cost_model& m = model();
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  const std::int64_t cap = 5 * ck + 200 * kv;
  marconi_adaptive_cache<> cache(m, counting_store(cap, kv, ck), make_marconi_adaptive_scorer(m, {}));
  request_lifecycle<marconi_adaptive_cache<>> requests(cache);
  std::mt19937_64 rng(11);
  const seq_t a = fresh_seq(rng, 40), b = fresh_seq(rng, 40);
  auto run = [&](const seq_t& s) {
    auto t = requests.begin(std::span<const token_id>(s.data(), 30), {.output_tokens = 10});
    REQUIRE(t);
    return *t;
  };
  auto end = [&](request_ticket t, const seq_t& s) {  // every planned state captured, and the end
    std::vector<std::int64_t> captured;
    for (const auto& site : (*requests.state(t))->plan.sites) captured.push_back(site.position);
    if (captured.empty() || captured.back() != 40) captured.push_back(40);
    REQUIRE(requests.finish(t, s, captured));
  };
  end(run(a), a);  // one at a time: not an overlap (fresh ids: both miss, alike)
  CHECK(cache.scorer().overhead().guard == guard_state::on);
  const request_ticket tb = run(b), ta = run(a);
  end(tb, b);
  CHECK(cache.scorer().overhead().guard == guard_state::overlap);
  CHECK(cache.scorer().overhead().guard_suspended_at == 1);
  end(ta, a);
  end(run(b), b);  // for good, though one at a time again
  CHECK(cache.scorer().overhead().guard == guard_state::overlap);
  CHECK(cache.scorer().overhead().requests == 4);
}

TEST_CASE("adaptive_scorer refuses bad options") {
  const cost_model& m = model();
  auto make = [&](adaptive_config c) { return make_marconi_adaptive_scorer(m, std::move(c)); };
  CHECK_THROWS_AS(make({.candidates = {{3, 0.0}}}), invalid_argument);
  CHECK_THROWS_AS(make({.candidates = {{1, -0.5}}}), invalid_argument);
  CHECK_THROWS_AS(make({.decay = 0.0}), invalid_argument);
  CHECK_THROWS_AS(make({.decay = 1.5}), invalid_argument);
  CHECK_THROWS_AS(make({.switch_margin = -0.1}), invalid_argument);
  CHECK_THROWS_AS(make({.confidence = std::nan("")}), invalid_argument);
  CHECK_THROWS_AS(make({.min_dwell = -1}), invalid_argument);
  CHECK_THROWS_AS(make({.tokens_per_id = 0}), invalid_argument);
  CHECK_THROWS_AS(make({.baseline_slack = -0.01}), invalid_argument);
  CHECK_THROWS_AS(make({.baseline_slack = 1.0}), invalid_argument);
  CHECK_THROWS_AS(make({.baseline_slack = std::nan("")}), invalid_argument);
  const marconi_adaptive_scorer d = make({});
  CHECK(d.config().baseline_slack == recommended_baseline_slack);  // the guard is on by default
  CHECK(d.overhead().guard == guard_state::on);
  CHECK(make({.baseline_slack = std::nullopt}).overhead().guard == guard_state::off);
  CHECK(d.config().candidates.size() == default_candidates().size());
  CHECK(d.followed() == 0);  // SGLang+'s rule first
}

TEST_CASE("adaptive_scorer on synth traces: GDSF where it wins, SGLang+'s rule where nothing beats it") {
  const cost_model& m = model();
  struct cse {
    sim::synth_profile profile;
    std::uint64_t seed;
    std::int64_t capacity;
  };
  auto run = [&](const cse& c, auto&& check) {
    marconi_adaptive_cache<> cache(m, counting_store(c.capacity, m.kv_bytes_per_token(), m.ssm_checkpoint_bytes()),
                                   make_marconi_adaptive_scorer(m));
    for (const auto& r : sim::generate_synth_v1({.profile = c.profile, .seed = c.seed, .sessions = 60, .session_gap_ms = 2000})) {
      seq_t s = r.input;
      s.insert(s.end(), r.output.begin(), r.output.end());
      auto mm = cache.match(r.input);
      REQUIRE(mm);
      if (!cache.commit(s, static_cast<std::int64_t>(r.input.size()), &*mm)) REQUIRE(cache.release(*mm));
    }
    check(cache.scorer());
  };
  // Chat at 1 GB: GDSF's shadow saves the most by far, and the live cache follows it.
  run({sim::synth_profile::chat, 3, 1'000'000'000}, [](const marconi_adaptive_scorer& sel) {
    const auto flops = sel.shadow_flops();
    CHECK(flops[5] > 1.5 * flops[0]);
    CHECK(sel.config().candidates[sel.followed()].rule == 2);
  });
  // Agent at 10 GB: nothing beats SGLang+'s rule, and the live cache never leaves it.
  run({sim::synth_profile::agent, 3, 10'000'000'000}, [](const marconi_adaptive_scorer& sel) {
    CHECK(sel.overhead().switches == 0);
    CHECK(sel.followed() == 0);
  });
}

// --- sampled shadows (issue #36) --------------------------------------------------------

namespace {

/// The obviously-right conversation estimate: (key, bytes) most recent first, a linear scan.
struct naive_estimate {
  std::int64_t capacity;
  std::vector<std::pair<std::uint64_t, std::int64_t>> order{};
  void observe(std::uint64_t key, std::int64_t bytes) {
    std::erase_if(order, [&](const auto& e) { return e.first == key; });
    order.insert(order.begin(), {key, bytes});
    auto used = [&] {
      std::int64_t u = 0;
      for (const auto& e : order) u += e.second;
      return u;
    };
    while (used() > capacity && order.size() > 1) order.pop_back();
  }
};

/// A conversation's next turn: a random earlier sequence of the same conversation (its
/// first 2 ids are the conversation's head) extended, or a new conversation.
seq_t conversation_seq(std::mt19937_64& rng, std::vector<seq_t>& seen, std::size_t max_len, int heads) {
  seq_t s;
  if (!seen.empty() && rng() % 3 != 0) {
    s = seen[rng() % seen.size()];
  } else {
    s = {static_cast<token_id>(1000 + rng() % static_cast<std::uint64_t>(heads)),
         static_cast<token_id>(1000 + rng() % static_cast<std::uint64_t>(heads))};
  }
  const std::size_t extra = 1 + rng() % max_len;
  for (std::size_t i = 0; i < extra; ++i) s.push_back(static_cast<token_id>(1 + rng() % 3));
  if (s.size() > 400) s.resize(2 + rng() % 40);  // keeps the head: the same conversation, shorter
  return s;
}

/// The sampled test's four candidates as plain caches of `cap` bytes.
struct four_caches {
  plain_cache<lru_scorer> lru;
  plain_cache<flop_aware_scorer> a0, a2;
  plain_cache<gdsf_scorer> gdsf;
  explicit four_caches(std::int64_t cap)
      : lru(model(), store(cap), lru_scorer{}),
        a0(model(), store(cap), flop_aware_scorer(model(), {.alpha = 0.0})),
        a2(model(), store(cap), flop_aware_scorer(model(), {.alpha = 2.0})),
        gdsf(model(), store(cap), gdsf_scorer(model())) {}
  static counting_store store(std::int64_t cap) {
    return counting_store(cap, model().kv_bytes_per_token(), model().ssm_checkpoint_bytes());
  }
};

}  // namespace

TEST_CASE("shadow sampling: conversation keys, the sample's rate, the conversation estimate against a naive LRU") {
  // Every turn of a conversation (a sequence extending its first two ids) has one key; the
  // salt separates tenants; the key's sample holds about R of the keys.
  const seq_t a{7, 9, 1, 2}, b{7, 9, 5}, c{7, 8, 1, 2};
  CHECK(compose::detail::conversation_key(a, std::nullopt, 2) == compose::detail::conversation_key(b, std::nullopt, 2));
  CHECK(compose::detail::conversation_key(a, std::nullopt, 2) != compose::detail::conversation_key(c, std::nullopt, 2));
  CHECK(compose::detail::conversation_key(a, std::nullopt, 1) == compose::detail::conversation_key(c, std::nullopt, 1));
  CHECK(compose::detail::conversation_key(a, cache_salt(3), 2) != compose::detail::conversation_key(a, std::nullopt, 2));
  CHECK(compose::detail::conversation_key(a, cache_salt(3), 2) != compose::detail::conversation_key(a, cache_salt(4), 2));
  for (const double rate : {0.01, 0.1, 0.5}) {
    int in = 0;
    for (token_id k = 0; k < 20000; ++k) in += compose::detail::sampled(compose::detail::conversation_key(seq_t{k, k}, std::nullopt, 2), rate);
    CAPTURE(rate);
    const double sd = std::sqrt(20000 * rate * (1 - rate));
    CHECK(std::abs(in - 20000 * rate) < 5 * sd);  // binomial: 5 standard deviations
  }
  CHECK(compose::detail::sampled(12345, 1.0));
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    const auto cap = static_cast<std::int64_t>(100 + rng() % 2000);
    compose::detail::conversation_estimate real(cap);
    naive_estimate naive{cap};
    for (int i = 0; i < 300; ++i) {
      const std::uint64_t key = rng() % 40;
      const auto bytes = static_cast<std::int64_t>(rng() % 400);
      real.observe(key, bytes);
      naive.observe(key, bytes);
      REQUIRE(real.held() == static_cast<std::int64_t>(naive.order.size()));
    }
  }
}

TEST_CASE("sampled shadows equal exact plain caches of the sampled conversations at capacity x R") {
  // The naive model: one plain cache per candidate at capacity x R fed only the requests
  // whose conversation is in the sample; while warming (floor > 0), the exact plain caches
  // decide and a naive estimate says when the floor is reached; the decision rule written
  // out on the requests that move the scores; a switching cache switched at those requests.
  const cost_model& m = model();
  const std::int64_t kv = m.kv_bytes_per_token(), ck = m.ssm_checkpoint_bytes();
  std::int64_t switches = 0, sampled_total = 0, transitions = 0, never = 0, calibrated = 0, sampled_reverts = 0;
  for (std::uint64_t seed = 1; seed <= 36; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 7919);
    adaptive_config cfg;
    cfg.candidates = {{0, 0.0}, {1, 0.0}, {1, 2.0}, {2, 0.0}};
    cfg.decay = 0.9;
    cfg.switch_margin = 0.0;
    cfg.confidence = seed % 2 == 0 ? 0.0 : 0.5;
    cfg.min_dwell = static_cast<std::int64_t>(rng() % 3);
    cfg.baseline_slack = random_slack(rng);
    const double rate = seed % 3 == 0 ? 0.25 : 0.5;
    // Floors: 0 (sampled from the start), reached part-way, never reached.
    const double floor = seed % 4 == 0 ? 0.0 : seed % 4 == 3 ? 1e6 : 1.0 + static_cast<double>(rng() % 3);
    cfg.sampling = {.rate = rate, .key_ids = 2, .min_sampled_conversations = floor};
    const std::int64_t cap = 10 * ck + 600 * kv;
    const auto small = static_cast<std::int64_t>(static_cast<double>(cap) * rate);
    marconi_adaptive_cache<> live(m, counting_store(cap, kv, ck), make_marconi_adaptive_scorer(m, cfg));
    four_caches exact(cap), sampled(small);
    auto gains = [&](four_caches& c, const seq_t& s, std::int64_t in) {
      return std::vector<double>{static_cast<double>(m.hit_flops(shadow_step(c.lru, s, in))),
                                 static_cast<double>(m.hit_flops(shadow_step(c.a0, s, in))),
                                 static_cast<double>(m.hit_flops(shadow_step(c.a2, s, in))),
                                 static_cast<double>(m.hit_flops(shadow_step(c.gdsf, s, in)))};
    };
    naive_selector rule(cfg);
    std::vector<double> warm(cfg.candidates.size(), 0.0), total(cfg.candidates.size(), 0.0);
    naive_estimate estimate{cap};
    bool sampling = floor == 0.0;
    rule.sampled_scores = sampling;
    std::int64_t since = sampling ? 0 : -1, n_sampled = 0;
    prefix_cache<cost_model, judicious_admission, lru_flop_gdsf_scorer, counting_store> follower(
        m, counting_store(cap, kv, ck), library_parts(0.0, 0));
    std::vector<seq_t> seen;
    for (int op = 0; op < 150; ++op) {
      CAPTURE(op);
      const seq_t s = conversation_seq(rng, seen, 40, 6);
      const auto in = static_cast<std::int64_t>(1 + rng() % s.size());
      const std::uint64_t key = compose::detail::conversation_key(s, std::nullopt, 2);
      const bool is_in = compose::detail::sampled(key, rate);
      // The live cache's match comes first; its selector decides before the commit.
      (void)same_request(live, follower, s, in, [&](std::int64_t reused) {
        const auto live_gain = static_cast<double>(m.hit_flops(reused));
        bool go = false;
        if (!sampling) {
          const std::vector<double> g = gains(exact, s, in);
          go = rule.observe(g, live_gain);
          for (std::size_t i = 0; i < g.size(); ++i) total[i] += g[i];
          if (is_in) {
            const std::vector<double> w = gains(sampled, s, in);
            for (std::size_t i = 0; i < w.size(); ++i) warm[i] = warm[i] * *cfg.decay + w[i];
            ++n_sampled;
            rule.calibrate(live_gain, w[0]);
          }
          estimate.observe(key, static_cast<std::int64_t>(s.size()) * kv + ck);
          if (static_cast<double>(estimate.order.size()) * rate >= floor) {  // the sampled shadows take over
            sampling = true;
            rule.sampled_scores = true;
            since = op + 1;
            rule.score = warm;
            std::fill(rule.lead.begin(), rule.lead.end(), 0.0);
            std::fill(rule.lead_sq.begin(), rule.lead_sq.end(), 0.0);
            ++transitions;
          }
        } else if (is_in) {
          const std::vector<double> g = gains(sampled, s, in);
          go = rule.observe(g, live_gain, /*exact=*/false);
          for (std::size_t i = 0; i < g.size(); ++i) total[i] += g[i] / rate;
          ++n_sampled;
        } else {
          ++rule.requests;  // counts toward min_dwell, moves no score
        }
        if (go) {
          const candidate_rule& c = cfg.candidates[rule.followed];
          REQUIRE(follower.switch_rule(c.rule, c.alpha));
          ++switches;
        }
      });
      REQUIRE(live.scorer().followed() == rule.followed);
      seen.push_back(s);
    }
    const adaptive_overhead o = live.scorer().overhead();
    for (std::size_t i = 0; i < rule.score.size(); ++i) {
      CHECK(live.scorer().scores()[i] == rule.score[i]);
      CHECK(live.scorer().shadow_flops()[i] == total[i]);
    }
    CHECK(o.live_flops == rule.live + rule.s_live);
    CHECK(o.baseline_flops == rule.base + rule.s_base);
    CHECK(o.guard_calibration == rule.kappa());
    CHECK(o.guard_reverts == rule.reverts);
    CHECK(o.guard == (!cfg.baseline_slack ? guard_state::off : rule.standing ? guard_state::on : guard_state::mismatch));
    calibrated += rule.kappa() != 1.0;
    sampled_reverts += sampling ? rule.reverts : 0;
    CHECK(o.sampled_requests == n_sampled);
    CHECK(o.sampling_since == since);
    CHECK(o.sample_rate == (sampling ? rate : 1.0));
    CHECK(o.shadows == (sampling ? 4u : 8u));  // the exact ones are freed when sampling takes over
    sampled_total += n_sampled;
    never += !sampling;
  }
  CHECK(switches > 30);
  CHECK(sampled_total > 1000);
  CHECK(transitions > 10);
  CHECK(never >= 9);
  CHECK(calibrated > 5);  // the guard's calibration is measured, not left at 1
  MESSAGE("calibrated ", calibrated, ", reverts in sampled runs ", sampled_reverts);
}

TEST_CASE("shadow sampling: bad options are refused") {
  const cost_model& m = model();
  auto make = [&](shadow_sampling_config s) { return make_marconi_adaptive_scorer(m, {.sampling = s}); };
  CHECK_THROWS_AS(make({.rate = 0.0}), invalid_argument);
  CHECK_THROWS_AS(make({.rate = -0.5}), invalid_argument);
  CHECK_THROWS_AS(make({.rate = 1.5}), invalid_argument);
  CHECK_THROWS_AS(make({.rate = std::nan("")}), invalid_argument);
  CHECK_THROWS_AS(make({.rate = 0.5, .key_ids = 0}), invalid_argument);
  CHECK_THROWS_AS(make({.rate = 0.5, .min_sampled_conversations = -1.0}), invalid_argument);
  CHECK_THROWS_AS(make({.rate = 0.5, .min_sampled_conversations = INFINITY}), invalid_argument);
  CHECK(make({.rate = 0.1}).config().sampling.rate == 0.1);
  // A sampled shadow below one checkpoint would cache nothing: refused when the cache attaches it.
  const std::int64_t ck = m.ssm_checkpoint_bytes();
  auto cache_at = [&](double rate) {
    marconi_adaptive_cache<> c(m, counting_store(10 * ck, m.kv_bytes_per_token(), ck), make({.rate = rate}));
    return c.scorer().overhead().shadows;
  };
  CHECK_THROWS_AS((void)cache_at(0.05), invalid_argument);
  CHECK(cache_at(0.2) == default_candidates().size());
}
