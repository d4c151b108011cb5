// hybridcache/compose/adaptive_scorer.hpp
//
// `adaptive_scorer<Admission, Scorers...>`: eviction that follows whichever candidate rule
// has recently saved the most prefill FLOPs on the live request stream. It is a
// `utility_scorer`: put it in any `prefix_cache` (compose/bundles.hpp names the library's
// `marconi_adaptive_cache<Store>`) and drive that cache as usual — `commit`, or
// `request_lifecycle` — nothing else changes for the runtime.
//
// How it decides:
// - Candidates: (rule, alpha) pairs over the parts of a `switching_scorer<Scorers...>`
//   (the library's set: SGLang+'s leaf LRU with whole-path refresh, Marconi's FLOP-aware
//   rule at several alphas, GDSF). Only the followed part keeps its eviction index current
//   (GDSF too: its clock needs its index); a part followed again after a switch rebuilds
//   its index once (prefix/switching_scorer.hpp, `index_upkeep`).
// - Shadows: one metadata-only `prefix_cache` per candidate (a counting store: token ids
//   and byte counts, no KV, no states) with the live store's capacity and byte costs, the
//   live admission policy and a fresh copy of the candidate's scorer. Every request the
//   live cache inserts (`observe_request`, called by the cache before it changes anything)
//   is replayed on every shadow: a lookup, then the insert.
// - Tier-aware shadows. When the live store has tiers below HBM (a
//   `tiered_state_store` with a host tier), what a rule evicts from HBM is demoted, not
//   lost, and comes back from host at the cost of a load: a single-tier shadow of the HBM
//   budget would credit each rule only for what HBM keeps. So then each shadow is instead
//   the candidate's `prefix_cache` over a metadata-only replica of the live store (same HBM
//   budget, staging room, lower tiers, demotion order and sizer; compose/detail/
//   tiered_shadow.hpp), driven through the request lifecycle: its HBM evicts by the
//   candidate's rule, its victims demote below in the live demotion order, and its score
//   counts the tokens up to where prefill resumes, host hits included, as the tiered replay
//   credits FLOPs saved. `adaptive_config::shadow_host_capacity_bytes` chooses: mirror the live
//   store (the default), single-tier shadows (0), or another host size. A live store with
//   no tier below HBM gets the single-tier shadows, bit for bit as before.
// - Score: per shadow, the FLOPs its own lookups saved, decayed by `decay` per request
//   (0.995: a half-life of ~140 requests), so the ranking follows a workload that drifts.
//   Tier-aware shadows decay by 0.9995 by default (a half-life of ~1,400 requests): below
//   HBM a rule's victims are demoted, not lost, so the rules differ by a few per cent and a
//   short window's lead is mostly noise; every switch costs while the cache reshapes, so
//   following that noise lost to both rules (docs/results/tiered.md has the runs, switches
//   and FLOPs saved with either decay).
// - Sampled shadows (`adaptive_config::sampling`; SHARDS-style miniature
//   simulations): below rate 1 each candidate's shadow sees only the conversations whose
//   key (salt + first `key_ids` ids: compose/detail/shadow_sampling.hpp) hashes into a
//   fraction R, with every tier's budget x R; only those requests move the scores (and the
//   decay, so a score's memory spans 1/R times as many requests), a shadow_flops() total
//   adds each sampled FLOP / R. Why a floor: a miniature cache that holds a handful of
//   conversations ranks rules by noise, so with `min_sampled_conversations` > 0 the exact
//   shadows decide until R x (conversations the live capacity holds, estimated by an LRU
//   over keys) reaches it, the sampled ones warming up beside them; then the exact ones are
//   freed and the sampled ones decide (their warm scores carried over). Once sampled, it
//   stays sampled. Rate 1 (the default) builds no sampled shadow: bit for bit the exact
//   selector.
// - The baseline guard (`adaptive_config::baseline_slack`, 0.02 by default; after
//   conservative bandits, Wu et al., ICML 2016): switching has a price the shadows cannot see (right after a
//   switch the live cache holds what the old rule kept), and on traces where the rules nearly
//   tie, the selector paid it over and over and ended below the rule it started from. So the
//   cache reports its own hit with every request (`live_hit_observer`), and the selector sums
//   the FLOPs the live cache saved (L) and the first candidate's shadow saved (B, the baseline)
//   over the requests that move the scores. Following candidate c needs a budget
//   L - (1 - slack) B + max(0, score_c - (1 + guard_lead_margin) score_baseline) >= 0: when it
//   goes negative the live cache returns to the baseline at once (hysteresis skipped), and
//   leaves it only for a candidate whose recent lead covers the deficit. A lead over the
//   baseline counts only beyond 5 %, so a large, recent advantage (GDSF at 2-3x on small chat
//   caches) still buys a switch while near-ties do not. Not a hard floor: the guard acts after
//   the loss, so one bad stretch can take the live cache below (1 - slack) B before it returns.
//   Sampled, B is the baseline's miniature's, which saves less than the live cache on the same
//   rule: the guard compares L with k B and a lead with k x the miniatures' scores, k the live
//   cache's FLOPs over the miniature's on the sampled requests before the first switch
//   (`guard_calibration`; 1 until measured).
//   When it stands down (for good; `guard_state`): L and B agree only where the baseline
//   shadow models the live cache exactly, and then, until the first switch, they agree on
//   every request. So the first request whose live hit differs from the exact baseline
//   shadow's before any switch suspends the guard (`mismatch`: a live store the shadows only
//   approximate, as a tiered store of one tier whose pages and reservations single-tier
//   shadows do not model, where L ran 11 % below B on the same rule, ShareGPT at 1 GiB), and
//   so does a request that was in flight beside another (`overlap`: the cache passes a
//   negative live hit; a shadow replays each request whole, one at a time, while the live
//   cache's hit was taken before the others finished). Suspended, the selector switches as
//   it would without a guard (docs/prefix-cache.md, "The baseline guard", has the measurements).
// - Switching: the live cache follows the leader only when the leader's score exceeds the
//   followed candidate's by `switch_margin` (a fraction) and `min_dwell` requests have
//   passed since the last switch. Why the hysteresis: a cache's contents are shaped by the
//   rule that evicted them; right after a switch the live cache holds what the old rule
//   kept, so it does worse than the new rule's shadow, and switching back and forth on noise
//   loses to both. The first candidate (the library's: SGLang+'s rule) is followed until
//   another leads, so the selector starts at the baseline.
//
// Costs: the baseline guard adds two sums per observed request (four for a sampled one
// before the first switch: the calibration's) and an O(1) budget per
// switch decision. Each hook is the switching scorer's (the followed part's and GDSF's, O(log n) each,
// plus O(1) stamps per node for the suspended parts; a victim costs the followed part's
// select_victim; a switch one O(N + n log n) rebuild of the newly followed index). `observe_request` replays one request per
// shadow: K shadows cost about K times a metadata-only replay of the same request (the
// shadows hold the token ids they cache); a tier-aware shadow costs about what the live
// tiered cache costs per request (begin + finish of the lifecycle on a tiered store: with 6
// shadows the tiered replay's command takes 6-10x a fixed rule's, docs/results/tiered.md;
// `shadow_host_capacity_bytes = 0` keeps the cheap single-tier shadows). `overhead()` reports the
// time spent in the shadows and an estimate of their memory. Sampled, a request outside the
// sample costs one hash of `key_ids` ids (not even a clock read: once sampling, the shadow
// time counts the sampled requests only); one inside costs a replay on each shadow of
// capacity x R (while warming, both sets run and the estimate adds a hash-map probe). The
// shadows allocate (tree growth); the live cache's hot path does not.
// Not thread-safe (the live cache's lock serialises every call, shadows included).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "hybridcache/compose/adaptive_config.hpp"
#include "hybridcache/compose/detail/shadow_sampling.hpp"
#include "hybridcache/compose/detail/tiered_shadow.hpp"
#include "hybridcache/concepts/admission.hpp"
#include "hybridcache/concepts/tier_store.hpp"
#include "hybridcache/concepts/utility_scorer.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/gdsf_scorer.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/prefix/switching_scorer.hpp"
#include "hybridcache/stores/counting_store.hpp"

