// hybridcache/sim/tiered_replay.hpp
//
// The timed multi-tier replay: what a tiered prefix cache buys in modelled TTFT on a real
// trace, and what each of CaR's mechanisms contributes (papers/003). It drives the
// library's one multi-tier cache, `prefix_cache<cost_model, Admission, Scorer,
// tiered_state_store<...>>`, through the request lifecycle exactly as a runtime would;
// only the copies are modelled (`timed_copy_engine`), so the same code decides what is
// hit, loaded, demoted and dropped.
//
// The modelled server is a pool of `prefill_engines` prefill engines fed by one queue
// (FCFS or CaR's cache-aware queue); the engine that frees first takes the next request.
// They share the cache (the HBM tier is the pool's HBM); each engine has its own links to
// the lower tiers. Per dispatched request (times in ms):
//   begin      the HBM match, the hit below HBM (KV the tree lacks + one checkpoint), and
//              the reservation of the pages prefill writes. A lower-tier hit is loaded only
//              when the pipelined load beats recomputing those tokens (`recompute_when_faster`);
//              a request that does not fit beside the requests still decoding waits for the
//              next of them to end. An allocation that needs HBM pages a write-back still
//              holds waits for it (a stall).
//   load       the bytes the request needs cross its engine's link (queued behind earlier
//              copies), layer by layer in model order; a copy already in flight for the same
//              bytes (a prefetch, another request) is joined, not repeated.
//   compute    prefill time of the tokens after the resume point (prefill_time.hpp), split
//              over the mixer layers in proportion to their FLOPs; a full hit computes the
//              last token. With layer-wise loading, layer l computes once layer l's bytes
//              are in; without, once all are.
//   finish     when its prefill ends, the request's sequence (prompt and output ids) is
//              inserted (decode runs on the decode pool, prefill/decode disaggregated as in
//              Mooncake); the store names it, so what the cache evicts later is written
//              back (write-back), or was copied down earlier (write-through, the cleaner
//              above the high watermark), and loads again from below.
//   prefetch   the next requests' hits may be loaded before dispatch: `deadline` (CaR) or
//              `threshold` (HiCache, >= 256 tokens).
//   TTFT       end of the last layer's compute − arrival (queueing + stalls + exposed load +
//              prefill).
//
// Requests use the sim representation (sim/request.hpp): `input` ids, each standing for
// `tokens_per_id` tokens (Mooncake's 512-token blocks, or 1); the store's bytes are per id.
// Cost: the prefix cache's costs per request, plus O(copies) for the timed engine.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/model/prefill_time.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/sim/detail/tiered_replayer.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/tiered_replay_options.hpp"
#include "hybridcache/stores/tiered_state_store.hpp"
#include "hybridcache/tiered/car_score.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"
#include "hybridcache/tiered/sparsify.hpp"

namespace hybridcache::sim {

namespace detail {

/// The order of victims below HBM in a replay, chosen at run time (one instantiation): LRU,
/// FLOP-aware (`flop_aware_demotion`) on the entry's span scaled from ids to tokens, or the
/// table's CaR score (`car_score_demotion`; LRU among equal scores).
class replay_demotion {
 public:
  replay_demotion(const cost_model& m, demotion_kind k, std::int64_t per_id) : per_id_(per_id), car_(k == demotion_kind::car) {
    if (k == demotion_kind::flop_aware) flop_.emplace(m);
  }
  [[nodiscard]] demotion_key key(const cache_entry& e) const {
    if (car_) return tiered::car_score_demotion{}.key(e);
    if (!flop_) return tiered::lru_demotion{}.key(e);
    cache_entry s = e;
    s.info.prefix_begin *= per_id_;
    s.info.prefix_end *= per_id_;
    return flop_->key(s);
  }

 private:
  std::optional<tiered::flop_aware_demotion> flop_;
  std::int64_t per_id_;
  bool car_;
};
static_assert(demotion_scorer<replay_demotion>);

/// How many bytes a written-back KV entry keeps in a replay, chosen at run time: all of
/// them, or CaR's sparsification (`sparsify_on_demotion`) on the span in tokens.
class replay_sizer {
 public:
  replay_sizer() = default;
  replay_sizer(std::optional<tiered::sparsify_on_demotion> s, std::int64_t per_id) : sparsify_(std::move(s)), per_id_(per_id) {}
  [[nodiscard]] std::int64_t stored_bytes(const cache_entry& e) const {
    if (!sparsify_) return e.bytes();
    cache_entry s = e;
    s.info.prefix_begin *= per_id_;
    s.info.prefix_end *= per_id_;
    return sparsify_->stored_bytes(s);
  }

