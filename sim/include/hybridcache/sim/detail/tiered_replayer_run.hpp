// hybridcache/sim/detail/tiered_replayer_run.hpp
//
// The request loop of the tiered timeline replay (`tiered_replayer::run`: arrivals,
// dispatch, match, load-or-recompute, pin, insert, offload) and its prefetcher
// (`maybe_prefetch`, `prefetch_one`), out of the class so that each header stays small.
// Internal: use run_tiered_replay (tiered_replay.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "hybridcache/sim/detail/tiered_replayer.hpp"

namespace hybridcache::tiered::detail {

template <demotion_scorer Scorer, prefill_time_model Prefill>
tiered_replay_result tiered_replayer<Scorer, Prefill>::run(std::span<const sim::request> reqs) {
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

// Prefetch for the next `prefetch_depth` requests in dispatch order: the queue's head (the
// CaR window, refilled if empty) or — with an empty queue — the next arrival if it comes
// while the engine is still busy. Request k is predicted to be dispatched after the
// predicted prefill times of the requests before it; the deadline rule starts its load
// so that it lands then (CaR: the stable window gives the prefetcher its horizon).
template <demotion_scorer Scorer, prefill_time_model Prefill>
void tiered_replayer<Scorer, Prefill>::maybe_prefetch(std::span<const sim::request> reqs, std::deque<std::size_t>& fcfs, std::size_t next_arrival,
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
template <demotion_scorer Scorer, prefill_time_model Prefill>
bool tiered_replayer<Scorer, Prefill>::prefetch_one(std::size_t idx, const sim::request& q, const match_result& mt, double now, double dispatch_at,
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

}  // namespace hybridcache::tiered::detail