namespace hybridcache::compose {

/// Eviction following the candidate rule whose shadow saved the most FLOPs recently. See
/// the file comment.
template <admission_policy Admission, class... Scorers>
  requires(replicable_scorer<Scorers> && ...)
class adaptive_scorer {
  using live_type = prefix::switching_scorer<Scorers...>;
  template <class S>
  using shadow_cache = prefix::prefix_cache<cost_model, Admission, S, stores::counting_store, prefix::no_lock>;
  using shadow_ptr = std::variant<std::unique_ptr<shadow_cache<Scorers>>...>;

 public:
  /// `parts` are the live rules (their options are the shadows' too); `admission` must be
  /// the live cache's. @throws invalid_argument for an empty candidate list (after the
  /// default), a candidate naming no part or with a bad alpha, a decay outside (0, 1], a
  /// negative margin or dwell, a negative shadow_host_capacity_bytes.
  adaptive_scorer(cost_model model, live_type parts, adaptive_config cfg = {}, Admission admission = {})
      : model_(std::move(model)), live_(std::move(parts)), cfg_(std::move(cfg)), admission_(std::move(admission)) {
    if (cfg_.candidates.empty()) cfg_.candidates = default_candidates();
    for (const candidate_rule& c : cfg_.candidates)
      HYBRIDCACHE_EXPECTS(c.rule < live_.rules() && std::isfinite(c.alpha) && c.alpha >= 0.0, invalid_argument,
                          "adaptive_scorer: a candidate names no rule of the switching scorer, or has a bad alpha");
    HYBRIDCACHE_EXPECTS(!cfg_.decay || (*cfg_.decay > 0.0 && *cfg_.decay <= 1.0), invalid_argument,
                        "adaptive_scorer: decay must be in (0, 1]");
    HYBRIDCACHE_EXPECTS(cfg_.tokens_per_id >= 1, invalid_argument, "adaptive_scorer: tokens_per_id must be >= 1");
    HYBRIDCACHE_EXPECTS(cfg_.switch_margin >= 0.0 && std::isfinite(cfg_.switch_margin) && cfg_.min_dwell >= 0 &&
                            cfg_.confidence >= 0.0 && std::isfinite(cfg_.confidence),
                        invalid_argument, "adaptive_scorer: switch_margin, confidence and min_dwell must be >= 0");
    HYBRIDCACHE_EXPECTS(!cfg_.shadow_host_capacity_bytes || *cfg_.shadow_host_capacity_bytes >= 0, invalid_argument,
                        "adaptive_scorer: shadow_host_capacity_bytes must be >= 0");
    const shadow_sampling_config& smp = cfg_.sampling;
    HYBRIDCACHE_EXPECTS(smp.rate > 0.0 && smp.rate <= 1.0, invalid_argument,
                        "adaptive_scorer: sampling.rate must be in (0, 1]");
    HYBRIDCACHE_EXPECTS(smp.key_ids >= 1, invalid_argument, "adaptive_scorer: sampling.key_ids must be >= 1");
    HYBRIDCACHE_EXPECTS(smp.min_sampled_conversations >= 0.0 && std::isfinite(smp.min_sampled_conversations),
                        invalid_argument, "adaptive_scorer: sampling.min_sampled_conversations must be finite and >= 0");
    HYBRIDCACHE_EXPECTS(!cfg_.baseline_slack || (*cfg_.baseline_slack >= 0.0 && *cfg_.baseline_slack < 1.0),
                        invalid_argument, "adaptive_scorer: baseline_slack must be in [0, 1)");
    guard_ = cfg_.baseline_slack ? guard_state::on : guard_state::off;
    score_.assign(cfg_.candidates.size(), 0.0);
    total_.assign(cfg_.candidates.size(), 0.0);
    gained_.assign(cfg_.candidates.size(), 0.0);
    lead_.assign(cfg_.candidates.size(), 0.0);
    lead_sq_.assign(cfg_.candidates.size(), 0.0);
    warm_score_.assign(cfg_.candidates.size(), 0.0);
    (void)live_.switch_to(cfg_.candidates[0].rule, cfg_.candidates[0].alpha);
  }
  adaptive_scorer(adaptive_scorer&&) noexcept = default;
  adaptive_scorer& operator=(adaptive_scorer&&) = delete;