 private:
  std::optional<tiered::sparsify_on_demotion> sparsify_;
  std::int64_t per_id_ = 1;
};
static_assert(demotion_sizer<replay_sizer>);

/// The store configuration of a replay: HBM split into the cache's budget and the staging
/// room (only when there is a tier below: `staging_fraction` of HBM, raised to hold the
/// largest request's KV and checkpoint, at most half of HBM), the lower tiers, the layout
/// per id.
inline stores::tiered_state_store_config replay_store_config(const cost_model& m, const tiered_replay_options& o,
                                                     std::int32_t per_id, std::int64_t largest_request_bytes = 0) {
  HYBRIDCACHE_EXPECTS(!o.tiers.empty(), invalid_argument, "tiered replay: at least the hbm tier is required");
  HYBRIDCACHE_EXPECTS(!o.link_gbps || *o.link_gbps > 0.0, invalid_argument,
                      "tiered replay: link bandwidth must be > 0 GB/s");
  HYBRIDCACHE_EXPECTS(o.staging_fraction > 0.0 && o.staging_fraction < 1.0, invalid_argument,
                      "tiered replay: staging_fraction must be in (0, 1)");
  stores::tiered_state_store_config c;
  const std::int64_t hbm = o.tiers.front().capacity_bytes;
  const bool lower = o.tiers.size() > 1;
  c.staging_bytes = lower ? std::min(std::max(static_cast<std::int64_t>(static_cast<double>(hbm) * o.staging_fraction),
                                               largest_request_bytes),
                                      hbm / 2)
                          : 0;
  c.capacity_bytes = hbm - c.staging_bytes;
  for (std::size_t t = 1; t < o.tiers.size(); ++t) {
    tiered::tier_config x = o.tiers[t];
    // --link-gbps is the memory tiers' link; a storage tier or a tier's own :gbps= keeps its own.
    if (o.link_gbps && !tiered::is_storage(x.kind) && !x.link_gbps_given) x.link_gbps = *o.link_gbps;
    c.lower_tiers.push_back(x);
  }
  c.kv_bytes_per_token = m.kv_bytes_per_token() * per_id;
  c.checkpoint_bytes = m.ssm_checkpoint_bytes();
  c.attention_layers = static_cast<std::int32_t>(std::max<std::int64_t>(m.attention_layers(), 1));
  c.recurrent_layers = static_cast<std::int32_t>(std::max<std::int64_t>(m.recurrent_layers(), 1));
  c.write = o.write;
  c.write_through_hits = o.write_through_hits;
  c.offload = o.marks;
  return c;
}

// One replay over an engine of type `Engine` (a timed_copy_engine, or one derived from it
// that also moves bytes) made by `make_engine(tiers, page, timed options)` (a unique_ptr).
template <class Engine, class Admission, class Scorer, prefill_time_model Prefill, class MakeEngine>
tiered_replay_result replay_with(std::span<const sim::request> requests, const cost_model& model,
                                 const tiered_replay_options& o, Scorer scorer, Admission admission,
                                 const Prefill& prefill, std::int32_t per_id, std::size_t engines,
                                 MakeEngine&& make_engine) {
  using store_t = stores::tiered_state_store<replay_demotion, Engine, replay_sizer>;
  using cache_t = prefix::prefix_cache<cost_model, Admission, Scorer, store_t>;
  static_assert(utility_scorer<tiered::car_scorer, typename cache_t::tree_type>);
  // CaR's board is driven by the replay's scheduler events; the scorer reads it.
  constexpr bool car_scorer = std::same_as<Scorer, tiered::car_scorer>;
  HYBRIDCACHE_EXPECTS((o.demotion == demotion_kind::car) == car_scorer, invalid_argument,
                      "tiered replay: demotion car takes a tiered::car_scorer as the HBM scorer, and a car_scorer "
                      "takes demotion car");
  std::int64_t largest = 0;
  for (const auto& q : requests)
    largest = std::max(largest, model.kv_bytes_per_token() * per_id * static_cast<std::int64_t>(q.input.size()));
  const stores::tiered_state_store_config cfg = replay_store_config(model, o, per_id, largest + model.ssm_checkpoint_bytes());
  std::optional<tiered::sparsify_on_demotion> sparsify;
  if (o.sparsify == sparsify_kind::profile && model.attention_layers() > 0)
    sparsify.emplace(model,
                     o.profile.sparsity.empty() ? tiered::sparsity_profile::car_linear(model.attention_layers()) : o.profile,
                     o.sparsify_opts);
  std::unique_ptr<Engine> engine = make_engine(store_t::tiers_for(cfg), store_t::page_bytes_for(cfg),
                                               sim::timed_copy_options{.links = engines, .per_copy_us = o.per_copy_overhead_us});
  cache_t cache(model,
                store_t(cfg, *engine, replay_sizer(std::move(sparsify), per_id),
                        replay_demotion(model, o.demotion, per_id)),
                std::move(scorer), std::move(admission));
  tiered_replayer<cache_t, Prefill> rp(cache, *engine, model, prefill, o, engines, per_id);
  tiered_replay_result r = rp.run(requests);
  if constexpr (requires { engine->real_stats(); }) r.real = engine->real_stats();
  if constexpr (requires { cache.scorer().overhead().tier_aware; }) {
    const auto sel = cache.scorer().overhead();
    r.selector_shadow_seconds = sel.shadow_seconds;
    r.selector_shadow_bytes = sel.shadow_bytes;
    r.selector_switches = sel.switches;
    r.selector_guard_reverts = sel.guard_reverts;
    r.selector_guard = sel.guard;
    r.selector_guard_suspended_at = sel.guard_suspended_at;
    r.selector_tier_aware = sel.tier_aware;
    const auto& followed = cache.scorer().config().candidates[cache.scorer().followed()];
    r.selector_followed_rule = followed.rule;
    r.selector_followed_alpha = followed.alpha;
  }
  return r;
}

template <class Admission, class Scorer, prefill_time_model Prefill>
tiered_replay_result replay_with(std::span<const sim::request> requests, const cost_model& model,
                                 const tiered_replay_options& o, Scorer scorer, Admission admission,
                                 const Prefill& prefill, std::int32_t per_id, std::size_t engines) {
  return replay_with<sim::timed_copy_engine>(
      requests, model, o, std::move(scorer), std::move(admission), prefill, per_id, engines,
      [](std::vector<tiered::tier_config> t, std::int64_t page, sim::timed_copy_options to) {
        return std::make_unique<sim::timed_copy_engine>(std::move(t), page, to);
      });
}

// The checks every public entry point makes; returns the prefill engines to use.
template <prefill_time_model Prefill>
std::size_t checked_engines(std::span<const sim::request> requests, const tiered_replay_options& options,
                            const Prefill& prefill) {
  HYBRIDCACHE_EXPECTS(options.per_copy_overhead_us >= 0, invalid_argument, "tiered replay: per_copy_overhead_us must be >= 0");
  HYBRIDCACHE_EXPECTS(options.arrival_time_scale > 0, invalid_argument, "tiered replay: arrival_time_scale must be > 0");
  HYBRIDCACHE_EXPECTS(options.prefetch_depth >= 1, invalid_argument, "tiered replay: prefetch_depth must be >= 1");
  HYBRIDCACHE_EXPECTS(std::isfinite(options.tpot_ms) && options.tpot_ms >= 0, invalid_argument,
                      "tiered replay: tpot_ms must be finite and >= 0");
  HYBRIDCACHE_EXPECTS(options.spread_equal_arrivals_s >= 0, invalid_argument,
                      "tiered replay: spread_equal_arrivals_s must be >= 0");
  options.marks.validate();
  const std::int32_t per_id = requests.empty() ? 1 : requests.front().tokens_per_id;
  for (const auto& q : requests)
    HYBRIDCACHE_EXPECTS(q.tokens_per_id == per_id && per_id >= 1, invalid_argument,
                        "tiered replay: requests of one trace must share tokens_per_id (>= 1)");
  return options.prefill_engines > 0 ? options.prefill_engines : auto_prefill_engines(requests, options, prefill);
}

}  // namespace detail

/// Replays `requests` (arrival order, ids for every request, one `tokens_per_id`) through
/// a tiered prefix cache with admission `Admission` and HBM eviction `scorer` (the policy:
/// judicious + FLOP-aware = Marconi, judicious + LRU = SGLang+, every block + LRU = vLLM+)
/// over `options.tiers`, and returns the modelled metrics. One tier = the single-tier
/// baseline of the same policy.
/// @throws invalid_argument for bad options or requests; capacity_error when one
///         checkpoint does not fit in HBM.
template <class Admission, class Scorer, prefill_time_model Prefill = linear_prefill_time>
[[nodiscard]] tiered_replay_result run_tiered_replay(std::span<const sim::request> requests, const cost_model& model,
                                                     const tiered_replay_options& options, Scorer scorer,
                                                     const Prefill& prefill = {}, Admission admission = {}) {
  const std::size_t engines = detail::checked_engines(requests, options, prefill);
  const std::int32_t per_id = requests.empty() ? 1 : requests.front().tokens_per_id;
  return detail::replay_with(requests, model, options, std::move(scorer), std::move(admission), prefill, per_id,
                             engines);
}

}  // namespace hybridcache::sim
