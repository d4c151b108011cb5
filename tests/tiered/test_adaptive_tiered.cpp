// The adaptive selector over a tiered cache (issue #15, goal 2): tier-aware shadows.
//
// - A tier-aware shadow (compose/detail/tiered_shadow.hpp: the candidate's prefix cache over
//   a metadata-only replica of the live tiered store, driven through the request lifecycle)
//   equals a naive list-based two-tier LRU on random streams of whole documents: HBM keeps
//   the most recent documents, what it evicts goes to the front of the host list, host
//   drops its least recent document, a host hit moves the document back to HBM.
// - The selector's per-candidate FLOPs over a tiered store equal those of independent
//   plain tiered caches (one per candidate, the same rule over the same tier stack).
// - On a stream where the host tier changes which rule wins, the tier-aware selector
//   follows the rule that wins in the two-tier system, the single-tier selector
//   (shadow_host_bytes = 0) does not, and the live two-tier cache saves more with the former.
// - Bad shadow_host_bytes: invalid_argument, nothing changed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/compose/adaptive_scorer.hpp"
#include "hybridcache/compose/detail/tiered_shadow.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/sim/synth_v1.hpp"
#include "hybridcache/stores/tiered_state_store.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;

namespace {

const cost_model& model() {
  static const cost_model m(presets::marconi_7b());
  return m;
}

/// A store of `hbm` bytes (+ `staging` room) over one host tier of `host` bytes; the
/// watermark cleaner off unless `cleaner`.
tiered::tiered_state_store_config store_config(std::int64_t hbm, std::int64_t host, std::int64_t staging,
                                               bool cleaner = false) {
  tiered::tiered_state_store_config c{.hbm_bytes = hbm,
                                      .host_bytes = host,
                                      .kv_bytes_per_token = model().kv_bytes_per_token(),
                                      .checkpoint_bytes = model().ssm_checkpoint_bytes(),
                                      .staging_bytes = staging};
  if (!cleaner) c.offload = {.high = 1.0, .low = 0.5};
  return c;
}

/// The obviously-right model of a two-tier LRU cache of whole documents: `hbm_docs` in
/// HBM, `host_docs` below. A request for a document returns the ids its prefill skips.
struct naive_two_tier {
  std::size_t hbm_docs, host_docs;
  std::list<int> hbm{}, host{};  // front: most recent
  bool last_from_host = false;

  static bool holds(const std::list<int>& l, int d) { return std::find(l.begin(), l.end(), d) != l.end(); }

  std::int64_t request(int d, std::int64_t len) {
    last_from_host = false;
    if (holds(hbm, d)) {
      hbm.remove(d);
      hbm.push_front(d);
      return len;
    }
    const bool from_host = holds(host, d);
    if (hbm.size() == hbm_docs) {  // room for it: the least recent goes down
      const int victim = hbm.back();
      hbm.pop_back();
      // The host drops its least recent document, never the one being read (pinned); when
      // that is all it holds, the victim has nowhere to go and is dropped.
      bool room = host.size() < host_docs;
      for (auto it = host.rbegin(); !room && it != host.rend(); ++it)
        if (*it != d) {
          host.erase(std::next(it).base());
          room = true;
        }
      if (room) host.push_front(victim);
    }
    if (from_host) host.remove(d);
    last_from_host = from_host;
    hbm.push_front(d);
    return from_host ? len : 0;
  }
};

/// Document `d`: `len` ids, its own first id (documents share nothing).
std::vector<token_id> document(int d, std::int64_t len) {
  std::vector<token_id> s(static_cast<std::size_t>(len));
  for (std::int64_t i = 0; i < len; ++i) s[static_cast<std::size_t>(i)] = static_cast<token_id>(100000 * (d + 1) + i);
  return s;
}

}  // namespace

TEST_CASE("a tier-aware shadow equals a naive two-tier LRU on random document streams") {
  const cost_model& m = model();
  const std::int64_t len = 2000;  // KV outweighs the checkpoint, so the slack below is less than a document
  const std::int64_t doc = len * m.kv_bytes_per_token() + m.ssm_checkpoint_bytes();
  std::int64_t host_hits = 0, hbm_hits = 0, misses = 0;
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    const std::size_t hbm_docs = 2 + rng() % 3, host_docs = 1 + rng() % 5;
    const int docs = 4 + static_cast<int>(rng() % 10);
    // HBM: the documents and slack for a request's reservation beyond its document (its
    // checkpoint slots: the end slot, the loaded state's), less than a document, so a
    // request evicts exactly one document when HBM is full and none otherwise.
    const auto cfg = store_config(static_cast<std::int64_t>(hbm_docs) * doc + doc / 2 + 2 * m.ssm_checkpoint_bytes(),
                                  static_cast<std::int64_t>(host_docs) * doc, 2 * doc);
    using store_t = tiered::tiered_state_store<>;
    prefix::detail::tiered_shadow<cost_model, judicious_admission, lru_scorer, store_t> shadow(
        m, store_t(cfg), lru_scorer{}, judicious_admission{}, prefix_cache_config{});
    naive_two_tier naive{hbm_docs, host_docs};
    for (int r = 0; r < 150; ++r) {
      CAPTURE(r);
      // Skewed: low-numbered documents come back more often.
      const int d = static_cast<int>(std::min<std::uint64_t>(rng() % docs, rng() % docs));
      const auto s = document(d, len);
      std::string before = "hbm";
      for (int x : naive.hbm) before += " " + std::to_string(x);
      before += " host";
      for (int x : naive.host) before += " " + std::to_string(x);
      CAPTURE(before);
      CAPTURE(d);
      CAPTURE(hbm_docs);
      CAPTURE(host_docs);
      const std::int64_t want = naive.request(d, len);
      REQUIRE(shadow.replay(s, len, std::nullopt) == want);
      (want == 0 ? misses : naive.last_from_host ? host_hits : hbm_hits) += 1;
    }
    REQUIRE(shadow.tokens() == static_cast<std::int64_t>(naive.hbm.size()) * len);
  }
  MESSAGE("misses ", misses, ", HBM hits ", hbm_hits, ", host hits ", host_hits);
  CHECK(misses > 300);
  CHECK(hbm_hits > 300);
  CHECK(host_hits > 300);
}