  // --- what the cache calls besides the utility_scorer hooks -----------------------------

  /// Builds the shadows with the live store's capacity and byte costs (the cache calls it
  /// once, from its constructor). A store that allows overflow, or a cache that admits
  /// oversized states (the reference's simulation), gives shadows that do the same. A
  /// tiered store with a tier below HBM gets tier-aware shadows (see the file comment and
  /// `adaptive_config::shadow_host_capacity_bytes`). @throws invalid_argument when sampling.rate x
  /// the capacity cannot hold one checkpoint, or when shadow_host_capacity_bytes
  /// > 0 and the store has no tier below HBM, or what the replica's store throws for that
  /// size; the selector is unchanged then (the shadows are built aside, then swapped in).
  template <class Store>
  void attach_store(const Store& store, const prefix::prefix_cache_config& cache_cfg) {
    const std::optional<std::int64_t>& host = cfg_.shadow_host_capacity_bytes;
    // Exact shadows at rate 1, or until the floor is reached; sampled ones below rate 1.
    const bool exact = cfg_.sampling.rate >= 1.0 || cfg_.sampling.min_sampled_conversations > 0.0;
    const bool sample = cfg_.sampling.rate < 1.0;
    // A sampled shadow that cannot hold one checkpoint caches nothing: say so, not the store.
    HYBRIDCACHE_EXPECTS(!sample || scaled(store.capacity_bytes()) >= store.checkpoint_bytes(), invalid_argument,
                        "adaptive_scorer: sampling.rate x the capacity is smaller than one checkpoint; raise the rate");
    if constexpr (replicable_tier_store<Store>) {
      if (store.tier_count() > 1 && (!host || *host > 0)) {
        auto c = store.config();
        if (host) (c.lower_tiers.empty() ? c.host_capacity_bytes : c.lower_tiers.front().capacity_bytes) = *host;
        auto cs = c;  // every tier's budget x R; the staging room is per request and stays
        cs.capacity_bytes = scaled(c.capacity_bytes);
        cs.host_capacity_bytes = scaled(c.host_capacity_bytes);
        for (auto& t : cs.lower_tiers) t.capacity_bytes = scaled(t.capacity_bytes);
        std::vector<std::unique_ptr<detail::tiered_shadow_base>> built, built_sampled;
        for (const candidate_rule& rule : cfg_.candidates) {
          if (exact) built.push_back(make_tiered_shadow(rule, store.metadata_replica(c), cache_cfg));
          if (sample) built_sampled.push_back(make_tiered_shadow(rule, store.metadata_replica(cs), cache_cfg));
        }
        tiered_.swap(built);
        sampled_tiered_.swap(built_sampled);
        shadows_.clear();
        sampled_.clear();
        start_phase(true, store.capacity_bytes(), store.kv_bytes(1), store.checkpoint_bytes());
        return;
      }
    }
    HYBRIDCACHE_EXPECTS(!host || *host == 0, invalid_argument,
                        "adaptive_scorer: shadow_host_capacity_bytes > 0 needs a live store with a tier below HBM");
    std::vector<shadow_ptr> built, built_sampled;
    for (const candidate_rule& c : cfg_.candidates) {
      if (exact) {
        stores::counting_store st(store.capacity_bytes(), store.kv_bytes(1), store.checkpoint_bytes());
        st.allow_overflow(cache_cfg.admit_oversized);
        built.push_back(make_shadow(c, std::move(st), cache_cfg));
      }
      if (sample) {
        stores::counting_store st(scaled(store.capacity_bytes()), store.kv_bytes(1), store.checkpoint_bytes());
        st.allow_overflow(cache_cfg.admit_oversized);
        built_sampled.push_back(make_shadow(c, std::move(st), cache_cfg));
      }
    }
    shadows_.swap(built);
    sampled_.swap(built_sampled);
    tiered_.clear();
    sampled_tiered_.clear();
    start_phase(false, store.capacity_bytes(), store.kv_bytes(1), store.checkpoint_bytes());
  }

