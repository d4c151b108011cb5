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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/model/prefill_time.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/tiered_replay_options.hpp"
#include "hybridcache/tiered/copy_plan.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"
#include "hybridcache/tiered/layer_pipeline.hpp"
#include "hybridcache/tiered/offload_engine.hpp"
#include "hybridcache/tiered/prefetch.hpp"
#include "hybridcache/tiered/scheduler.hpp"
#include "hybridcache/tiered/sparsify.hpp"
#include "hybridcache/tiered/tier.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

namespace hybridcache::tiered {

namespace detail {

inline double percentile_of_sorted(const std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

template <demotion_scorer Scorer, prefill_time_model Prefill>
class tiered_replayer {
 public:
  tiered_replayer(const cost_model& model, const Prefill& prefill, const tiered_replay_options& o, Scorer scorer)
      : m_(model), prefill_(prefill), o_(o), store_(effective_tiers(o), o.page_bytes, std::move(scorer)),
        queue_({.window = o.car_window, .seed = o.seed, .max_bypass = 64}) {
    HYBRIDCACHE_EXPECTS(o.per_copy_overhead_us >= 0, invalid_argument, "tiered replay: per_copy_overhead_us must be >= 0");
    HYBRIDCACHE_EXPECTS(o.arrival_time_scale > 0, invalid_argument, "tiered replay: arrival_time_scale must be > 0");
    HYBRIDCACHE_EXPECTS(o.tpot_ms >= 0, invalid_argument, "tiered replay: tpot_ms must be >= 0");
    HYBRIDCACHE_EXPECTS(o.block_tokens >= 1, invalid_argument, "tiered replay: block_tokens must be >= 1");
    HYBRIDCACHE_EXPECTS(o.prefetch_depth >= 1, invalid_argument, "tiered replay: prefetch_depth must be >= 1");
    HYBRIDCACHE_EXPECTS(o.spread_equal_arrivals_s >= 0, invalid_argument, "tiered replay: spread_equal_arrivals_s must be >= 0");
    HYBRIDCACHE_EXPECTS(o.prefill_engines >= 1, invalid_argument, "tiered replay: prefill_engines must be >= 1");
    o.marks.validate();
    for (const auto k : model.spec().layers)
      if (k != layer_kind::mlp) mixers_.push_back(k);
    if (o.sparsify == sparsify_kind::profile) {
      profile_ = o.profile.sparsity.empty() && m_.attention_layers() > 0 ? sparsity_profile::car_linear(m_.attention_layers())
                                                                          : o.profile;
      if (m_.attention_layers() > 0)
        HYBRIDCACHE_EXPECTS(static_cast<std::int64_t>(profile_.sparsity.size()) == m_.attention_layers(), invalid_argument,
                            "tiered replay: sparsity profile needs one value per attention layer");
    }
    layer_ms_.assign(mixers_.size(), 0.0);
  }

  tiered_replay_result run(std::span<const sim::request> reqs) {
    all_ = reqs;
    spread_arrivals(reqs);
    build_blocks(reqs);
    tiered_replay_result r;
    r.arrival_time_scale = o_.arrival_time_scale;
    std::vector<double> ttft, service;
    ttft.reserve(reqs.size());
    engine_free_.assign(o_.prefill_engines, 0.0);
    link_free_.assign(o_.prefill_engines, 0.0);
    double busy = 0.0, last_finish = 0.0, last_dispatch = 0.0, first_arrival = reqs.empty() ? 0.0 : arrival_ms(0);
    double demand_load = 0.0, demand_exposed = 0.0, all_load = 0.0, all_exposed = 0.0;
    std::size_t next_arrival = 0;
    std::deque<std::size_t> fcfs;
    while (next_arrival < reqs.size() || !fcfs.empty() || !queue_.empty()) {
      // The engine that frees first takes the next request; dispatch times never decrease.
      const std::size_t e = earliest_engine();
      double t0 = std::max(engine_free_[e], last_dispatch);  // idle engines are interchangeable
      if (fcfs.empty() && queue_.empty() && next_arrival < reqs.size()) t0 = std::max(t0, arrival_ms(next_arrival));
      // Admit everything that has arrived by then.
      while (next_arrival < reqs.size() && arrival_ms(next_arrival) <= t0) admit(reqs, next_arrival++, fcfs);
      complete_until(t0);
      release_until(t0);
      const std::size_t i = pick(fcfs);
      const sim::request& q = reqs[i];
      // With several engines, the blocks of requests still prefilling elsewhere are pinned
      // and may leave no room for this one: it waits for the next of them to finish. (It
      // never fits only when nothing else holds HBM.)
      // (One engine: nothing else is in flight at t0, so the check could only throw, which
      // the insert does too; skip its O(blocks · pages) cost.)
      while (o_.prefill_engines > 1 && !fits_now(q, t0)) {
        if (running_.empty()) throw_oversized(q);
        t0 = std::max(t0, running_.front().first);
        complete_until(t0);
        release_until(t0);
      }
      last_dispatch = t0;
      score_request(q, car_score::dispatch);

      // --- match ---------------------------------------------------------------------
      match_result mt = match(q, t0);
      auto pf = prefetched_.find(i);
      std::vector<entry_id> prefetch_ids;
      if (pf != prefetched_.end()) prefetch_ids = pf->second.ids;
      if (pf != prefetched_.end() && mt.lower_tokens > 0) {
        // Some prefetched blocks left HBM again before dispatch: load what is missing on
        // demand (the prefetched ones still in HBM still count as host hits).
        prefetched_.erase(pf);
        pf = prefetched_.end();
      }
      const bool was_prefetched = pf != prefetched_.end();
      // --- load vs recompute ----------------------------------------------------------
      // The request resumes after matched block `cut`: lower-tier blocks before it are
      // loaded, everything after it is prefilled. cut = all matched blocks is a plain
      // reload; cut = the leading HBM run recomputes every lower-tier hit.
      std::size_t cut = mt.blocks.size();
      double load_total = 0.0, load_start = t0;
      std::size_t link = earliest_link();
      pipeline_times pt;
      if (was_prefetched) {
        load_total = pf->second.load_ms;
        load_start = pf->second.start_ms;
        layer_ms_ = pf->second.layer_ms;
        compute_layers(mt.hbm_tokens + mt.lower_tokens, q.input_tokens - mt.hbm_tokens - mt.lower_tokens);
        pt = pipeline_timeline(layer_ms_, compute_ms_, t0, load_start, o_.layerwise);
      } else {
        load_start = mt.lower_tokens > 0 ? std::max(t0, link_free_[link]) : t0;
        cut = choose_cut(q, mt, t0, load_start, pt, load_total);
      }
      bool recompute = false;  // some lower-tier hit is recomputed rather than reloaded
      std::int64_t hbm_before = 0, lower_before = 0, lower_after = 0;
      for (std::size_t b = 0; b < mt.blocks.size(); ++b) {
        const std::int64_t tok = block_tokens(q, b);
        if (b < cut) {
          (mt.blocks[b].second == hbm_tier ? hbm_before : lower_before) += tok;
        } else if (mt.blocks[b].second != hbm_tier) {
          recompute = true;
          lower_after += tok;
        }
      }
      if (recompute) {
        r.recompute_instead_of_reload += 1;
        r.recomputed_hit_tokens += lower_after;  // lower-tier hits recomputed (HBM blocks after the cut are not hits lost)
        if (lower_before > 0) r.split_load_recompute += 1;
      }
      if (load_total > 0.0) {
        if (!was_prefetched) {
          link_free_[link] = load_start + load_total;
          demand_load += load_total;
          demand_exposed += pt.exposed_load_ms;
        }
        all_load += load_total;
        all_exposed += pt.exposed_load_ms;
        r.load_ms += load_total;
      }
      // --- cache state: promote lower hits (or refill them by recompute), insert new ----
      pin_and_promote(q, mt, cut, r);
      // Prefetched blocks are in HBM by now but were brought from a lower tier for this
      // request: they are host hits.
      std::int64_t from_prefetch = 0;
      if (!prefetch_ids.empty())
        for (std::size_t b = 0; b < std::min(cut, mt.blocks.size()); ++b)
          if (mt.blocks[b].second == hbm_tier &&
              std::find(prefetch_ids.begin(), prefetch_ids.end(), mt.blocks[b].first) != prefetch_ids.end())
            from_prefetch += block_tokens(q, b);
      r.hbm_hit_tokens += hbm_before - from_prefetch;
      r.host_hit_tokens += lower_before + from_prefetch;
      if (was_prefetched) prefetched_.erase(pf);
      insert_new(q, mt);
      const double finish = pt.finish_ms;
      hold_until(finish, load_total <= 0.0 ? finish : load_start + load_total);
      offload();

      r.requests += 1;
      r.input_tokens += q.input_tokens;
      busy += finish - t0;
      last_finish = std::max(last_finish, finish);
      ttft.push_back(finish - arrival_ms(i));
      service.push_back(finish - t0);
      engine_free_[e] = finish;
      completions_.push({finish + o_.tpot_ms * static_cast<double>(q.output_tokens), i});

      // --- prefetch for the request that will be dispatched next ----------------------
      while (next_arrival < reqs.size() && arrival_ms(next_arrival) <= t0) admit(reqs, next_arrival++, fcfs);
      maybe_prefetch(reqs, fcfs, next_arrival, t0, r);
    }
    release_until(std::numeric_limits<double>::infinity());
    // Requests still waiting for completion do not matter for TTFT.
    std::sort(ttft.begin(), ttft.end());
    std::sort(service.begin(), service.end());
    r.ttft_p50_ms = percentile_of_sorted(ttft, 50);
    r.ttft_p95_ms = percentile_of_sorted(ttft, 95);
    double sum = 0;
    for (double x : ttft) sum += x;
    r.ttft_mean_ms = ttft.empty() ? 0.0 : sum / static_cast<double>(ttft.size());
    r.service_p50_ms = percentile_of_sorted(service, 50);
    r.pipeline_hidden_fraction = demand_load > 0 ? std::clamp(1.0 - demand_exposed / demand_load, 0.0, 1.0) : 1.0;
    r.load_hidden_fraction = all_load > 0 ? std::clamp(1.0 - all_exposed / all_load, 0.0, 1.0) : 1.0;
    const double span = last_finish - first_arrival;
    r.utilization = span > 0 ? busy / (span * static_cast<double>(o_.prefill_engines)) : 0.0;
    r.bytes_offloaded = offloaded_;
    r.bytes_saved_by_sparsify = sparsify_saved_;
    r.dropped_blocks = dropped_;
    r.copies = copies_;
    return r;
  }

 private:
  struct match_result {
    std::vector<std::pair<entry_id, tier_id>> blocks;  // matched, in order
    std::int64_t hbm_tokens = 0, lower_tokens = 0;
    std::int64_t hbm_prefix_tokens = 0;  // leading HBM-only run (what survives a recompute)
  };
  struct prefetch_record {
    double start_ms = 0.0, load_ms = 0.0;
    std::int64_t lower_tokens = 0;
    std::vector<double> layer_ms;
    std::vector<entry_id> ids;  // the blocks it brought into HBM
  };

  static std::vector<tier_config> effective_tiers(const tiered_replay_options& o) {
    HYBRIDCACHE_EXPECTS(!o.link_gbps || *o.link_gbps > 0.0, invalid_argument,
                        "tiered replay: link bandwidth must be > 0 GB/s");
    auto t = o.tiers;
    if (o.link_gbps)
      for (auto& x : t) x.link_gbps = *o.link_gbps;
    return t;  // validated by the store (zero sizes, sizes below a page, ...)
  }

  double arrival_ms(std::size_t i) const { return arrivals_[i]; }
  void spread_arrivals(std::span<const sim::request> reqs) { arrivals_ = modelled_arrivals_ms(reqs, o_); }

  std::size_t earliest_link() const {
    return static_cast<std::size_t>(std::min_element(link_free_.begin(), link_free_.end()) - link_free_.begin());
  }
  std::size_t earliest_engine() const {
    return static_cast<std::size_t>(std::min_element(engine_free_.begin(), engine_free_.end()) - engine_free_.begin());
  }
  // The blocks pinned for the request just dispatched stay pinned until its prefill is done.
  // With several engines, the blocks it computes are unpublished (not hits for others)
  // until then, and the blocks it loads until their load is done.
  void hold_until(double finish, double loaded_at) {
    if (o_.prefill_engines > 1) {
      for (const auto id : computed_) ready_[id] = finish;
      for (const auto id : loaded_) ready_[id] = std::min(loaded_at, finish);
    }
    computed_.clear();
    loaded_.clear();
    running_.push_back({finish, std::move(pinned_)});
    std::push_heap(running_.begin(), running_.end(), later_first{});
    pinned_ = {};
  }
  void release_until(double t) {
    while (!running_.empty() && running_.front().first <= t) {
      std::pop_heap(running_.begin(), running_.end(), later_first{});
      for (const auto id : running_.back().second) (void)store_.unpin(id);
      running_.pop_back();
    }
  }
  struct later_first {
    bool operator()(const std::pair<double, std::vector<entry_id>>& a,
                    const std::pair<double, std::vector<entry_id>>& b) const noexcept {
      return a.first > b.first;
    }
  };
  bool published(entry_id id, double now) const {
    if (o_.prefill_engines == 1) return true;
    const auto it = ready_.find(id);
    return it == ready_.end() || it->second <= now;
  }

  struct block_list {
    std::vector<entry_id> ids;           // chained hashes of the id groups
    std::vector<std::int64_t> tokens;   // real tokens of each block
  };
  const block_list& blocks_of(const sim::request& q) const {
    return blocks_[static_cast<std::size_t>(&q - all_.data())];
  }
  std::int64_t block_tokens(const sim::request& q, std::size_t b) const { return blocks_of(q).tokens[b]; }

  // Groups each request's ids into cache blocks identified by chained hashes; stops at the
  // first negative id (ids a reader made unique: never cached).
  void build_blocks(std::span<const sim::request> reqs) {
    blocks_.assign(reqs.size(), {});
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      const sim::request& q = reqs[i];
      const std::int64_t tpi = std::max<std::int32_t>(q.tokens_per_id, 1);
      const std::size_t group = static_cast<std::size_t>(std::max<std::int64_t>(1, o_.block_tokens / tpi));
      auto& bl = blocks_[i];
      std::uint64_t h = 0x9e3779b97f4a7c15ull;
      std::int64_t covered = 0;
      for (std::size_t b = 0; b * group < q.input.size(); ++b) {
        const std::size_t end = std::min(q.input.size(), (b + 1) * group);
        bool unique = false;
        for (std::size_t k = b * group; k < end; ++k) {
          if (q.input[k] < 0) unique = true;
          h = mix(h ^ static_cast<std::uint64_t>(static_cast<std::uint32_t>(q.input[k])));
        }
        if (unique) break;
        h = mix(h ^ (static_cast<std::uint64_t>(end - b * group) << 40));  // a partial block differs from a full one
        const std::int64_t full = static_cast<std::int64_t>(end - b * group) * tpi;
        const std::int64_t tok = std::clamp<std::int64_t>(q.input_tokens - covered, 0, full);
        // Ids of several tokens each: a block whose last id is cut short holds fewer tokens
        // than the same ids in a longer request, so it must not match them.
        if (tok != full) h = mix(h ^ (static_cast<std::uint64_t>(tok) << 20) ^ 0x5bd1e995u);
        bl.ids.push_back(h);
        bl.tokens.push_back(tok);
        covered += tok;
      }
    }
  }
  // splitmix64's output for state x (the increment, then the mixer), unlike the tiered
  // state store's prefix hash, which mixes without the increment. Block ids, and through
  // them the replay's numbers, depend on this choice.
  static std::uint64_t mix(std::uint64_t x) noexcept { return splitmix64_mix(x + splitmix64_gamma); }
  std::int64_t block_bytes(std::int64_t tokens) const {
    return std::max<std::int64_t>(1, m_.kv_bytes(tokens) + (m_.recurrent_layers() > 0 ? m_.ssm_checkpoint_bytes() : 0));
  }

  void admit(std::span<const sim::request> reqs, std::size_t i, std::deque<std::size_t>& fcfs) {
    if (o_.scheduler == scheduler_kind::fcfs) {
      fcfs.push_back(i);
      return;
    }
    const match_result mt = match(reqs[i], arrival_ms(i));
    (void)queue_.push(i, classify(mt.hbm_tokens, mt.lower_tokens));
  }

  std::size_t pick(std::deque<std::size_t>& fcfs) {
    if (o_.scheduler == scheduler_kind::fcfs) {
      const std::size_t i = fcfs.front();
      fcfs.pop_front();
      return i;
    }
    if (queue_.window().empty()) on_refill();
    return static_cast<std::size_t>(*queue_.pop());
  }
  std::optional<std::size_t> peek(const std::deque<std::size_t>& fcfs) {
    if (o_.scheduler == scheduler_kind::fcfs) return fcfs.empty() ? std::nullopt : std::optional<std::size_t>(fcfs.front());
    if (queue_.window().empty()) on_refill();
    if (queue_.window().empty()) return std::nullopt;
    return static_cast<std::size_t>(queue_.window().front());
  }
  void on_refill() {
    for (const auto id : queue_.refill()) score_request(all_[static_cast<std::size_t>(id)], car_score::enter_window);
  }

  // CaR's score: applied to the request's matched blocks (those that exist now).
  void score_request(const sim::request& q, double delta) {
    if (o_.scheduler != scheduler_kind::car) return;
    for (const auto id : blocks_of(q).ids)
      if (!store_.add_score(id, delta)) break;
  }
  void complete_until(double t) {
    while (!completions_.empty() && completions_.top().first <= t) {
      score_request(all_[completions_.top().second], car_score::complete);
      completions_.pop();
    }
  }

  // Whether HBM can take the request now: its new blocks and its lower-tier hits (at full
  // size, an upper bound) must fit in what is neither pinned by requests in flight nor one
  // of its own HBM hits. O(blocks · pages).
  bool fits_now(const sim::request& q, double now) const {
    const match_result mt = match(q, now);
    const auto& bl = blocks_of(q);
    std::int64_t need = 0, own = 0;
    for (std::size_t b = 0; b < mt.blocks.size(); ++b) {
      const auto row = store_.find(mt.blocks[b].first);
      if (!row) continue;
      if (row->tier != hbm_tier) need += store_.pages_for(block_bytes(bl.tokens[b]));
      else if (row->state == page_state::resident) own += static_cast<std::int64_t>(row->pages.size());
    }
    for (std::size_t b = mt.blocks.size(); b < bl.ids.size(); ++b)
      if (!store_.contains(bl.ids[b])) need += store_.pages_for(block_bytes(bl.tokens[b]));
    const auto u = store_.usage(hbm_tier);
    const std::int64_t pb = store_.page_bytes();
    const std::int64_t held = (u.used_bytes - u.evictable_bytes) / pb;  // pinned by requests in flight
    return need <= u.capacity_bytes / pb - held - own;
  }

  // The longest run of leading blocks present in any tier and published by `now`.
  match_result match(const sim::request& q, double now) const {
    match_result mt;
    bool hbm_run = true;
    const auto& bl = blocks_of(q);
    for (std::size_t b = 0; b < bl.ids.size(); ++b) {
      const auto loc = store_.locate(bl.ids[b]);
      if (!loc || !published(bl.ids[b], now)) break;
      const std::int64_t tok = bl.tokens[b];
      mt.blocks.emplace_back(bl.ids[b], loc->first);
      if (loc->first == hbm_tier) {
        mt.hbm_tokens += tok;
        if (hbm_run) mt.hbm_prefix_tokens += tok;
      } else {
        mt.lower_tokens += tok;
        hbm_run = false;
      }
    }
    return mt;
  }

  // Compute time of each mixer layer for `n` new tokens after `prefix` cached ones: the
  // prefill-time policy's total, split in proportion to each layer's FLOPs (its mixer plus
  // an equal share of the MLPs), so attention layers over a long prefix take longer.
  // Writes compute_ms_ (one entry per mixer layer).
  void compute_layers(std::int64_t prefix, std::int64_t n) {
    n = std::max<std::int64_t>(n, 0);
    prefix = std::max<std::int64_t>(prefix, 0);
    const double total = prefill_ms_after(prefill_, prefix, n);
    std::vector<double>& w = compute_ms_;
    w.assign(mixers_.size(), 1.0);
    if (n > 0 && !mixers_.empty()) {
      const double mlp_share = static_cast<double>(m_.mlp_layers()) * static_cast<double>(m_.mlp_flops(n)) /
                               static_cast<double>(mixers_.size());
      double sum = 0.0;
      for (std::size_t l = 0; l < mixers_.size(); ++l) {
        const double mixer = mixers_[l] == layer_kind::attention
                                 ? static_cast<double>(m_.attention_flops(prefix + n) - m_.attention_flops(prefix))
                                 : static_cast<double>(m_.recurrent_flops(n));
        w[l] = mixer + mlp_share;
        sum += w[l];
      }
      for (auto& x : w) x = sum > 0 ? total * x / sum : total / static_cast<double>(w.size());
    } else {
      std::fill(w.begin(), w.end(), total / static_cast<double>(std::max<std::size_t>(w.size(), 1)));
    }
  }

  // Picks where the request resumes: after matched block `cut`, loading the lower-tier
  // blocks before it (layer-wise, from `load_start`) and prefilling everything after it.
  // Candidates: every block boundary from the end of the leading HBM run (recompute all
  // lower-tier hits) to the whole match (reload all); with `split_load_recompute` off, only
  // those two; with `recompute_when_faster` off, only the whole match. The earliest finish
  // wins (ties: the longer reuse). Leaves layer_ms_ / compute_ms_ / the returned timeline
  // for the winner. O(blocks · layers).
  std::size_t choose_cut(const sim::request& q, const match_result& mt, double t0, double load_start,
                         pipeline_times& best, double& best_load) {
    const std::size_t n = mt.blocks.size();
    std::size_t first = 0;
    std::int64_t prefix_tokens = 0;
    while (first < n && mt.blocks[first].second == hbm_tier) prefix_tokens += block_tokens(q, first++);
    cum_ms_.assign(mixers_.size(), 0.0);
    std::size_t best_cut = n;
    bool have = false;
    std::int64_t runs = 0, last_page = -2, tokens = prefix_tokens;
    tier_id last_tier{255};
    auto consider = [&](std::size_t cut, std::int64_t resume_at) {
      const bool candidate = cut == n || (o_.recompute_when_faster && (o_.split_load_recompute || cut == first));
      if (!candidate) return;
      const double overhead = o_.per_copy_overhead_us / 1000.0 * static_cast<double>(runs);
      double total = 0.0;
      for (std::size_t l = 0; l < mixers_.size(); ++l) total += (layer_ms_[l] = cum_ms_[l] + (runs > 0 ? overhead : 0.0));
      compute_layers(resume_at, q.input_tokens - resume_at);
      const pipeline_times pt = pipeline_timeline(layer_ms_, compute_ms_, t0, load_start, o_.layerwise);
      if (!have || pt.finish_ms <= best.finish_ms) {
        have = true;
        best = pt;
        best_cut = cut;
        best_load = total;
        best_layer_ms_ = layer_ms_;
        best_compute_ms_ = compute_ms_;
      }
    };
    consider(first, tokens);
    for (std::size_t b = first; b < n; ++b) {
      const auto [id, tier] = mt.blocks[b];
      if (tier != hbm_tier)
        if (const auto row = store_.find(id)) add_block_load(*row, runs, last_page, last_tier);
      tokens += block_tokens(q, b);
      consider(b + 1, tokens);
    }
    layer_ms_ = best_layer_ms_;
    compute_ms_ = best_compute_ms_;
    count_copies(mt, best_cut);
    return best_cut;
  }

  // Adds one lower-tier block's per-layer load time to cum_ms_ (bytes over the tier's
  // link) and counts a new copy run unless its pages follow the previous block's.
  void add_block_load(const cache_entry& row, std::int64_t& runs, std::int64_t& last_page, tier_id& last_tier) {
    const double bw = store_.config(row.tier).link_gbps * 1e6;  // bytes per ms
    count_runs(row, runs, last_page, last_tier);
    const std::int64_t ckpt = m_.recurrent_layers() > 0 ? m_.ssm_checkpoint_bytes() : 0;
    const double kv_bytes = static_cast<double>(row.bytes - ckpt);
    const double per_attn = m_.attention_layers() > 0 ? kv_bytes / static_cast<double>(m_.attention_layers()) : 0.0;
    const double per_rec = static_cast<double>(m_.ssm_checkpoint_bytes_per_layer());
    for (std::size_t l = 0; l < mixers_.size(); ++l)
      cum_ms_[l] += (mixers_[l] == layer_kind::attention ? per_attn : per_rec) / bw;
  }
  void count_copies(const match_result& mt, std::size_t cut) {
    std::int64_t runs = 0, last_page = -2;
    tier_id last_tier{255};
    for (std::size_t b = 0; b < cut; ++b) {
      const auto [id, tier] = mt.blocks[b];
      if (tier == hbm_tier) continue;
      const auto row = store_.find(id);
      if (row) count_runs(*row, runs, last_page, last_tier);
    }
    copies_ += runs * static_cast<std::int64_t>(mixers_.size());
  }
  // One copy per run of pages adjacent in the lower tier, within and across blocks.
  static void count_runs(const cache_entry& row, std::int64_t& runs, std::int64_t& last_page, tier_id& last_tier) {
    for (const auto p : row.pages) {
      if (!(row.tier == last_tier && static_cast<std::int64_t>(p) == last_page + 1)) ++runs;
      last_page = p;
      last_tier = row.tier;
    }
  }

  // Fills layer_ms_ with the per-layer load time of the matched lower-tier blocks; returns
  // the total. One copy per layer per run of adjacent host pages.
  double plan_load(const match_result& mt) {
    cum_ms_.assign(mixers_.size(), 0.0);
    std::int64_t runs = 0, last_page = -2;
    tier_id last_tier{255};
    for (const auto& [id, tier] : mt.blocks) {
      if (tier == hbm_tier) continue;
      if (const auto row = store_.find(id)) add_block_load(*row, runs, last_page, last_tier);
    }
    const double overhead = o_.per_copy_overhead_us / 1000.0 * static_cast<double>(runs);
    copies_ += runs * static_cast<std::int64_t>(mixers_.size());
    double total = 0.0;
    for (std::size_t l = 0; l < mixers_.size(); ++l) total += (layer_ms_[l] = cum_ms_[l] + overhead);
    return total;
  }

  // Makes room for `bytes` in tier t: demote its victims one tier down, or drop them from
  // the last tier. False, with nothing demoted or dropped, when free + evictable pages
  // cannot hold it (everything else pinned, or larger than the tier).
  bool make_room(tier_id t, std::int64_t bytes) {
    if (!store_.would_fit(t, bytes)) return false;
    for (;;) {
      const auto u = store_.usage(t);
      if (u.capacity_bytes - u.used_bytes >= store_.pages_for(bytes) * store_.page_bytes()) return true;
      const auto v = store_.victim(t);
      if (!v) return false;
      demote_or_drop(*v, t);
    }
  }
  void demote_or_drop(entry_id v, tier_id t) {
    if (t.value + 1u >= store_.tier_count()) {
      (void)store_.erase(v);
      dropped_ += 1;
      return;
    }
    const tier_id next{static_cast<std::uint8_t>(t.value + 1)};
    const auto row = store_.find(v);
    std::int64_t bytes = row->bytes;
    if (t == hbm_tier && o_.sparsify == sparsify_kind::profile && m_.attention_layers() > 0) {
      // KV leaving HBM is sparsified; tokens of the block from its KV size.
      const std::int64_t ckpt = m_.recurrent_layers() > 0 ? m_.ssm_checkpoint_bytes() : 0;
      const std::int64_t tokens = (row->bytes - ckpt) / std::max<std::int64_t>(1, m_.kv_bytes_per_token());
      if (tokens * m_.kv_bytes_per_token() + ckpt == row->bytes) {  // not sparsified yet
        const std::int64_t sb = sparsified_node_bytes(m_, profile_, tokens, ckpt > 0, o_.sparsify_opts);
        bytes = std::min(bytes, sb);
      }
    }
    if (!make_room(next, bytes)) {
      (void)store_.erase(v);
      dropped_ += 1;
      return;
    }
    const auto moved = move_entry(store_, engine_, v, next, bytes);
    if (moved) {
      offloaded_ += bytes;
      sparsify_saved_ += row->bytes - bytes;
    } else {
      (void)store_.erase(v);
      dropped_ += 1;
    }
  }

  void pin(entry_id id) {
    if (store_.pin(id)) pinned_.push_back(id);
  }

  // Pins the HBM hits, brings lower-tier hits into HBM (load or recompute) and pins them.
  // Blocks from index `cut` on are recomputed, not loaded.
  // Every matched block is pinned first (lower-tier ones too), so the room made for one
  // block never demotes or drops another block of the same request.
  void pin_and_promote(const sim::request& q, const match_result& mt, std::size_t cut, tiered_replay_result& r) {
    for (const auto& [id, tier] : mt.blocks) pin(id);
    std::int64_t begin = 0;
    for (std::size_t b = 0; b < mt.blocks.size(); ++b) {
      const auto [id, tier] = mt.blocks[b];
      const std::int64_t tok = block_tokens(q, b);
      const std::int64_t first = begin;
      begin += tok;
      if (tier == hbm_tier) continue;
      const auto row = store_.find(id);
      if (!row) continue;  // cannot happen: pinned
      if (b >= cut) {
        // Recomputed: the fresh (full-size) KV is written to HBM; the lower-tier copy goes.
        const std::int64_t full = block_bytes(tok);
        if (!make_room(hbm_tier, full)) throw_oversized(q);
        (void)store_.unpin(id);
        (void)store_.erase(id);
        (void)store_.insert(id, full, hbm_tier, {first, first + tok, m_.recurrent_layers() > 0});
        (void)store_.pin(id);
        computed_.push_back(id);
      } else {
        if (!make_room(hbm_tier, row->bytes)) throw_oversized(q);
        (void)store_.unpin(id);
        if (move_entry(store_, engine_, id, hbm_tier)) r.bytes_loaded += row->bytes;
        (void)store_.pin(id);
        loaded_.push_back(id);
      }
    }
  }

  void insert_new(const sim::request& q, const match_result& mt) {
    const auto& bl = blocks_of(q);
    std::int64_t begin = 0;
    for (std::size_t b = 0; b < mt.blocks.size(); ++b) begin += bl.tokens[b];
    for (std::size_t b = mt.blocks.size(); b < bl.ids.size(); ++b) {
      const auto id = bl.ids[b];
      const std::int64_t tok = bl.tokens[b];
      const std::int64_t first = begin;
      begin += tok;
      if (store_.contains(id)) {  // a later block is cached but an earlier one was not
        pin(id);
        continue;
      }
      const std::int64_t bytes = block_bytes(tok);
      if (!make_room(hbm_tier, bytes)) throw_oversized(q);
      if (!store_.insert(id, bytes, hbm_tier, {first, first + tok, m_.recurrent_layers() > 0})) throw_oversized(q);
      computed_.push_back(id);
      pin(id);
    }
  }

  [[noreturn]] void throw_oversized(const sim::request& q) const {
    throw capacity_error("tiered replay: request at line " + std::to_string(q.source_line) + " (" +
                         std::to_string(q.input_tokens) + " tokens) does not fit in HBM (" +
                         std::to_string(store_.usage(hbm_tier).capacity_bytes) +
                         " bytes) even with everything else evicted; use a larger hbm tier");
  }

  // Asynchronous offload between requests: above the high watermark, demote to the low one.
  void offload() {
    if (store_.tier_count() < 2) return;
    auto u = store_.usage(hbm_tier);
    if (static_cast<double>(u.used_bytes) < o_.marks.high * static_cast<double>(u.capacity_bytes)) return;
    while (static_cast<double>(u.used_bytes) > o_.marks.low * static_cast<double>(u.capacity_bytes)) {
      const auto v = store_.victim(hbm_tier);
      if (!v) break;
      demote_or_drop(*v, hbm_tier);
      u = store_.usage(hbm_tier);
    }
  }

  // Prefetch for the next `prefetch_depth` requests in dispatch order: the queue's head (the
  // CaR window, refilled if empty) or — with an empty queue — the next arrival if it comes
  // while the engine is still busy. Request k is predicted to be dispatched after the
  // predicted prefill times of the requests before it; the deadline rule starts its load
  // so that it lands then (CaR: the stable window gives the prefetcher its horizon).
  void maybe_prefetch(std::span<const sim::request> reqs, std::deque<std::size_t>& fcfs, std::size_t next_arrival,
                      double now, tiered_replay_result& r) {
    if (o_.prefetch == prefetch_kind::none) return;
    // The next dispatch goes to the engine that frees first.
    const double gpu_free = std::max(now, engine_free_[earliest_engine()]);
    candidates_.clear();
    if (o_.scheduler == scheduler_kind::fcfs) {
      for (std::size_t k = 0; k < fcfs.size() && candidates_.size() < o_.prefetch_depth; ++k) candidates_.push_back(fcfs[k]);
    } else {
      if (queue_.window().empty()) on_refill();
      for (const auto id : queue_.window()) {
        if (candidates_.size() >= o_.prefetch_depth) break;
        candidates_.push_back(static_cast<std::size_t>(id));
      }
    }
    if (candidates_.empty() && next_arrival < reqs.size() && arrival_ms(next_arrival) < gpu_free)
      candidates_.push_back(next_arrival);
    double dispatch_at = gpu_free;  // predicted dispatch time of the candidate
    for (std::size_t k = 0; k < candidates_.size(); ++k) {
      const std::size_t c = candidates_[k];
      const sim::request& q = reqs[c];
      const match_result mt = match(q, dispatch_at);
      const std::int64_t matched = mt.hbm_tokens + mt.lower_tokens;
      const double service = prefill_ms_after(prefill_, matched, q.input_tokens - matched);
      if (!prefetched_.count(c) && mt.lower_tokens > 0)
        if (!prefetch_one(c, q, mt, now, dispatch_at, k == 0 ? std::numeric_limits<double>::infinity() : gpu_free, r))
          break;  // not due yet: later candidates are even less so; decided again at the next dispatch
      dispatch_at += service / static_cast<double>(o_.prefill_engines);
    }
  }

  // Starts request idx's lower-tier loads ahead of its predicted dispatch when the rule says
  // so. A deadline load due after `latest_start` (the next decision point) is not booked
  // yet (false): booking it would hold the link against loads needed sooner.
  bool prefetch_one(std::size_t idx, const sim::request& q, const match_result& mt, double now, double dispatch_at,
                    double latest_start, tiered_replay_result& r) {
    prefetch_record rec;
    const std::int64_t copies_before = copies_;
    rec.load_ms = plan_load(mt);
    copies_ = copies_before;  // counted when booked
    rec.layer_ms = layer_ms_;
    const std::size_t link = earliest_link();
    double start = std::max({now, arrival_ms(idx), link_free_[link]});
    if (o_.prefetch == prefetch_kind::threshold) {
      if (mt.lower_tokens < o_.threshold_tokens) return true;
    } else {
      // CaR's rule with the predicted remaining service before this request's dispatch
      // (dispatch_at − now) in place of TPOT·len_i − (t − timer_i); bandwidth from the link.
      const running_request run[] = {{.timer_ms = now, .predicted_tokens = dispatch_at - now}};
      const prefetch_context c{.now_ms = start,
                               .tpot_ms = 1.0,
                               .running = run,
                               .bytes = rec.load_ms,
                               .bandwidth_bytes_per_ms = 1.0,
                               .lower_hit_tokens = mt.lower_tokens};
      start = deadline_prefetch::fire_time(c);
      if (start > latest_start) return false;
    }
    // Reload must still beat recomputing: otherwise leave it to the dispatch decision.
    if (o_.recompute_when_faster) {
      const std::int64_t matched = mt.hbm_tokens + mt.lower_tokens;
      const double alt = prefill_ms_after(prefill_, mt.hbm_prefix_tokens, q.input_tokens - mt.hbm_prefix_tokens) -
                         prefill_ms_after(prefill_, matched, q.input_tokens - matched);
      if (rec.load_ms > alt + (dispatch_at - start)) return true;
    }
    // Room first, so a prefetch is all or nothing.
    std::int64_t need = 0;
    for (const auto& [id, tier] : mt.blocks)
      if (tier != hbm_tier)
        if (const auto row = store_.find(id)) need += store_.pages_for(row->bytes) * store_.page_bytes();
    const auto u = store_.usage(hbm_tier);
    if (u.capacity_bytes - u.used_bytes + u.evictable_bytes < need + (u.capacity_bytes / 4)) return true;  // keep headroom
    rec.start_ms = start;
    rec.lower_tokens = mt.lower_tokens;
    link_free_[link] = start + rec.load_ms;
    (void)plan_load(mt);  // books its copies
    // Pinned while room is made, so that room for one block never demotes or drops another
    // block of the same prefetch (lower-tier ones before their move, HBM ones after).
    std::vector<entry_id> held;
    for (const auto& [id, tier] : mt.blocks)
      if (tier != hbm_tier && store_.pin(id)) held.push_back(id);
    for (const auto& [id, tier] : mt.blocks) {
      if (tier == hbm_tier) continue;
      const auto row = store_.find(id);
      if (!row || !make_room(hbm_tier, row->bytes)) break;
      (void)store_.unpin(id);
      if (move_entry(store_, engine_, id, hbm_tier)) {
        r.bytes_loaded += row->bytes;
        rec.ids.push_back(id);
      }
      (void)store_.pin(id);
    }
    for (const auto id : held) (void)store_.unpin(id);
    r.prefetches += 1;
    prefetched_.emplace(idx, std::move(rec));
    return true;
  }

  const cost_model& m_;
  const Prefill& prefill_;
  const tiered_replay_options& o_;
  tiered_store<Scorer> store_;
  metadata_only_copies engine_;  // timing is modelled, not run: every move completes at once
  car_request_queue queue_;
  std::vector<layer_kind> mixers_;
  std::vector<double> layer_ms_, compute_ms_, cum_ms_, best_layer_ms_, best_compute_ms_;
  sparsity_profile profile_;
  std::vector<entry_id> pinned_, computed_, loaded_;  // of the request being dispatched
  std::span<const sim::request> all_;
  std::vector<block_list> blocks_;
  std::vector<double> arrivals_;
  std::unordered_map<std::size_t, prefetch_record> prefetched_;
  std::vector<std::size_t> candidates_;
  std::priority_queue<std::pair<double, std::size_t>, std::vector<std::pair<double, std::size_t>>, std::greater<>> completions_;
  std::vector<double> engine_free_, link_free_;  // per prefill engine
  std::vector<std::pair<double, std::vector<entry_id>>> running_;  // (finish, pinned blocks), min-heap
  std::unordered_map<entry_id, double> ready_;  // publication time of blocks (several engines)
  std::int64_t offloaded_ = 0, sparsify_saved_ = 0, dropped_ = 0, copies_ = 0;
};

}  // namespace detail

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
