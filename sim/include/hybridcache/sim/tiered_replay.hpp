// hybridcache/sim/tiered_replay.hpp
//
// Trace replay through the multi-tier cache with a timeline model: what CaR's design
// (papers/003) buys in modelled TTFT on a real trace, and what each piece contributes.
//
// The modelled server is a pool of `prefill_engines` prefill engines (prefill/decode
// disaggregated, as in Mooncake, whose trace this is meant for; one engine by default), fed
// by one queue (FCFS or CaR's cache-aware queue): the engine that frees first takes the
// next request. The engines share a tiered cache of *blocks* (one cache entry per request
// id, e.g. a Mooncake 512-token hash block): HBM is the pool's HBM, and each engine has its
// own onboard link (a load takes the link that frees first). A block holds the KV of its
// tokens in every attention layer plus, for hybrid models, the recurrent checkpoint at its
// end (every-block checkpointing, vLLM+ style), so any matched prefix is resumable.
//
// Per dispatched request (times in ms):
//   match      the longest run of leading ids present in any tier (and published: a block
//              a concurrent prefill is still computing is not a hit); HBM blocks are hits
//              for free, lower-tier blocks must be loaded (or recomputed).
//   load       per layer: Σ over the lower-tier blocks of that layer's bytes / link
//              bandwidth, plus a per-copy overhead (6 µs) per coalesced run of host pages.
//              Loads on one link serialize.
//   compute    prefill time of the uncached tokens after the matched prefix (the
//              prefill-time policy, core/prefill_time.hpp; `flop_prefill_time` derives
//              it from the cost model, attention over the prefix included), split over
//              the mixer layers in proportion to their FLOPs.
//   overlap    layer-wise pipelining (layer_pipeline.hpp): layer l computes once layer l's
//              data is in; or, with `layerwise = false`, after the whole load.
//   recompute  the request resumes at the matched block boundary that finishes first:
//              load the lower-tier blocks before it, prefill everything after it (from
//              that block's checkpoint for hybrid models). The whole match is a plain
//              reload, the leading HBM run a full recompute; any boundary in between is a
//              split (more compute to hide a shorter load behind). Counted.
//   prefetch   after a dispatch, the next requests' lower-tier blocks may be fetched
//              early: `deadline` (CaR: start when the engines' remaining work before that
//              request's predicted dispatch equals the transfer time,
//              deadline_prefetch::fire_time; not booked before it is due) or `threshold`
//              (HiCache: at once when >= 256 tokens).
//   insert     the request's new blocks enter HBM; HBM over the high watermark demotes
//              victims (by the demotion scorer) to the next tier down to the low mark, off
//              the request path; the last tier drops its victims. With a single tier,
//              eviction drops. A request's blocks stay pinned until its prefill is done.
//   sparsify   with `profile`, KV demoted to a lower tier is sparsified by the per-layer
//              profile (sparsify.hpp): fewer bytes offloaded, stored and loaded back;
//              recurrent checkpoints never shrink.
//   TTFT       finish of the last layer's compute − arrival (queueing + exposed load +
//              prefill).
//
// Requests use the sim helper's representation (sim/request.hpp): `input` ids, each
// standing for `tokens_per_id` tokens (the last one partial), arrival in seconds. Ids are
// grouped into cache blocks of `block_tokens` tokens (512 by default) named by chained
// hashes, so token traces and block-id traces replay alike; ids < 0 are never cached.
//
// Cost: O(Σ blocks · (pages + layers + log n) + requests · engines) time. The replay is
// single-threaded and deterministic (the CaR shuffle is seeded).
#pragma once

#include <span>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/model/prefill_time.hpp"
#include "hybridcache/sim/detail/tiered_replayer_run.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/tiered_replay_options.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"

namespace hybridcache::tiered {

/// Replays `requests` (arrival order) through the tiered cache and returns the modelled
/// metrics. `prefill` is the prefill-time policy (core/prefill_time.hpp).
/// @throws invalid_argument for bad options (zero/too-small tiers, zero bandwidth, ...);
///         capacity_error when a request cannot fit in HBM even with everything evicted.
template <prefill_time_model Prefill = linear_prefill_time>
[[nodiscard]] tiered_replay_result run_tiered_replay(std::span<const sim::request> requests, const cost_model& model,
                                                     const tiered_replay_options& options, const Prefill& prefill = {}) {
  auto go = [&](auto scorer) {
    detail::tiered_replayer<decltype(scorer), Prefill> rp(model, prefill, options, scorer);
    return rp.run(requests);
  };
  demotion_kind d = options.demotion;
  if (d == demotion_kind::automatic) d = options.scheduler == scheduler_kind::car ? demotion_kind::car_score : demotion_kind::lru;
  switch (d) {
    case demotion_kind::car_score: return go(car_score_demotion{});
    case demotion_kind::flop_aware: return go(flop_aware_demotion{model});
    default: return go(lru_demotion{});
  }
}

}  // namespace hybridcache::tiered