  /// Replays one request (input ++ output, `input_tokens` long input) on every shadow,
  /// updates the scores and, when the leader clears the hysteresis, switches the live rule.
  ///
  /// Sampled shadows (`sampling.rate` < 1): the request's conversation key decides whether
  /// the sampled shadows replay it; only those requests move the scores (and the decay), so a
  /// request outside the sample costs one hash. Before the floor is reached the exact
  /// shadows decide as above, the sampled ones warming up beside them; from then on the
  /// sampled ones alone (their warm scores carried over, the paired test restarted).
  ///
  /// `live_reused`: the ids the live cache's own prefill skipped on this request (the cache
  /// passes it; `live_hit_observer`), which the baseline guard counts; negative
  /// (`live_hit_not_comparable`): another request was in flight, and the guard is suspended
  /// for good. The three-argument form is for a caller that does not know the hit: that
  /// request moves the scores, not the guard.
  void observe_request(std::span<const token_id> sequence, std::int64_t input_tokens, const cache_salt& salt,
                       std::int64_t live_reused) {
    if (live_reused < 0 && guard_ == guard_state::on) suspend_guard(guard_state::overlap);
    observe(sequence, input_tokens, salt, live_reused < 0 ? live_hit_unknown : live_reused);
  }
  void observe_request(std::span<const token_id> sequence, std::int64_t input_tokens, const cache_salt& salt) {
    observe(sequence, input_tokens, salt, live_hit_unknown);
  }

  /// A request the live lifecycle refused at begin (too large beside what was pinned; the
  /// runtime computed it uncached): tier-aware shadows replay it as `observe_request` does
  /// (they run the lifecycle on their own contents and may have room for it; without it, a
  /// rule under which the live cache refuses a request is credited as if the request never
  /// came, and the ranking depends on the rule followed). Single-tier shadows, which model
  /// the commit path (whose refused requests `observe_request` already sees), ignore it.
  void observe_refused(std::span<const token_id> sequence, std::int64_t input_tokens, const cache_salt& salt) {
    if (tier_aware_) observe(sequence, input_tokens, salt, 0);  // computed uncached: the live cache saved nothing
  }

  // --- utility_scorer: the live rule ------------------------------------------------------

  void reserve(std::size_t ids) { live_.reserve(ids); }
  template <class Tree>
  void on_match(Tree& tree, std::span<const node_id> path, node_id partial, time_point now) noexcept {
    live_.on_match(tree, path, partial, now);
  }
  template <class Tree>
  void on_insert_path(Tree& tree, std::span<const node_id> path, time_point now) noexcept {
    live_.on_insert_path(tree, path, now);
  }
  template <class Tree>
  void on_update(const Tree& tree, node_id n) noexcept {
    live_.on_update(tree, n);
  }
  template <class Tree>
  void on_erase(const Tree& tree, node_id n) noexcept {
    live_.on_erase(tree, n);
  }
  template <class Tree>
  [[nodiscard]] node_id select_victim(const Tree& tree, time_point now) noexcept {
    return live_.select_victim(tree, now);
  }
  template <class Tree>
  [[nodiscard]] evict_action action(const Tree& tree, node_id n) const noexcept {
    return live_.action(tree, n);
  }
  /// The followed candidate's FLOP weight (0 for a rule without one).
  [[nodiscard]] double alpha() const noexcept { return live_.alpha(); }
  [[nodiscard]] bool takes_inner_nodes() const noexcept { return live_.takes_inner_nodes(); }
  [[nodiscard]] bool protects_branches() const noexcept { return live_.protects_branches(); }

