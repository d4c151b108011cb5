// hybridcache/sim/detail/tiered_replayer.hpp
//
// The engine of the timed multi-tier replay (tiered_replay.hpp; the model is described in
// docs/tiered.md): a pool of prefill engines fed by one queue drives a `prefix_cache` over
// a `tiered_state_store` through the request lifecycle, as a runtime does, while a
// `timed_copy_engine` times every copy the store makes. The request loop and the
// prefetcher are in tiered_replayer_run.hpp. Internal: use run_tiered_replay.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <queue>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/model/prefill_time.hpp"
#include "hybridcache/prefix/lifecycle.hpp"
#include "hybridcache/sim/request.hpp"
#include "hybridcache/sim/timed_copy_engine.hpp"
#include "hybridcache/sim/tiered_replay_options.hpp"
#include "hybridcache/tiered/car_score.hpp"
#include "hybridcache/tiered/layer_pipeline.hpp"
#include "hybridcache/tiered/length_predictor.hpp"
#include "hybridcache/tiered/prefetch.hpp"
#include "hybridcache/tiered/scheduler.hpp"

namespace hybridcache::sim::detail {

inline double percentile_of_sorted(const std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

/// The replay's output-length predictor, chosen at run time (`length_predictor_kind`): it
/// learns each request's true length when its decode ends (`learn_until`), never before, so
/// a prediction sees only what a real scheduler would have seen. The oracle answers the true
/// length (the bound a predictor can reach).
class replay_length_predictor {
 public:
  explicit replay_length_predictor(length_predictor_kind k) : kind_(k) {}
  [[nodiscard]] double predict(const sim::request& q) const noexcept {
    switch (kind_) {
      case length_predictor_kind::mean: return mean_.predict(q.input_tokens);
      case length_predictor_kind::bucket: return bucket_.predict(q.input_tokens);
      case length_predictor_kind::oracle: break;
    }
    return static_cast<double>(q.output_tokens);
  }
  /// Request `q`'s decode ends at `end_ms`: its length is learnt then.
  void finished_at(double end_ms, const sim::request& q) { pending_.push({end_ms, q.input_tokens, q.output_tokens}); }
  /// Learns every length whose decode ended by `now_ms`.
  void learn_until(double now_ms) {
    while (!pending_.empty() && pending_.top().end_ms <= now_ms) {
      const auto x = pending_.top();
      pending_.pop();
      mean_.observe(x.prompt, x.output);
      bucket_.observe(x.prompt, x.output);
    }
  }

 private:
  struct ended {
    double end_ms;
    std::int64_t prompt, output;
    friend bool operator>(const ended& a, const ended& b) noexcept { return a.end_ms > b.end_ms; }
  };
  length_predictor_kind kind_;
  tiered::running_mean_predictor mean_{};
  tiered::bucketed_length_predictor bucket_{};
  std::priority_queue<ended, std::vector<ended>, std::greater<>> pending_;
};

template <class Cache, prefill_time_model Prefill>
class tiered_replayer {
 public:
  /// `per_id`: real tokens one id of the trace stands for (the store's bytes are per id).
  tiered_replayer(Cache& cache, sim::timed_copy_engine& engine, const cost_model& model, const Prefill& prefill,
                  const tiered_replay_options& o, std::size_t engines, std::int32_t per_id)
      : cache_(cache), requests_(cache), engine_(engine), m_(model), prefill_(prefill), o_(o), engines_(engines),
        per_id_(per_id), queue_({.window = o.car_window, .seed = o.seed, .max_bypass = 64}),
        lengths_(o.length_predictor) {
    for (const auto k : model.spec().layers)
      if (k != layer_kind::mlp) mixers_.push_back(k);
    layer_bytes_.assign(mixers_.size(), 0.0);
    arrive_.assign(mixers_.size(), 0.0);
    if constexpr (requires { cache.scorer().board(); }) car_ = &cache.scorer().board();
  }

  tiered_replay_result run(std::span<const sim::request> reqs);

 private:
  struct running {
    double end_ms;
    prefix::request_ticket ticket;
    std::size_t index;
    friend bool operator>(const running& a, const running& b) noexcept { return a.end_ms > b.end_ms; }
  };

  [[nodiscard]] std::int64_t tokens_of(const sim::request& q, std::int64_t ids) const noexcept {
    return std::clamp<std::int64_t>(ids * per_id_, 0, q.input_tokens);
  }
  // A request's hit tokens by tier into `out` (index: tier): HBM's match (`hbm_tok`), then the
  // lower-tier hit as the store split it (`tiered_hit::tier_tokens`, in ids) scaled to tokens.
  // What the clamp at the input's length takes off (a last partial block) comes off the tier
  // the hit ends in first. They sum to `resume_tok`.
  template <class Hit>
  void split_by_tier(const Hit& h, std::int64_t hbm_tok, std::int64_t resume_tok,
                     std::vector<std::int64_t>& out) const {
    out.assign(std::max<std::size_t>(o_.tiers.size(), 1), 0);
    out[0] = hbm_tok;
    const std::int64_t lower = resume_tok - hbm_tok;
    if (lower <= 0) return;
    auto tok = h.tier_tokens;  // a copy, scaled to tokens
    std::int64_t excess = -lower;
    for (auto& n : tok) excess += n *= per_id_;
    auto take = [&](std::size_t t) {
      const std::int64_t off = std::min(excess, tok[t]);
      tok[t] -= off;
      excess -= off;
    };
    if (excess > 0) take(Hit::slot_of(h.end_tier));
    for (std::size_t t = tok.size(); excess > 0 && t-- > 0;) take(t);
    if (excess < 0) tok[Hit::slot_of(h.source_tier)] -= excess;  // not split by the store: its slowest tier
    if (out.size() < tok.size()) {
      std::size_t used = 0;
      for (std::size_t t = 0; t < tok.size(); ++t) used = tok[t] > 0 ? t + 1 : used;
      if (out.size() < used) out.resize(used, 0);
    }
    for (std::size_t t = 0; t < tok.size(); ++t)
      if (tok[t] > 0) out[t] += tok[t];
  }
  [[nodiscard]] double arrival_ms(std::size_t i) const { return arrivals_[i]; }
  // Decode time after the first token: TPOT per output token after it.
  [[nodiscard]] double decode_ms(const sim::request& q) const noexcept {
    return o_.tpot_ms * static_cast<double>(std::max<std::int64_t>(q.output_tokens - 1, 0));
  }
  [[nodiscard]] bool colocated() const noexcept { return o_.decode == decode_placement::colocated; }
  [[nodiscard]] std::size_t earliest_engine() const {
    return static_cast<std::size_t>(std::min_element(engine_free_.begin(), engine_free_.end()) - engine_free_.begin());
  }

  // Compute time of each mixer layer for `n` new tokens after `prefix` cached ones: the
  // prefill-time policy's total, split in proportion to each layer's FLOPs (its mixer plus
  // an equal share of the MLPs), so attention layers over a long prefix take longer.
  void compute_layers(std::int64_t prefix, std::int64_t n) {
    n = std::max<std::int64_t>(n, 0);
    prefix = std::max<std::int64_t>(prefix, 0);
    const double total = prefill_ms_after(prefill_, prefix, n);
    compute_ms_.assign(mixers_.size(), total / static_cast<double>(std::max<std::size_t>(mixers_.size(), 1)));
    if (n == 0 || mixers_.empty()) return;
    const double mlp_share = static_cast<double>(m_.mlp_layers()) * static_cast<double>(m_.mlp_flops(n)) /
                             static_cast<double>(mixers_.size());
    double sum = 0.0;
    for (std::size_t l = 0; l < mixers_.size(); ++l) {
      const double mixer = mixers_[l] == layer_kind::attention
                               ? static_cast<double>(m_.attention_flops(prefix + n) - m_.attention_flops(prefix))
                               : static_cast<double>(m_.recurrent_flops(n));
      compute_ms_[l] = mixer + mlp_share;
      sum += compute_ms_[l];
    }
    for (auto& x : compute_ms_) x = sum > 0 ? total * x / sum : total / static_cast<double>(compute_ms_.size());
  }

  // Per-layer arrival times of a batch of `kv_bytes` of KV and `ckpt_bytes` of checkpoint
  // moved layer by layer (model order) from `start` over `[start, done]`: layer l is in once
  // every layer up to it has crossed the link. Writes arrive_.
  void layer_arrivals(double start, double done, double kv_bytes, double ckpt_bytes) {
    const double per_attn = m_.attention_layers() > 0 ? kv_bytes / static_cast<double>(m_.attention_layers()) : 0.0;
    const double per_rec = m_.recurrent_layers() > 0 ? ckpt_bytes / static_cast<double>(m_.recurrent_layers()) : 0.0;
    const double total = kv_bytes + ckpt_bytes;
    double cum = 0.0;
    for (std::size_t l = 0; l < mixers_.size(); ++l) {
      cum += mixers_[l] == layer_kind::attention ? per_attn : per_rec;
      arrive_[l] = total > 0 ? start + (done - start) * std::min(1.0, cum / total) : start;
    }
  }

  // Layer-wise pipeline: layer l computes once layer l-1 is done and its data is in (or,
  // without layer-wise loading, once everything is in). Returns the finish time.
  [[nodiscard]] double pipeline(double start) const {
    double t = start;
    if (!o_.layerwise) t = std::max(t, arrive_.empty() ? start : *std::max_element(arrive_.begin(), arrive_.end()));
    for (std::size_t l = 0; l < mixers_.size(); ++l) t = std::max(t, o_.layerwise ? arrive_[l] : t) + compute_ms_[l];
    if (mixers_.empty()) t += compute_ms_.empty() ? 0.0 : compute_ms_.front();
    return t;
  }

  // The tier a lower-tier hit is priced at: the slowest it reads from (a disk or Redis hit
  // is not a host hit); tier 1 when the hit names none.
  static tier_id priced_tier(tier_id source) noexcept { return source.value > 0 ? source : tier_id{1}; }

  // The hit filter of `begin`: where prefill resumes, in ids. The whole hit is loaded only
  // if the pipelined load finishes no later than recomputing those tokens (the link's queue
  // and bandwidth, the per-copy overhead); for a model without recurrent layers also a
  // prefix of it, when that finishes sooner still. hbm_tokens: recompute it all.
  template <class Hit>
  std::int64_t resume_at(const sim::request& q, const Hit& h, double t0, std::size_t e) {
    if (!o_.recompute_when_faster) return h.reusable_tokens;
    const tier_id below = priced_tier(h.source_tier);
    const double start = std::max(t0, engine_.onboard_free_at(e, below));
    const double ckpt = static_cast<double>(h.host_checkpoint ? cache_.store().checkpoint_bytes() : 0);
    const double kv = std::max(0.0, static_cast<double>(h.bytes_to_load) - ckpt);
    // Prefill finishing if the hit resumed at `ids` (its KV up to there loaded, as the timed
    // engine books it: the bytes over the link, the tier's latency per entry copied, the
    // per-copy cost per layer segment; the KV in proportion to the tokens loaded).
    auto finish_if = [&](std::int64_t ids) {
      const double part = h.host_tokens > 0 ? static_cast<double>(ids - h.hbm_tokens) / static_cast<double>(h.host_tokens) : 1.0;
      const double entries = std::ceil(static_cast<double>(h.kv_entries) * part);  // those the prefix reads
      const double calls = entries * static_cast<double>(std::max<std::int64_t>(m_.attention_layers(), 1)) +
                           static_cast<double>(std::max<std::int64_t>(m_.recurrent_layers(), 1));
      const double jobs = entries + (h.host_checkpoint ? 1.0 : 0.0);
      const double bytes = kv * part + ckpt;
      const double done = start + bytes / (engine_.copy_gbps(below, tier_id{0}) * 1e6) + engine_.latency_ms(below) * jobs +
                          engine_.per_copy_ms() * calls;
      layer_arrivals(start, done, kv * part, ckpt);
      const std::int64_t at = tokens_of(q, ids);
      compute_layers(at, std::max<std::int64_t>(1, q.input_tokens - at));
      return pipeline(t0);
    };
    const double with_load = finish_if(h.reusable_tokens);
    const std::int64_t hbm = tokens_of(q, h.hbm_tokens);
    compute_layers(hbm, std::max<std::int64_t>(1, q.input_tokens - hbm));
    std::fill(arrive_.begin(), arrive_.end(), t0);
    const double without = pipeline(t0);
    std::int64_t best = with_load <= without ? h.reusable_tokens : h.hbm_tokens;
    double best_ms = std::min(with_load, without);
    // A model without recurrent layers may resume anywhere its KV reaches: where the whole
    // load would outlast the compute it hides behind, load a prefix of the hit and recompute
    // the rest (CaR's resume-point choice). Coarse to fine: up to 32 evenly spaced positions
    // between the ends, then as many between the neighbours of the best one, and so on down
    // to adjacent ids: O(32 log_32 n) evaluations for a hit of n ids (32 positions alone
    // skipped whole blocks of a long hit and left its excess load exposed).
    if (cache_.store().checkpoint_bytes() == 0 && h.host_tokens > 1) {
      constexpr std::int64_t grid = 32;
      std::int64_t lo = h.hbm_tokens, hi = h.reusable_tokens;
      double lo_ms = without, hi_ms = with_load;
      std::array<std::pair<std::int64_t, double>, grid + 2> points{};
      while (hi - lo > 1) {
        const std::int64_t steps = std::min<std::int64_t>(grid, hi - lo - 1);
        std::size_t n = 0, at = 0;
        points[n++] = {lo, lo_ms};
        for (std::int64_t k = 1; k <= steps; ++k) {
          const std::int64_t ids = lo + ((hi - lo) * k) / (steps + 1);
          if (ids <= points[n - 1].first || ids >= hi) continue;
          const double ms = finish_if(ids);
          if (ms < best_ms) best_ms = ms, best = ids;
          points[n++] = {ids, ms};
        }
        points[n++] = {hi, hi_ms};
        if (steps == hi - lo - 1) break;  // every position between the ends tried
        for (std::size_t j = 1; j < n; ++j)
          if (points[j].second < points[at].second) at = j;
        const std::size_t left = at > 0 ? at - 1 : 0, right = std::min(at + 1, n - 1);
        lo = points[left].first, lo_ms = points[left].second;
        hi = points[right].first, hi_ms = points[right].second;
      }
    }
    return best;
  }

  // `prefetch_has_room` (tiered/prefetch.hpp) for `hit`'s load and the reservation `q`
  // makes at dispatch: its ids past the hit and its output (KV), and one checkpoint.
  template <class Hit>
  [[nodiscard]] bool prefetch_fits_free_hbm(const sim::request& q, const Hit& hit) const {
    const auto& store = cache_.store();
    const auto rest = static_cast<std::int64_t>(q.input.size() + q.output.size()) - hit.reusable_tokens;
    return tiered::prefetch_has_room(store.tier_used_bytes(tier_id{0}), hit.bytes_to_load,
                             store.kv_bytes(std::max<std::int64_t>(rest, 0)) + store.checkpoint_bytes(),
                             store.table().usage(tier_id{0}).capacity_bytes, store.config().offload.high);
  }

  // Per-layer arrival of what `hit`'s load brings (its own copies and those it joined).
  template <class Hit>
  void load_arrivals(const Hit& hit, double now) {
    double start = std::numeric_limits<double>::infinity(), done = now, kv = 0.0, ckpt = 0.0;
    cache_.store().for_each_load(hit, [&](const stores::staged_entry& s, const sim::timed_copy_engine::event* ev) {
      if (ev == nullptr) return;  // landed already
      const auto& j = engine_.at(*ev);
      start = std::min(start, j.start_ms);
      done = std::max(done, j.done_ms);
      (s.checkpoint ? ckpt : kv) += static_cast<double>(j.bytes);
    });
    if (!std::isfinite(start)) {
      std::fill(arrive_.begin(), arrive_.end(), now);
      return;
    }
    layer_arrivals(start, done, kv, ckpt);
  }

  // --- CaR's score events (only with a car_scorer: `car_` set) ---------------------------
  // The nodes `seq` reuses in HBM now: its matched path and the node it enters in part.
  std::span<const node_id> hbm_path_of(std::span<const token_id> seq) {
    const auto w = cache_.tree().walk(seq, car_path_);
    if (w.partial != no_node) car_path_.push_back(w.partial);
    return car_path_;
  }
  std::span<const node_id> hbm_path_of(std::size_t i) { return hbm_path_of(all_[i].input); }
  // Every change of a node's score is copied onto its KV and checkpoint entries
  // (tiered::mirror_score), so the store's car_score_demotion (the tiers below HBM, the
  // cleaner) orders by the same scores as the HBM victims.
  void car_mirror(std::span<const node_id> path) { tiered::mirror_scores(*car_, cache_.tree(), cache_.store(), path); }
  // Request `i` entered the window (+enter_window on its nodes).
  void car_enter(std::size_t i) {
    if (car_ == nullptr) return;
    const auto path = hbm_path_of(i);
    car_->enter_window(i, path);
    car_mirror(path);
  }
  // The FCFS queue has no shuffled window: its first `car_window` requests are the window.
  void car_enter_fcfs_window() {
    if (car_ == nullptr) return;
    while (fcfs_entered_ < std::min(o_.car_window, fcfs_.size())) car_enter(fcfs_[fcfs_entered_++]);
  }
  // Refills CaR's window when it is empty; the requests that enter it are credited.
  void refill_window() {
    if (!queue_.window().empty()) return;
    for (const auto id : queue_.refill()) car_enter(static_cast<std::size_t>(id));
  }
  // Request `i` was sent to an engine now (+dispatch on its nodes); its generation completes
  // at `last_token_ms` (the credits are withdrawn then, by finish_until).
  void car_dispatch(std::size_t i) {
    if (car_ == nullptr) return;
    const auto path = hbm_path_of(i);
    car_->dispatch(i, path);
    car_mirror(path);
  }
  // Request `i`'s generation completed: its credits are withdrawn, and mirrored.
  void car_complete(std::size_t i) {
    car_->complete(i, [this](node_id n, double) noexcept { tiered::mirror_score(*car_, cache_.tree(), cache_.store(), n); });
  }
  void car_completes_at(std::size_t i, double last_token_ms) {
    if (car_ != nullptr) car_done_.push({last_token_ms, i});
  }

  void admit(std::span<const sim::request> reqs, std::size_t i) {
    if (o_.scheduler == scheduler_kind::fcfs) {
      fcfs_.push_back(i);
      car_enter_fcfs_window();
      return;
    }
    const auto m = cache_.peek(reqs[i].input);
    const std::int64_t lower = cache_.store().probe(reqs[i].input, m) - m.reusable_tokens;
    (void)queue_.push(i, tiered::classify(m.reusable_tokens, lower));
  }
  [[nodiscard]] bool queue_empty() const noexcept {
    return o_.scheduler == scheduler_kind::fcfs ? fcfs_.empty() : queue_.empty();
  }
  std::size_t pick() {
    if (o_.scheduler == scheduler_kind::fcfs) {
      const std::size_t i = fcfs_.front();
      fcfs_.pop_front();
      if (fcfs_entered_ > 0) --fcfs_entered_;
      car_enter_fcfs_window();
      return i;
    }
    refill_window();
    return static_cast<std::size_t>(*queue_.pop());
  }

  // Ends the requests whose decode is over by `t`, in time order: finish inserts the
  // sequence and settles the store (names the path, adopts the loaded pages); CaR's score
  // credits the nodes the request's own KV made. CaR's completions (credits withdrawn) come
  // in the same time order, after the finishes of the same time: a request's finish (at the
  // end of its prefill, or of its decode when colocated) is never after its completion.
  void finish_until(double t) {
    for (;;) {
      const bool fin = !running_.empty() && running_.top().end_ms <= t;
      const bool done = !car_done_.empty() && car_done_.top().first <= t;
      if (!fin && !done) break;
      if (done && (!fin || car_done_.top().first < running_.top().end_ms)) {
        car_complete(car_done_.top().second);
        car_done_.pop();
        continue;
      }
      const running r = running_.top();
      running_.pop();
      engine_.set_now(r.end_ms);
      const sim::request& q = all_[r.index];
      seq_.assign(q.input.begin(), q.input.end());
      seq_.insert(seq_.end(), q.output.begin(), q.output.end());
      captured_.clear();
      std::int64_t from = static_cast<std::int64_t>(seq_.size());
      if (const auto st = requests_.state(r.ticket); st) {
        from = (*st)->match.reusable_tokens;
        for (const auto& site : (*st)->plan.sites)
          if (site.position > from && site.position < static_cast<std::int64_t>(seq_.size())) captured_.push_back(site.position);
      }
      // The state after the last token, unless the request computed nothing (a full hit).
      if (static_cast<std::int64_t>(seq_.size()) > from) captured_.push_back(static_cast<std::int64_t>(seq_.size()));
      if (!requests_.finish(r.ticket, seq_, captured_)) ++finish_failures_;
      if (car_ != nullptr) {
        const auto path = hbm_path_of(seq_);
        car_->adopt(r.index, path);
        car_mirror(path);  // the whole path: the insert may have given an older node a checkpoint
      }
      (void)cache_.store().offload();  // the cleaner runs off the request path
    }
  }

  void maybe_prefetch(std::span<const sim::request> reqs, double now, tiered_replay_result& r);

  Cache& cache_;
  prefix::request_lifecycle<Cache> requests_;
  sim::timed_copy_engine& engine_;
  const cost_model& m_;
  const Prefill& prefill_;
  const tiered_replay_options& o_;
  std::size_t engines_;
  std::int32_t per_id_;
  tiered::car_request_queue queue_;
  std::deque<std::size_t> fcfs_;
  std::vector<layer_kind> mixers_;
  std::vector<double> compute_ms_, arrive_, layer_bytes_;
  std::vector<std::int64_t> by_tier_;  // one request's hit tokens by tier (split_by_tier)
  std::span<const sim::request> all_;
  std::vector<double> arrivals_, engine_free_;
  // Colocated: per engine, CaR's timer_i (its request's first token) and len_i (predicted).
  std::vector<double> engine_timer_, engine_predicted_;
  replay_length_predictor lengths_;
  std::priority_queue<running, std::vector<running>, std::greater<>> running_;
  std::unordered_map<std::size_t, stores::tiered_hit> prefetched_;
  std::vector<token_id> seq_;
  std::vector<std::int64_t> captured_;
  std::int64_t finish_failures_ = 0;
  // CaR's score board (the car_scorer's; null otherwise), the FCFS requests credited as in
  // the window, the generations to complete (last-token time, request), a path buffer.
  tiered::car_score_board* car_ = nullptr;
  std::size_t fcfs_entered_ = 0;
  std::priority_queue<std::pair<double, std::size_t>, std::vector<std::pair<double, std::size_t>>, std::greater<>> car_done_;
  std::vector<node_id> car_path_;
};

}  // namespace hybridcache::sim::detail

#include "hybridcache/sim/detail/tiered_replayer_run.hpp"  // IWYU pragma: keep
