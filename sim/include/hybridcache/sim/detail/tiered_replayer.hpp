// hybridcache/sim/detail/tiered_replayer.hpp
//
// The engine of the tiered timeline replay (tiered_replay.hpp; the model is described in
// docs/replay.md): the class, its state and its small steps. The request loop (`run`) and
// the prefetcher are defined in tiered_replayer_run.hpp. Internal: use run_tiered_replay.
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

namespace hybridcache::tiered::detail {

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

  tiered_replay_result run(std::span<const sim::request> reqs);

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
        bl.ids.push_back(make_entry_id(h));
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
                      double now, tiered_replay_result& r);

  // Starts request idx's lower-tier loads ahead of its predicted dispatch when the rule says
  // so. A deadline load due after `latest_start` (the next decision point) is not booked
  // yet (false): booking it would hold the link against loads needed sooner.
  bool prefetch_one(std::size_t idx, const sim::request& q, const match_result& mt, double now, double dispatch_at,
                    double latest_start, tiered_replay_result& r);

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

}  // namespace hybridcache::tiered::detail