  // --- observers --------------------------------------------------------------------------

  [[nodiscard]] const adaptive_config& config() const noexcept { return cfg_; }
  [[nodiscard]] const live_type& live() const noexcept { return live_; }
  /// The per-request decay in use: `config().decay`, or its default for the shadows built.
  [[nodiscard]] double decay() const noexcept {
    return cfg_.decay.value_or(tier_aware_ ? tier_aware_decay : single_tier_decay);
  }
  /// The candidate the live cache follows (an index into config().candidates).
  [[nodiscard]] std::size_t followed() const noexcept { return followed_; }
  /// Each candidate's decayed FLOPs-saved score.
  [[nodiscard]] std::span<const double> scores() const noexcept { return score_; }
  /// FLOPs each candidate's shadow saved over every request observed (what that rule,
  /// followed throughout, would have saved: the selector's regret is measured against it).
  [[nodiscard]] std::span<const double> shadow_flops() const noexcept { return total_; }
  /// Time and memory the shadows cost, and what the selector did. O(shadow nodes).
  [[nodiscard]] adaptive_overhead overhead() const {
    adaptive_overhead o;
    o.requests = requests_;
    o.switches = switches_;
    o.followed = followed_;
    o.shadows = shadows_.size() + tiered_.size() + sampled_.size() + sampled_tiered_.size();
    o.shadow_seconds = shadow_seconds_;
    o.tier_aware = tier_aware_;
    o.sample_rate = phase_ == phase::sampled ? cfg_.sampling.rate : 1.0;
    o.sampled_requests = sampled_requests_;
    o.sampling_since = sampling_since_;
    o.live_flops = live_flops_ + sampled_live_flops_;
    o.baseline_flops = baseline_flops_ + sampled_baseline_flops_;
    o.guard_calibration = calibration();
    o.guard_reverts = guard_reverts_;
    o.guard = guard_;
    o.guard_suspended_at = guard_suspended_at_;
    for (const auto* v : {&tiered_, &sampled_tiered_})
      for (const auto& t : *v) {
        o.shadow_nodes += t->nodes();
        o.shadow_tokens += t->tokens();
        o.shadow_bytes += t->bytes();
      }
    for (const auto* v : {&shadows_, &sampled_})
      for (const auto& s : *v)
        std::visit(
          [&](const auto& c) {
            const auto& tree = c->tree();
            o.shadow_nodes += static_cast<std::int64_t>(tree.size());
            o.shadow_tokens += c->tokens_cached();
            o.shadow_bytes += static_cast<std::int64_t>(sizeof(*c)) + c->memory_bytes();
          },
          s);
    o.shadow_bytes += estimate_.memory_bytes() + own_bytes();
    return o;
  }
  /// The live rule's heap bytes (every part's index and stamp table: what the live cache's
  /// scorer holds; the shadows are in overhead().shadow_bytes). O(1).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept { return live_.memory_bytes(); }

 private:
  template <std::size_t I = 0>
  shadow_ptr make_shadow(const candidate_rule& c, stores::counting_store&& st, const prefix::prefix_cache_config& cache_cfg) {
    if constexpr (I < sizeof...(Scorers)) {
      if (c.rule != I) return make_shadow<I + 1>(c, std::move(st), cache_cfg);
      using S = std::tuple_element_t<I, std::tuple<Scorers...>>;
      S scorer = live_.template part<I>().replica();
      if constexpr (alpha_settable_scorer<S>) scorer.set_alpha(c.alpha);
      return shadow_ptr(std::in_place_index<I>, std::make_unique<shadow_cache<S>>(model_, std::move(st), std::move(scorer),
                                                                                   admission_, cache_cfg));
    } else {
      throw invalid_argument("adaptive_scorer: candidate rule out of range");
    }
  }

  template <class Store, std::size_t I = 0>
  std::unique_ptr<detail::tiered_shadow_base> make_tiered_shadow(const candidate_rule& c, Store&& st,
                                                                  const prefix::prefix_cache_config& cache_cfg) {
    if constexpr (I < sizeof...(Scorers)) {
      if (c.rule != I) return make_tiered_shadow<Store, I + 1>(c, std::move(st), cache_cfg);
      using S = std::tuple_element_t<I, std::tuple<Scorers...>>;
      S scorer = live_.template part<I>().replica();
      if constexpr (alpha_settable_scorer<S>) scorer.set_alpha(c.alpha);
      return std::make_unique<detail::tiered_shadow<cost_model, Admission, S, Store>>(model_, std::move(st),
                                                                                     std::move(scorer), admission_, cache_cfg);
    } else {
      throw invalid_argument("adaptive_scorer: candidate rule out of range");
    }
  }

