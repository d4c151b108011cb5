// hybridcache/sim/detail/tiered_replayer_run.hpp
//
// The request loop of the timed multi-tier replay (`tiered_replayer::run`: arrivals,
// dispatch, begin (match, lower-tier hit, load or recompute, reservation), the layer-wise
// pipeline, finish at the end of decode, the cleaner) and its prefetcher, out of the class
// so that each header stays small. Internal: use run_tiered_replay (tiered_replay.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/sim/detail/tiered_replayer.hpp"

namespace hybridcache::sim::detail {

template <class Cache, prefill_time_model Prefill>
tiered_replay_result tiered_replayer<Cache, Prefill>::run(std::span<const sim::request> reqs) {
  all_ = reqs;
  arrivals_ = modelled_arrivals_ms(reqs, o_);
  tiered_replay_result r;
  r.arrival_time_scale = o_.arrival_time_scale;
  r.prefill_engines = engines_;
  r.hit_tokens_by_tier.assign(std::max<std::size_t>(o_.tiers.size(), 1), 0);
  std::vector<double> ttft, service, ttet;
  ttft.reserve(reqs.size());
  ttet.reserve(reqs.size());
  engine_free_.assign(engines_, 0.0);
  engine_timer_.assign(engines_, 0.0);
  engine_predicted_.assign(engines_, 0.0);
  double length_error = 0.0;
  double busy = 0.0, last_finish = 0.0, last_dispatch = 0.0;
  const double first_arrival = reqs.empty() ? 0.0 : arrival_ms(0);
  double demand_load = 0.0, demand_exposed = 0.0, all_load = 0.0, all_exposed = 0.0;
  std::size_t next_arrival = 0;
  while (next_arrival < reqs.size() || !queue_empty()) {
    // The engine that frees first takes the next request; dispatch times never decrease.
    const std::size_t e = earliest_engine();
    double t0 = std::max(engine_free_[e], last_dispatch);
    if (queue_empty() && next_arrival < reqs.size()) t0 = std::max(t0, arrival_ms(next_arrival));
    finish_until(t0);
    while (next_arrival < reqs.size() && arrival_ms(next_arrival) <= t0) admit(reqs, next_arrival++);
    const std::size_t i = pick();
    const sim::request& q = reqs[i];
    HYBRIDCACHE_EXPECTS(!q.input.empty(), invalid_argument,
                        "tiered replay: request at line " + std::to_string(q.source_line) + " has no ids");
    car_dispatch(i);  // CaR's score: +dispatch on the nodes it reuses now
    // Its output length as the scheduler predicts it now, from the decodes ended by now.
    lengths_.learn_until(t0);
    const double predicted = lengths_.predict(q);
    length_error += std::abs(predicted - static_cast<double>(q.output_tokens));
    // begin: match, the hit below HBM (loaded, or declined when recomputing is faster), the
    // reservation. When it does not fit beside the requests still decoding, it waits for
    // the next of them to end; alone and still too large, it is refused (not cached).
    // A prefetch for this request hands its loads over: begin claims them, no second copy.
    const bool was_prefetched = prefetched_.count(i) != 0;
    if (was_prefetched) {
      cache_.store().release_hit_keep_loaded(prefetched_.at(i));
      prefetched_.erase(i);
    }
    bool declined = false, split = false;  // the hit declined, or loaded only in part
    std::int64_t whole_hit = 0;            // where the whole hit would have resumed (ids)
    std::optional<prefix::request_ticket> ticket;
    for (;;) {
      engine_.set_now(t0);
      engine_.use_link(e);
      engine_.clear_wait();
      (void)cache_.store().poll();
      auto accept = [&](const stores::tiered_hit& h) {
        const std::int64_t at = resume_at(q, h, t0, e);
        declined = at <= h.hbm_tokens;
        split = at > h.hbm_tokens && at < h.reusable_tokens;
        whole_hit = h.reusable_tokens;
        return at;
      };
      auto t = requests_.begin(q.input, {.output_tokens = static_cast<std::int64_t>(q.output.size())}, accept);
      if (t) {
        ticket = *t;
        break;
      }
      if (t.error() != errc::out_of_capacity)
        throw invalid_argument("tiered replay: begin failed (" + std::string(to_string(t.error())) + ")");
      if (running_.empty()) break;  // alone and too large
      t0 = std::max(t0, running_.top().end_ms);
      finish_until(t0);
    }
    last_dispatch = t0;

    r.requests += 1;
    r.input_tokens += q.input_tokens;
    if (o_.on_dispatch) o_.on_dispatch();
    if (!ticket) {  // refused: computed from scratch, not cached
      ++r.refused;
      // A selector's tier-aware shadows still see it (they may well have room for it).
      seq_.assign(q.input.begin(), q.input.end());
      seq_.insert(seq_.end(), q.output.begin(), q.output.end());
      cache_.observe_refused(seq_, static_cast<std::int64_t>(q.input.size()));
      compute_layers(0, q.input_tokens);
      std::fill(arrive_.begin(), arrive_.end(), t0);
      const double finish = pipeline(t0);
      const double last_token = finish + decode_ms(q);
      lengths_.finished_at(last_token, q);
      car_completes_at(i, last_token);
      const double engine_done = colocated() ? last_token : finish;
      busy += engine_done - t0;
      engine_free_[e] = engine_done;
      engine_timer_[e] = finish;
      engine_predicted_[e] = predicted;
      last_finish = std::max(last_finish, engine_done);
      ttft.push_back(finish - arrival_ms(i));
      ttet.push_back(last_token - arrival_ms(i));
      service.push_back(finish - t0);
      if (o_.keep_per_request) {
        r.per_request.push_back({i, true, q.input_tokens, 0, 0, 0, finish - arrival_ms(i)});
        r.per_request.back().ttet_ms = last_token - arrival_ms(i);
      }
      continue;
    }
    const auto& st = **requests_.state(*ticket);

    // A write-back that had to land before the reservation's pages were free delays it.
    const double start = std::max(t0, engine_.waited_until());
    r.stall_ms += start - t0;
    const std::int64_t hbm_ids = st.match.reusable_tokens;
    const std::int64_t resume_ids = st.plan.prefill_start;
    const std::int64_t hbm_tok = tokens_of(q, hbm_ids), resume_tok = tokens_of(q, resume_ids);
    std::int64_t loaded_bytes = 0;
    if (st.loaded_at > 0) {
      load_arrivals(st.host_hit, t0);
      for (const auto& s : cache_.store().staged(st.host_hit)) loaded_bytes += s.loaded_bytes;
    } else {
      std::fill(arrive_.begin(), arrive_.end(), start);
    }
    if (declined) {
      r.recompute_instead_of_reload += 1;
      r.recomputed_hit_tokens += std::max<std::int64_t>(0, tokens_of(q, st.host_hit.reusable_tokens) - hbm_tok);
    } else if (split && st.loaded_at > 0) {  // loaded up to the resume point, the rest recomputed
      r.split_load_recompute += 1;
      r.recomputed_hit_tokens += std::max<std::int64_t>(0, tokens_of(q, whole_hit) - resume_tok);
    }
    // A full hit still computes the last token (its logits).
    compute_layers(resume_tok, std::max<std::int64_t>(1, q.input_tokens - resume_tok));
    double compute_total = 0.0;
    for (const double c : compute_ms_) compute_total += c;
    const double finish = pipeline(start);
    if (st.loaded_at > 0) {
      const double landed = *std::max_element(arrive_.begin(), arrive_.end());
      const double load = std::max(0.0, landed - t0);
      const double exposed = std::clamp(finish - start - compute_total, 0.0, load);
      all_load += load;
      all_exposed += exposed;
      if (!was_prefetched) {
        demand_load += load;
        demand_exposed += exposed;
      }
      r.load_ms += load;
    }
    r.hbm_hit_tokens += hbm_tok;
    r.host_hit_tokens += resume_tok - hbm_tok;
    const std::size_t source = resume_tok > hbm_tok ? st.host_hit.source_tier.value : 0;
    split_by_tier(st.host_hit, hbm_tok, resume_tok, by_tier_);
    if (r.hit_tokens_by_tier.size() < by_tier_.size()) r.hit_tokens_by_tier.resize(by_tier_.size(), 0);
    for (std::size_t t = 0; t < by_tier_.size(); ++t) r.hit_tokens_by_tier[t] += by_tier_[t];
    r.bytes_loaded += loaded_bytes;
    r.flops_saved += static_cast<double>(m_.prefill_flops(resume_tok));
    // Its last token: TPOT per output token after the first (on the decode pool, or on this
    // engine when colocated).
    const double last_token = finish + decode_ms(q);
    lengths_.finished_at(last_token, q);
    car_completes_at(i, last_token);
    const double engine_done = colocated() ? last_token : finish;
    if (o_.keep_per_request) {
      r.per_request.push_back(
          {i, false, q.input_tokens, hbm_tok, resume_tok - hbm_tok, loaded_bytes, finish - arrival_ms(i), source});
      r.per_request.back().ttet_ms = last_token - arrival_ms(i);
      r.per_request.back().hit_tokens_by_tier = by_tier_;
    }
    busy += engine_done - t0;
    last_finish = std::max(last_finish, engine_done);
    ttft.push_back(finish - arrival_ms(i));
    ttet.push_back(last_token - arrival_ms(i));
    service.push_back(finish - t0);
    engine_free_[e] = engine_done;
    engine_timer_[e] = finish;
    engine_predicted_[e] = predicted;
    // Its prefill done, the request's sequence enters the cache (decode runs on the decode
    // pool, as in a prefill/decode-disaggregated deployment); colocated, once its decode on
    // this engine is over (its reservation held meanwhile).
    running_.push({engine_done, *ticket, i});
    engine_.use_link(engine_.least_busy_offload());
    (void)cache_.store().offload();
    // Prefetch for the requests dispatched next.
    while (next_arrival < reqs.size() && arrival_ms(next_arrival) <= t0) admit(reqs, next_arrival++);
    maybe_prefetch(reqs, t0, r);
  }
  finish_until(std::numeric_limits<double>::infinity());
  for (auto& [idx, h] : prefetched_) cache_.store().release_hit(h);
  prefetched_.clear();
  cache_.store().drain();
  std::sort(ttft.begin(), ttft.end());
  std::sort(service.begin(), service.end());
  std::sort(ttet.begin(), ttet.end());
  r.ttet_p50_ms = percentile_of_sorted(ttet, 50);
  r.ttet_p95_ms = percentile_of_sorted(ttet, 95);
  double ttet_sum = 0;
  for (const double x : ttet) ttet_sum += x;
  r.ttet_mean_ms = ttet.empty() ? 0.0 : ttet_sum / static_cast<double>(ttet.size());
  r.output_length_mae_tokens = ttet.empty() ? 0.0 : length_error / static_cast<double>(ttet.size());
  r.ttft_p50_ms = percentile_of_sorted(ttft, 50);
  r.ttft_p95_ms = percentile_of_sorted(ttft, 95);
  double sum = 0;
  for (const double x : ttft) sum += x;
  r.ttft_mean_ms = ttft.empty() ? 0.0 : sum / static_cast<double>(ttft.size());
  r.service_p50_ms = percentile_of_sorted(service, 50);
  r.pipeline_hidden_fraction = demand_load > 0 ? std::clamp(1.0 - demand_exposed / demand_load, 0.0, 1.0) : 1.0;
  r.load_hidden_fraction = all_load > 0 ? std::clamp(1.0 - all_exposed / all_load, 0.0, 1.0) : 1.0;
  const double span = last_finish - first_arrival;
  r.utilization = span > 0 ? busy / (span * static_cast<double>(engines_)) : 0.0;
  const auto& c = cache_.store().counters();
  const auto& es = engine_.stats();
  r.bytes_offloaded = es.offload_bytes;
  r.copies = es.copies;
  r.dropped_blocks = c.dropped_entries;
  r.joined_loads = c.joined_loads;
  r.write_backs = c.write_backs;
  r.cascades = c.cascades;
  r.copy_failures = c.copy_failures;
  r.replicas = c.replicas;
  r.clean_drops = c.clean_drops;
  r.write_back_waits = c.write_back_waits;
  r.bytes_saved_by_sparsify = c.sparsified_bytes;
  HYBRIDCACHE_EXPECTS(finish_failures_ == 0, invalid_argument,
                      "tiered replay: " + std::to_string(finish_failures_) + " requests failed to finish");
  return r;
}

// Prefetch for the next `prefetch_depth` queued requests: request k is predicted to be
// dispatched after the predicted service times of those before it; the deadline rule (CaR)
// starts its load so that it lands then, the threshold rule (HiCache) at once when it
// reuses >= 256 tokens below HBM. Colocated (decode on the prefill engines), the next
// dispatch waits on the running requests' decode, and the first candidate's load fires by
// CaR's own rule: when min_i (TPOT·len_i − (t − timer_i)) <= SIZE / bandwidth, len_i the
// output length predicted for engine i's request and timer_i its first token; a timer that
// would fire after the dispatch it waits for does not (the dispatch loads on demand). Each
// later candidate's predicted service adds its prefill and TPOT x its predicted length. The load is a lookup + load held for the request, which
// its begin joins at dispatch (no second transfer), of what the demand path would load then
// (`resume_at`: none of a hit it would recompute, part of one it would split).
template <class Cache, prefill_time_model Prefill>
void tiered_replayer<Cache, Prefill>::maybe_prefetch(std::span<const sim::request> reqs, double now,
                                                     tiered_replay_result& r) {
  if (o_.prefetch == prefetch_kind::none) return;
  std::vector<std::size_t> next;
  if (o_.scheduler == scheduler_kind::fcfs) {
    for (std::size_t k = 0; k < fcfs_.size() && next.size() < o_.prefetch_depth; ++k) next.push_back(fcfs_[k]);
  } else {
    refill_window();
    for (const auto id : queue_.window()) {
      if (next.size() >= o_.prefetch_depth) break;
      next.push_back(static_cast<std::size_t>(id));
    }
  }
  const std::size_t e = earliest_engine();
  const double gpu_free = std::max(now, engine_free_[e]);
  double dispatch_at = gpu_free;
  // Colocated: the engines as CaR's prefetcher sees them (none when one is idle: the next
  // request dispatches now), and the dispatch their predicted ends give.
  std::vector<tiered::running_request> on_gpu;
  if (colocated() && engine_free_[e] > now) {
    for (std::size_t g = 0; g < engines_; ++g)
      on_gpu.push_back({.timer_ms = engine_timer_[g], .predicted_tokens = std::max(engine_predicted_[g] - 1.0, 0.0)});
    const tiered::prefetch_context ends{.now_ms = now, .tpot_ms = o_.tpot_ms, .running = on_gpu, .bytes = 0.0,
                                       .bandwidth_bytes_per_ms = 1.0};
    dispatch_at = std::max(now, now + tiered::deadline_prefetch::min_remaining_ms(ends));
  }
  for (std::size_t k = 0; k < next.size(); ++k) {
    const std::size_t c = next[k];
    const sim::request& q = reqs[c];
    const auto m = cache_.peek(q.input);
    const stores::tiered_probe below = cache_.store().probe_hit(q.input, m);
    const std::int64_t resume = below.resume_tokens;
    const std::int64_t lower = tokens_of(q, resume) - tokens_of(q, m.reusable_tokens);
    double service = prefill_ms_after(prefill_, tokens_of(q, resume), q.input_tokens - tokens_of(q, resume));
    if (colocated()) service += o_.tpot_ms * std::max(lengths_.predict(q) - 1.0, 0.0);
    if (lower > 0 && !prefetched_.count(c)) {
      double start = now;
      if (o_.prefetch == prefetch_kind::threshold) {
        if (lower < o_.threshold_tokens) {
          dispatch_at += service / static_cast<double>(engines_);
          continue;
        }
      } else {
        // CaR's rule with the predicted remaining service before this request's dispatch in
        // place of TPOT·len_i − (t − timer_i); the transfer from the tier the hit is priced
        // at (as worth_loading): its link, and its latency once per entry read.
        const tier_id from = priced_tier(below.source_tier);
        const double bytes = static_cast<double>(cache_.store().kv_bytes(resume - m.common_prefix)) +
                             static_cast<double>(cache_.store().checkpoint_bytes());
        const double jobs = static_cast<double>(below.kv_entries + (below.checkpoint ? 1 : 0));
        const tiered::running_request run[] = {{.timer_ms = now, .predicted_tokens = dispatch_at - now}};
        const bool paper_rule = colocated() && k == 0;  // CaR's rule on the engines' timers
        const tiered::prefetch_context ctx{.now_ms = now,
                                   .tpot_ms = paper_rule ? o_.tpot_ms : 1.0,
                                   .running = paper_rule ? std::span<const tiered::running_request>(on_gpu)
                                                         : std::span<const tiered::running_request>(run),
                                   .bytes = bytes,
                                   .bandwidth_bytes_per_ms = engine_.copy_gbps(from, tier_id{0}) * 1e6,
                                   .latency_ms = engine_.latency_ms(from) * jobs,
                                   .lower_hit_tokens = lower};
        start = tiered::deadline_prefetch::fire_time(ctx);
        if (paper_rule && start > now && start >= gpu_free) break;  // the dispatch comes first: a demand load
        if (start > (k == 0 ? std::numeric_limits<double>::infinity() : gpu_free)) break;  // decided at the next dispatch
      }
      engine_.set_now(std::max(now, start));
      engine_.use_link(e);
      auto h = cache_.store().lookup(q.input, m);
      // The demand path's choice, priced at the predicted dispatch: a hit it would recompute
      // is not prefetched, one it would load in part is prefetched in part (a whole prefetch
      // of a hit that dispatch would decline or split only takes the link from demand loads).
      const std::int64_t at = h.host_tokens > 0 ? resume_at(q, h, std::max(now, dispatch_at), e) : h.hbm_tokens;
      bool take = at > h.hbm_tokens && (at >= h.reusable_tokens || cache_.store().shorten_hit(h, at).has_value());
      // A prefetch yields to demand: it stages only into HBM the cleaner keeps free, beside
      // the request's own reservation (prefetch_fits_free_hbm), never into pages evictions
      // would have to free by write-backs the requests dispatched meanwhile wait for.
      if (take && !prefetch_fits_free_hbm(q, h)) {
        take = false;
        r.prefetches_declined_for_room += 1;
      }
      if (take && cache_.store().load(h)) {
        prefetched_.emplace(c, h);
        r.prefetches += 1;
      } else {
        cache_.store().release_hit(h);
      }
      engine_.set_now(now);
    }
    dispatch_at += service / static_cast<double>(engines_);
  }
}

}  // namespace hybridcache::sim::detail