namespace {

using live_cache = prefix_cache<cost_model, judicious_admission, marconi_adaptive_scorer, tiered::tiered_state_store<>>;

struct selector_run {
  double live_flops = 0.0;                 ///< what the live two-tier cache saved
  std::vector<double> shadow_flops{};      ///< each candidate's shadow, over the whole stream
  std::size_t followed = 0;                ///< the candidate followed at the end
  std::int64_t switches = 0, refused = 0;
  bool tier_aware = false;
};

/// The tiered replay's request loop, one request at a time: begin (the host hit loaded),
/// finish with the replay's captured states, the cleaner; a refused request is shown to
/// the selector (observe_refused) and computed uncached.
selector_run run_selector(const std::vector<sim::synth_request>& reqs, const tiered::tiered_state_store_config& sc,
                          adaptive_config cfg) {
  const cost_model& m = model();
  live_cache cache(m, tiered::tiered_state_store<>(sc), make_marconi_adaptive_scorer(m, std::move(cfg)));
  request_lifecycle<live_cache> requests(cache);
  selector_run out;
  std::vector<token_id> seq;
  std::vector<std::int64_t> captured;
  for (const auto& q : reqs) {
    seq = q.input;
    seq.insert(seq.end(), q.output.begin(), q.output.end());
    const auto n = static_cast<std::int64_t>(seq.size());
    auto t = requests.begin(q.input, {.output_tokens = static_cast<std::int64_t>(q.output.size())});
    if (!t) {
      REQUIRE(t.error() == errc::out_of_capacity);
      ++out.refused;
      cache.observe_refused(seq, static_cast<std::int64_t>(q.input.size()));
      continue;
    }
    const auto& st = **requests.state(*t);
    out.live_flops += m.hit_flops(st.plan.prefill_start);
    captured.clear();
    for (const auto& site : st.plan.sites)
      if (site.position > st.match.reusable_tokens && site.position < n) captured.push_back(site.position);
    if (n > st.match.reusable_tokens) captured.push_back(n);
    REQUIRE(requests.wait_loaded(*t));
    REQUIRE(requests.finish(*t, seq, captured));
    (void)cache.with_store([](auto& s) { return s.offload(); });
  }
  const auto& sel = cache.scorer();
  out.shadow_flops.assign(sel.shadow_flops().begin(), sel.shadow_flops().end());
  out.followed = sel.followed();
  out.switches = sel.overhead().switches;
  out.tier_aware = sel.overhead().tier_aware;
  return out;
}

std::size_t best_of(const std::vector<double>& v) {
  return static_cast<std::size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

TEST_CASE("explore: the tier-aware selector against the single-tier one" * doctest::skip()) {
  const cost_model& m = model();
  for (int profile = 0; profile < 2; ++profile)
    for (std::uint64_t seed = 1; seed <= 4; ++seed) {
      const auto reqs = sim::generate_synth_v1({.profile = profile == 0 ? sim::synth_profile::chat : sim::synth_profile::agent,
                                                .seed = seed, .sessions = 16, .session_gap_ms = 1000});
      std::int64_t largest = 0;
      for (const auto& q : reqs) largest = std::max<std::int64_t>(largest, static_cast<std::int64_t>(q.input.size() + q.output.size()));
      for (const double gb : {0.5, 1.0, 2.0}) {
        const auto hbm = static_cast<std::int64_t>(gb * 1e9);
        const auto sc = store_config(hbm, 4 * hbm, largest * m.kv_bytes_per_token() + 2 * m.ssm_checkpoint_bytes(), true);
        const selector_run two = run_selector(reqs, sc, {});
        const selector_run one = run_selector(reqs, sc, {.shadow_host_bytes = 0});
        MESSAGE("profile ", profile, " seed ", seed, " hbm ", gb, " reqs ", reqs.size(), ": tier-aware live ", two.live_flops,
                " best ", best_of(two.shadow_flops), " followed ", two.followed, " sw ", two.switches, " | single-tier live ",
                one.live_flops, " best ", best_of(one.shadow_flops), " followed ", one.followed, " sw ", one.switches,
                " | ratio ", two.live_flops / one.live_flops, " lru2 ", two.shadow_flops[0] / two.shadow_flops[best_of(two.shadow_flops)]);
      }
    }
}