  /// observe_request's body (live_reused < 0: not known).
  void observe(std::span<const token_id> sequence, std::int64_t input_tokens, const cache_salt& salt,
               std::int64_t live_reused) {
    if (phase_ == phase::none || sequence.empty()) return;
    const auto input = sequence.first(static_cast<std::size_t>(std::clamp<std::int64_t>(
        input_tokens, 1, static_cast<std::int64_t>(sequence.size()))));
    if (phase_ == phase::sampled) {  // outside the sample: one hash, not even a clock read
      ++requests_;
      if (!detail::sampled(detail::conversation_key(sequence, salt, cfg_.sampling.key_ids), cfg_.sampling.rate)) return;
      const auto t0 = std::chrono::steady_clock::now();
      replay_all(sampled_, sampled_tiered_, sequence, input, input_tokens, salt);
      account(score_, cfg_.sampling.rate, live_reused);
      ++sampled_requests_;
      follow_leader();
      shadow_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (phase_ == phase::warming) {
      const std::uint64_t key = detail::conversation_key(sequence, salt, cfg_.sampling.key_ids);
      const bool in = detail::sampled(key, cfg_.sampling.rate);
      replay_all(shadows_, tiered_, sequence, input, input_tokens, salt);
      account(score_, 1.0, live_reused);
      ++requests_;
      follow_leader();
      if (in) {
        replay_all(sampled_, sampled_tiered_, sequence, input, input_tokens, salt);
        for (std::size_t i = 0; i < warm_score_.size(); ++i) warm_score_[i] = warm_score_[i] * decay() + gained_[i];
        ++sampled_requests_;
        calibrate(live_reused);
      }
      estimate_.observe(key, static_cast<std::int64_t>(sequence.size()) * kv_per_id_ + checkpoint_bytes_);
      if (static_cast<double>(estimate_.held()) * cfg_.sampling.rate >= cfg_.sampling.min_sampled_conversations)
        begin_sampling();
    } else {
      replay_all(shadows_, tiered_, sequence, input, input_tokens, salt);
      account(score_, 1.0, live_reused);
      ++requests_;
      follow_leader();
    }
    shadow_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  /// The baseline guard's budget for following candidate `c`: how far the live cache is above
  /// (1 - slack) x the baseline shadow's FLOPs saved (its miniature's x calibration() on the
  /// sampled requests), plus c's recent lead over the baseline beyond `guard_lead_margin`
  /// (what following c is expected to win back). Without a guard, +infinity.
  [[nodiscard]] double guard_budget(std::size_t c) const noexcept {
    if (guard_ != guard_state::on) return std::numeric_limits<double>::infinity();
    const double keep = 1.0 - *cfg_.baseline_slack;
    const double scale = calibration();
    // The scores are the miniatures' once sampling decides: in the live cache's units, x scale.
    const double lead_units = phase_ == phase::sampled ? scale : 1.0;
    return live_flops_ - keep * baseline_flops_ + sampled_live_flops_ - keep * scale * sampled_baseline_flops_ +
           lead_units * std::max(0.0, score_[c] - (1.0 + guard_lead_margin) * score_[0]);
  }

  /// The sampled baseline's calibration: the live cache's FLOPs saved over its miniature's on
  /// the sampled requests observed while the live cache followed the baseline's rule from the
  /// start (before the first switch); 1 until that miniature saved anything.
  [[nodiscard]] double calibration() const noexcept {
    return calibration_baseline_ > 0.0 ? calibration_live_ / calibration_baseline_ : 1.0;
  }

  /// A sampled request's live hit against the baseline miniature's (gained_[0]), before the
  /// first switch: the calibration's sums.
  void calibrate(std::int64_t live_reused) noexcept {
    if (guard_ != guard_state::on || live_reused < 0 || switches_ != 0) return;
    calibration_live_ += hit_flops(live_reused);
    calibration_baseline_ += gained_[0];
  }

  /// The selector's own arrays (scores, the shadow lists): part of what the shadows cost.
  [[nodiscard]] std::int64_t own_bytes() const noexcept {
    using prefix::detail::heap_bytes;
    return heap_bytes(score_) + heap_bytes(total_) + heap_bytes(gained_) + heap_bytes(lead_) + heap_bytes(lead_sq_) +
           heap_bytes(warm_score_) + heap_bytes(shadows_) + heap_bytes(tiered_) + heap_bytes(sampled_) +
           heap_bytes(sampled_tiered_) + heap_bytes(cfg_.candidates) + heap_bytes(model_);
  }

  /// `bytes` x the sampling rate (a sampled shadow's budget).
  [[nodiscard]] std::int64_t scaled(std::int64_t bytes) const noexcept {
    return static_cast<std::int64_t>(static_cast<double>(bytes) * cfg_.sampling.rate);
  }

  /// After the shadows are built: which of them decide, and the estimate's byte costs.
  void start_phase(bool tier_aware, std::int64_t capacity, std::int64_t kv_per_id, std::int64_t checkpoint) {
    tier_aware_ = tier_aware;
    kv_per_id_ = kv_per_id;
    checkpoint_bytes_ = checkpoint;
    if (cfg_.sampling.rate >= 1.0) {
      phase_ = phase::exact;
    } else if (cfg_.sampling.min_sampled_conversations > 0.0) {
      phase_ = phase::warming;
      estimate_ = detail::conversation_estimate(capacity);
    } else {
      phase_ = phase::sampled;
      sampling_since_ = 0;
    }
  }

  /// The floor is reached: the sampled shadows decide from now on, with the scores they
  /// earned while warming; the exact shadows and the estimate are freed.
  void begin_sampling() {
    phase_ = phase::sampled;
    sampling_since_ = requests_;
    score_ = warm_score_;
    std::fill(lead_.begin(), lead_.end(), 0.0);
    std::fill(lead_sq_.begin(), lead_sq_.end(), 0.0);
    shadows_.clear();
    tiered_.clear();
    estimate_ = detail::conversation_estimate();
  }

  /// One request on every shadow of one set (single-tier or tier-aware): gained_[i] = the
  /// FLOPs shadow i's lookup saved.
  void replay_all(std::vector<shadow_ptr>& single, std::vector<std::unique_ptr<detail::tiered_shadow_base>>& tiered,
                  std::span<const token_id> sequence, std::span<const token_id> input, std::int64_t input_tokens,
                  const cache_salt& salt) {
    for (std::size_t i = 0; i < gained_.size(); ++i) {
      const std::int64_t reused =
          tiered.empty()
              ? std::visit([&](auto& c) { return replay_one(*c, sequence, input, input_tokens, salt); }, single[i])
              : tiered[i]->replay(sequence, input_tokens, salt);
      gained_[i] = hit_flops(reused);
    }
  }

  /// gained_ into the scores and the paired test; `rate` scales shadow_flops() to the whole
  /// stream (1 for exact shadows: x / 1.0 is x, so the exact path is bit for bit as before).
  /// With a guard, the live cache's hit (`live_reused` ids; < 0: not known, not counted) and
  /// the baseline shadow's go into its sums.
  void account(std::vector<double>& score, double rate, std::int64_t live_reused) {
    const double keep = decay();  // per request (per sampled request for sampled shadows)
    for (std::size_t i = 0; i < score.size(); ++i) {
      score[i] = score[i] * keep + gained_[i];
      total_[i] += gained_[i] / rate;
    }
    for (std::size_t i = 0; i < score.size(); ++i) {  // paired with the followed candidate
      const double d = (gained_[i] - gained_[followed_]) * 1e-12;  // scaled: squares stay finite
      lead_[i] = lead_[i] * keep + d;
      lead_sq_[i] = lead_sq_[i] * keep * keep + d * d;
    }
    if (guard_ == guard_state::on && live_reused >= 0) {  // the guard's sums, same requests
      const double live = hit_flops(live_reused);
      if (rate < 1.0) {  // the baseline's miniature: compared x calibration() (guard_budget)
        sampled_live_flops_ += live;
        sampled_baseline_flops_ += gained_[0];
        calibrate(live_reused);
        return;
      }
      // Until the first switch the live cache has followed the baseline's rule throughout,
      // so an exact baseline shadow that models it finds the same hit on every request.
      // One that does not (another store: pages, reservations, one tier of a tiered store)
      // would bias the sums: the guard stands down.
      if (switches_ == 0 && live != gained_[0]) return suspend_guard(guard_state::mismatch);
      live_flops_ += live;
      baseline_flops_ += gained_[0];
    }
  }

  /// One request on one shadow: the ids its lookup reuses, then its insert (a refused
  /// insert releases the lookup: the shadow simply does not cache that request).
  template <class Cache>
  static std::int64_t replay_one(Cache& c, std::span<const token_id> sequence, std::span<const token_id> input,
                                 std::int64_t input_tokens, const cache_salt& salt) {
    auto m = c.match(input, salt);
    if (!m) return 0;
    const std::int64_t reused = m->reusable_tokens;
    auto r = c.commit(sequence, input_tokens, &*m);
    if (!r) (void)c.release(*m);
    return reused;
  }

  /// FLOPs a hit on `ids` ids saves, in real tokens.
  [[nodiscard]] double hit_flops(std::int64_t ids) const noexcept {
    if (ids <= 0) return 0.0;
    try {
      return model_.hit_flops(ids * cfg_.tokens_per_id);
    } catch (...) {  // overflow_error only far beyond any sequence a cache holds
      return 0.0;
    }
  }

  void follow_leader() noexcept {
    if (followed_ != 0 && guard_budget(followed_) < 0.0) {
      // The followed rule's recent lead over the baseline no longer covers how far the live
      // cache is behind the baseline's floor: back to the baseline at once.
      if (follow(0)) ++guard_reverts_;
      return;
    }
    std::size_t lead = followed_;
    for (std::size_t i = 0; i < score_.size(); ++i)
      if (score_[i] > score_[lead]) lead = i;
    if (lead == followed_) return;
    if (requests_ - last_switch_ < cfg_.min_dwell) return;
    if (!(score_[lead] > score_[followed_] * (1.0 + cfg_.switch_margin))) return;
    if (!(lead_[lead] > cfg_.confidence * std::sqrt(lead_sq_[lead]))) return;
    if (lead != 0 && guard_budget(lead) < 0.0) return;  // a switch the guard cannot afford
    (void)follow(lead);
  }

  /// The guard stands down for good: its sums stop, its budget is unbounded.
  void suspend_guard(guard_state why) noexcept {
    guard_ = why;
    guard_suspended_at_ = requests_;
  }

  /// Switches the live rule to candidate `c`; false (nothing changed) when the switching scorer
  /// refuses it.
  bool follow(std::size_t c) noexcept {
    if (!live_.switch_to(cfg_.candidates[c].rule, cfg_.candidates[c].alpha)) return false;
    followed_ = c;
    last_switch_ = requests_;
    ++switches_;
    std::fill(lead_.begin(), lead_.end(), 0.0);  // a new test against the new followed one
    std::fill(lead_sq_.begin(), lead_sq_.end(), 0.0);
    return true;
  }

  cost_model model_;
  live_type live_;
  adaptive_config cfg_;
  Admission admission_;
  // none: not attached; exact: exact shadows only (rate 1); warming: exact ones decide, the
  // sampled ones run beside them until the floor; sampled: sampled ones only.
  enum class phase : std::uint8_t { none, exact, warming, sampled };
  std::vector<shadow_ptr> shadows_;                                 // exact single-tier shadows, or
  std::vector<std::unique_ptr<detail::tiered_shadow_base>> tiered_;  // tier-aware ones
  std::vector<shadow_ptr> sampled_;                                 // the same at capacity x R
  std::vector<std::unique_ptr<detail::tiered_shadow_base>> sampled_tiered_;
  phase phase_ = phase::none;
  bool tier_aware_ = false;
  detail::conversation_estimate estimate_;  // while warming
  std::int64_t kv_per_id_ = 0;
  std::int64_t checkpoint_bytes_ = 0;
  std::vector<double> warm_score_;  // the sampled shadows' scores while warming
  std::int64_t sampled_requests_ = 0;
  std::int64_t sampling_since_ = -1;
  std::vector<double> score_;
  std::vector<double> total_;
  std::vector<double> gained_;   // this request's FLOPs per shadow (scratch)
  std::vector<double> lead_;     // decayed sum of (gain - followed's gain), x 1e-12
  std::vector<double> lead_sq_;  // decayed sum of its squares
  std::size_t followed_ = 0;
  std::int64_t requests_ = 0;
  std::int64_t last_switch_ = 0;
  std::int64_t switches_ = 0;
  double shadow_seconds_ = 0.0;
  double live_flops_ = 0.0;      // the baseline guard: the live cache's FLOPs saved
  double baseline_flops_ = 0.0;  // ... and the baseline shadow's, on the same requests
  double sampled_live_flops_ = 0.0;      // the same once sampled shadows decide: the live
  double sampled_baseline_flops_ = 0.0;  // cache's, and the baseline miniature's (unscaled)
  double calibration_live_ = 0.0;        // calibration(): sampled requests before the first
  double calibration_baseline_ = 0.0;    // switch, the live cache's and the miniature's
  std::int64_t guard_reverts_ = 0;
  guard_state guard_ = guard_state::off;  // on with a slack; once it stands down, for good
  std::int64_t guard_suspended_at_ = -1;
  static constexpr std::int64_t live_hit_unknown = -1;  // observe(): the live hit is not counted
};

/// The library's adaptive Marconi scorer: judicious admission's shadows over SGLang+'s LRU,
/// Marconi's FLOP-aware rule and GDSF.
using marconi_adaptive_scorer = adaptive_scorer<prefix::judicious_admission, prefix::lru_scorer, prefix::flop_aware_scorer, prefix::gdsf_scorer>;

/// `marconi_adaptive_scorer` with the library's parts: LRU (node-id ties), the FLOP-aware
/// rule with its defaults (branch points protected, the bounded walk: O(log n) per victim
/// with a constant factor), GDSF; `cfg` as given (default candidates when empty).
[[nodiscard]] inline marconi_adaptive_scorer make_marconi_adaptive_scorer(const cost_model& model,
                                                                          adaptive_config cfg = {}) {
  return marconi_adaptive_scorer(
      model,
      prefix::lru_flop_gdsf_scorer(prefix::lru_scorer{}, prefix::flop_aware_scorer(model),
                           prefix::gdsf_scorer(model)),
      std::move(cfg));
}

static_assert(utility_scorer<marconi_adaptive_scorer, prefix::radix_tree<state_store_archetype>>);
static_assert(request_observer<marconi_adaptive_scorer> && live_hit_observer<marconi_adaptive_scorer>);
static_assert(refusal_observer<marconi_adaptive_scorer> && inner_node_reporting_scorer<marconi_adaptive_scorer> &&
              branch_protecting_scorer<marconi_adaptive_scorer> && reservable_scorer<marconi_adaptive_scorer> &&
              store_aware_scorer<marconi_adaptive_scorer, stores::counting_store, prefix::prefix_cache_config>);

}  // namespace hybridcache::compose
