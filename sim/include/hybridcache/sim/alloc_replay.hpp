// hybridcache/sim/alloc_replay.hpp
//
// Allocator replay: the AVMP reference harness (codepawl/cachepawl benchmarks/harness,
// anchor avmp.md 1.10) driving our pools on identical input.
//
// Harness semantics (kept exactly, so that static variants reproduce the reference's OOM
// counts): virtual ticks, prefill costs prompt_tokens ticks; events ordered by (tick,
// departure < growth < arrival, request id); an arrival makes one call of
// max(1, ceil(prompt / 16)) KV pages per attention layer, then one call of 1 SSM block
// per recurrent layer; a growth event (a decode step crossing a 16-token page boundary)
// makes one 1-page call per attention layer, and is dropped when it lands on the
// departure tick; a departure frees everything the request holds. A call that cannot be
// served evicts one request (least recently allocating, per pool; one LRU for the padded
// pool) from the failing pool and retries once; the dynamic variants also rebalance; a
// call that still fails is one OOM event, and the request carries on.
//
// Beyond the reference: evictions are counted, and `completed` counts requests that had
// neither an OOM nor an eviction (the reference's `completed_reference` ignores
// evictions). Every call is on a logical clock, so the LRU order is deterministic.
//
// Evaluation metrics (the AVMP paper's section 4 / the reference's metrics.py, computed in
// this same loop; "ticks" are the harness's virtual clock, so every metric but the *_seconds
// ones is deterministic, where the paper measures goodput and time to first OOM in wall
// time and says they are therefore not reproducible):
// - replay_ticks: last departure tick - first arrival tick (the same for every variant,
//   since arrivals and departures come from the trace, not from the allocator).
// - goodput_per_ktick: 1000 x completed / replay_ticks, completed requests (ours: neither
//   an OOM nor an eviction) per 1,000 ticks. The paper's goodput is completed requests per
//   wall-clock second; on the virtual clock a faster allocator finishes no sooner, so this
//   one measures what the allocator lets finish, not its speed.
//   goodput_requests_per_second is the paper's own (completed_reference / wall_seconds).
// - batch_size_p50: the paper's effective_batch_size_p50: the median of the active-request
//   count sampled every sample_every_events events plus once at the end, over the samples
//   with at least one active request, numpy's default (linear) percentile. It depends on
//   the trace only (evicted and OOM'd requests stay active), as the paper found.
// - time_to_first_oom_ticks: tick of the event whose call failed first - first arrival
//   tick; unset when no call failed (the paper: wall seconds, None without an OOM).
// - Phase breakdown, the paper's four buckets (Fig. 4; metrics.py schema 1.3.0), in wall
//   time: service_seconds (allocate calls that succeeded, and departures' frees),
//   oom_retry_seconds (allocate calls that ended in an OOM, their evictions and retries
//   included), migration_seconds (inside the rebalancer's migrations; overlaps the two
//   before, as in the paper), idle_seconds (wall - service - oom_retry, clamped at 0:
//   event sorting, bookkeeping, sampling). Deterministic counterpart, per allocate call:
//   calls_served_directly (first try), calls_served_after_eviction, calls_served_after_
//   rebalance (a migration happened during the call, inline or on the ladder), and the
//   failed ones (oom_events); the four sum to allocate_calls.
// Cost: two steady_clock reads per allocate call and per departure, one int per sample.
//
// Variants: padded_unified, fixed_dual_mr05 / _mr09 (ssm ratio 0.5 / 0.9), avmp_static_mr05
// (our asymmetric pool, no rebalancing), avmp_dynamic_b128 (the paper's ladder: evict,
// then a rebalance of 128 donor units gated by threshold_high 0.30 and the 1000-op
// throttle, on our chunk stores), vmm_dynamic (ours: the victim is evicted from both pools
// so its other-pool chunks can move, then a rebalance sized to the demand, compaction on,
// gate 0.05, throttle 100 ops).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/fixed_dual_pool.hpp"
#include "hybridcache/memory/padded_unified_pool.hpp"
#include "hybridcache/sim/alloc_workloads.hpp"

namespace hybridcache::sim {

/// Allocator variants of the AVMP sweep, plus ours.
enum class alloc_variant : std::uint8_t {
  padded_unified,
  fixed_dual_mr05,
  fixed_dual_mr09,
  avmp_static_mr05,
  avmp_dynamic_b128,
  vmm_dynamic,
};

inline constexpr alloc_variant all_alloc_variants[] = {
    alloc_variant::padded_unified,   alloc_variant::fixed_dual_mr05,   alloc_variant::fixed_dual_mr09,
    alloc_variant::avmp_static_mr05, alloc_variant::avmp_dynamic_b128, alloc_variant::vmm_dynamic};

[[nodiscard]] constexpr std::string_view to_string(alloc_variant v) noexcept {
  switch (v) {
    case alloc_variant::padded_unified: return "padded_unified";
    case alloc_variant::fixed_dual_mr05: return "fixed_dual_mr05";
    case alloc_variant::fixed_dual_mr09: return "fixed_dual_mr09";
    case alloc_variant::avmp_static_mr05: return "avmp_static_mr05";
    case alloc_variant::avmp_dynamic_b128: return "avmp_dynamic_b128";
    case alloc_variant::vmm_dynamic: return "vmm_dynamic";
  }
  return "unknown";
}

/// @throws invalid_argument listing the variants.
[[nodiscard]] inline alloc_variant parse_alloc_variant(std::string_view name) {
  for (auto v : all_alloc_variants)
    if (to_string(v) == name) return v;
  throw invalid_argument("unknown alloc variant '" + std::string(name) +
                         "' (padded_unified, fixed_dual_mr05, fixed_dual_mr09, avmp_static_mr05, "
                         "avmp_dynamic_b128, vmm_dynamic)");
}

/// What a replayed allocate call does when the pool is full.
enum class alloc_ladder : std::uint8_t {
  evict_only,            ///< evict one LRU request of the failing pool, retry, else OOM (static)
  evict_then_rebalance,  ///< ... then ask the rebalancer, retry (the reference's dynamic ladder)
  rebalance_first,       ///< ask the rebalancer on every failed try, before and after evicting
};

/// Replay settings.
struct alloc_replay_config {
  byte_count capacity_bytes = byte_count{1} << 30;
  std::int64_t tokens_per_page = 16;
  std::int64_t sample_every_events = 100;  ///< occupancy sample period, as the reference
  /// Rebalancer of the dynamic variants; unset = the variant's defaults.
  std::optional<memory::rebalancer_config> rebalancer{};
  /// Reproduce the reference's padded_unified quirk: a departing request frees its pages
  /// by page id, including pages evicted from it and since handed to other requests
  /// (their owners lose them silently). Needed to match the reference's padded numbers;
  /// off by default (our handles are generation-checked, so this cannot happen by accident).
  bool reference_padded_id_reuse = false;
  /// Run avmp_dynamic_b128 on an emulation of the reference's AVMP stores instead of ours:
  /// per-pool Python-list free lists (LIFO, partial acquisitions rolled back in acquisition
  /// order), tail-only resizing (a shrink fails while the highest page id is live), the
  /// forced rebalance of 128 donor units that skips thresholds and throttle, capacity lost
  /// to alignment, and each store sized to the whole budget (2x reserved). Reproduces the
  /// reference's dynamic numbers; not a policy to use.
  bool reference_avmp_stores = false;
  /// Ladder and compaction of the dynamic variants; unset = the variant's defaults.
  std::optional<alloc_ladder> ladder{};
  std::optional<bool> compaction{};
  /// Evict a victim from both pools at once (its request is lost either way), so the
  /// freed units of the other pool can be migrated; unset = the variant's default (on
  /// for vmm_dynamic only; the reference evicts from the failing pool only).
  std::optional<bool> evict_whole_request{};
};

/// What one replay measured. Deterministic except wall_seconds.
struct alloc_replay_result {
  std::uint64_t submitted = 0;
  std::uint64_t oom_events = 0;           ///< failed allocate calls
  std::uint64_t completed = 0;            ///< no OOM and never evicted
  std::uint64_t completed_reference = 0;  ///< no OOM (the reference's count: evictions ignored)
  std::uint64_t evicted = 0;              ///< requests evicted at least once
  std::uint64_t eviction_events = 0;
  std::uint64_t allocate_calls = 0;
  std::uint64_t growth_events = 0;
  std::uint64_t rebalances = 0;
  byte_count bytes_migrated = 0;
  byte_count bytes_wasted = 0;        ///< migrated bytes the recipient's unit size cannot use
  byte_count padding_bytes_peak = 0;  ///< padded pool: most bytes of live pages holding padding
  std::uint64_t compactions = 0;
  double fragmentation_mean = 0;         ///< mean free fraction while requests are active (reference)
  double fragmentation_peak = 0;
  double external_fragmentation_mean = 0;  ///< mean share of free units stranded in partly used chunks
  byte_count peak_reserved_bytes = 0;
  byte_count kv_bytes_end = 0;         ///< KV pool capacity after the run
  byte_count ssm_bytes_end = 0;
  double wall_seconds = 0;

  // Evaluation metrics (definitions in the header comment).
  std::int64_t replay_ticks = 0;
  double goodput_per_ktick = 0;
  double goodput_requests_per_second = 0;  ///< the paper's: completed_reference / wall_seconds
  double batch_size_p50 = 0;
  std::optional<std::int64_t> time_to_first_oom_ticks{};
  std::uint64_t calls_served_directly = 0;
  std::uint64_t calls_served_after_eviction = 0;
  std::uint64_t calls_served_after_rebalance = 0;
  double service_seconds = 0;
  double oom_retry_seconds = 0;
  double migration_seconds = 0;
  double idle_seconds = 0;

  [[nodiscard]] double completion() const noexcept {
    return submitted ? static_cast<double>(completed) / static_cast<double>(submitted) : 0.0;
  }
  [[nodiscard]] double completion_reference() const noexcept {
    return submitted ? static_cast<double>(completed_reference) / static_cast<double>(submitted) : 0.0;
  }
};

namespace detail {

using ladder = alloc_ladder;

struct alloc_event {
  std::int64_t tick;
  std::uint8_t priority;  // departure 0, growth 1, arrival 2
  std::uint32_t request;
  friend bool operator<(const alloc_event& a, const alloc_event& b) noexcept {
    if (a.tick != b.tick) return a.tick < b.tick;
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.request < b.request;
  }
};

// Per-pool LRU of requests by their last successful allocation, with the handles each
// holds there. Intrusive list: touch and evict are O(1) (the reference scans).
class request_lru {
 public:
  explicit request_lru(std::size_t requests) : entries_(requests) {}
  void touch(std::uint32_t r, std::span<const packed_handle> hs) {
    entry& e = entries_[r];
    if (e.listed) unlink(r);
    link_back(r);
    e.handles.insert(e.handles.end(), hs.begin(), hs.end());
  }
  [[nodiscard]] std::optional<std::uint32_t> oldest() const noexcept {
    if (head_ == npos) return std::nullopt;
    return head_;
  }
  /// Forgets `h` from r's entry; an entry left empty leaves the LRU (as the reference's
  /// remove_pages does). O(handles of r).
  void remove(std::uint32_t r, packed_handle h) {
    entry& e = entries_[r];
    auto it = std::find(e.handles.begin(), e.handles.end(), h);
    if (it == e.handles.end()) return;
    e.handles.erase(it);
    if (e.handles.empty() && e.listed) unlink(r);
  }
  std::vector<packed_handle> drop(std::uint32_t r) {
    entry& e = entries_[r];
    if (e.listed) unlink(r);
    std::vector<packed_handle> out;
    out.swap(e.handles);
    return out;
  }

 private:
  static constexpr std::uint32_t npos = 0xffffffffu;
  struct entry {
    std::uint32_t prev = npos, next = npos;
    bool listed = false;
    std::vector<packed_handle> handles;
  };
  void link_back(std::uint32_t r) {
    entry& e = entries_[r];
    e.prev = tail_;
    e.next = npos;
    if (tail_ != npos) entries_[tail_].next = r;
    else head_ = r;
    tail_ = r;
    e.listed = true;
  }
  void unlink(std::uint32_t r) {
    entry& e = entries_[r];
    if (e.prev != npos) entries_[e.prev].next = e.next;
    else head_ = e.next;
    if (e.next != npos) entries_[e.next].prev = e.prev;
    else tail_ = e.prev;
    e.prev = e.next = npos;
    e.listed = false;
  }
  std::vector<entry> entries_;
  std::uint32_t head_ = npos, tail_ = npos;
};

// The reference's AVMP pool, emulated for fidelity checks only (anchor avmp.md 1.4-1.6):
// PageTable free lists are Python lists (pop from the back; frees append), resizing is
// tail-only, handle ids are never reused, and a failed allocation after one eviction
// triggers a forced rebalance of `batch` donor units.
class reference_avmp_pool {
 public:
  // The reference computes in unsigned bytes; the arguments are the API's byte_count (> 0).
  reference_avmp_pool(byte_count budget, byte_count kv_unit, byte_count ssm_unit, double ssm_ratio,
                      std::uint32_t batch)
      : budget_(static_cast<std::uint64_t>(budget)), batch_(batch) {
    const auto ssm_bytes = static_cast<std::uint64_t>(static_cast<double>(budget_) * ssm_ratio);
    stores_[0].init(static_cast<std::uint64_t>(kv_unit), budget_, budget_ - ssm_bytes);
    stores_[1].init(static_cast<std::uint64_t>(ssm_unit), budget_, ssm_bytes);
  }

  expected<void> allocate_n(pool_kind kind, std::span<packed_handle> out, bool = true) {
    store& st = stores_[static_cast<int>(kind)];
    std::size_t got = 0;
    for (; got < out.size(); ++got) {
      if (st.free_list.empty()) break;
      const std::uint32_t page = st.free_list.back();
      st.free_list.pop_back();
      st.used[page] = 1;
      out[got] = packed_handle::make(1 + static_cast<std::uint32_t>(kind), static_cast<std::uint32_t>(pages_.size()), 1);
      pages_.push_back({kind, page, true});
    }
    if (got == out.size()) return {};
    for (std::size_t i = 0; i < got; ++i) {  // roll back in acquisition order (appends)
      auto& rec = pages_[out[i].index()];
      rec.live = false;
      st.release(rec.page);
    }
    return unexpected(errc::out_of_capacity);
  }

  expected<void> free(packed_handle h) noexcept {
    if (h.index() >= pages_.size() || !pages_[h.index()].live) return unexpected(errc::double_free);
    auto& rec = pages_[h.index()];
    rec.live = false;
    stores_[static_cast<int>(rec.kind)].release(rec.page);
    return {};
  }

  // Forced rebalance toward `kind` (the reference's _apply_rebalance); 1 on success.
  std::uint32_t rebalance_on_failure(pool_kind kind, std::int64_t) {
    store& recipient = stores_[static_cast<int>(kind)];
    store& donor = stores_[1 - static_cast<int>(kind)];
    const std::uint64_t donor_bytes = std::uint64_t{batch_} * donor.unit;
    const std::uint64_t recipient_bytes = donor_bytes / recipient.unit * recipient.unit;
    const std::uint64_t donor_before = std::uint64_t{donor.total} * donor.unit;
    const std::uint64_t recipient_before = std::uint64_t{recipient.total} * recipient.unit;
    if (donor_bytes > donor_before || !donor.resize((donor_before - donor_bytes) / donor.unit)) return 0;
    if (!recipient.resize((recipient_before + recipient_bytes) / recipient.unit)) {
      donor.resize(donor_before / donor.unit);
      return 0;
    }
    ++counters_.rebalances;
    counters_.bytes_migrated += donor_bytes;
    counters_.bytes_wasted += donor_bytes - recipient_bytes;
    return 1;
  }

  [[nodiscard]] pool_stats stats(pool_kind kind) const noexcept {
    const store& st = stores_[static_cast<int>(kind)];
    pool_stats s;
    s.unit_bytes = static_cast<byte_count>(st.unit);
    s.total_units = static_cast<std::int64_t>(st.total);
    s.free_units = static_cast<std::int64_t>(st.free_list.size());
    s.used_units = s.total_units - s.free_units;
    s.free_fraction = s.total_units ? static_cast<double>(s.free_units) / static_cast<double>(s.total_units) : 0.0;
    return s;
  }
  [[nodiscard]] const rebalance_counters& counters() const noexcept { return counters_; }
  /// Each store keeps a tensor of the whole budget.
  [[nodiscard]] byte_count reserved_bytes() const noexcept { return static_cast<byte_count>(2 * budget_); }

 private:
  struct store {
    std::uint64_t unit = 0;
    std::uint32_t max = 0;
    std::uint32_t total = 0;
    std::vector<std::uint32_t> free_list;
    std::vector<std::uint8_t> used;
    void init(std::uint64_t u, std::uint64_t backing_bytes, std::uint64_t initial_bytes) {
      unit = u;
      max = static_cast<std::uint32_t>(backing_bytes / u);
      used.assign(max, 0);
      total = static_cast<std::uint32_t>(initial_bytes / u);
      for (std::uint32_t i = total; i-- > 0;) free_list.push_back(i);  // [total-1 ... 0]
    }
    void release(std::uint32_t page) {
      used[page] = 0;
      free_list.push_back(page);
    }
    bool resize(std::uint64_t new_total) {  // PageTable.set_num_pages_total: tail-only
      if (new_total > max) return false;
      const auto n = static_cast<std::uint32_t>(new_total);
      if (n < total) {
        for (std::uint32_t p = n; p < total; ++p)
          if (used[p]) return false;
        std::erase_if(free_list, [n](std::uint32_t p) { return p >= n; });
      } else {
        for (std::uint32_t p = total; p < n; ++p) free_list.push_back(p);
      }
      total = n;
      return true;
    }
  };
  struct page_record {
    pool_kind kind;
    std::uint32_t page;
    bool live;
  };

  std::uint64_t budget_;
  std::uint32_t batch_;
  store stores_[2];
  std::vector<page_record> pages_;
  rebalance_counters counters_;
};

// numpy.percentile's default (linear interpolation between the closest ranks) of `v`, which
// it sorts; 0 for an empty `v`. O(n log n).
inline double linear_percentile(std::vector<std::int64_t>& v, double pct) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = pct / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return static_cast<double>(v[lo]) + frac * static_cast<double>(v[hi] - v[lo]);
}

template <class Pool>
std::int64_t total_units(const Pool& pool, bool unified) {
  return unified ? pool.stats(pool_kind::kv).total_units
                 : pool.stats(pool_kind::kv).total_units + pool.stats(pool_kind::ssm).total_units;
}
template <class Pool>
std::int64_t free_units_of(const Pool& pool, bool unified) {
  return unified ? pool.stats(pool_kind::kv).free_units
                 : pool.stats(pool_kind::kv).free_units + pool.stats(pool_kind::ssm).free_units;
}

template <class Pool>
alloc_replay_result run_alloc_replay(Pool& pool, const alloc_workload& w, const cost_model& model, ladder lad,
                                     bool unified, const alloc_replay_config& cfg, bool whole = false) {
  using hybridcache::pool_kind;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto seconds_since = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  const std::int64_t page_tokens = cfg.tokens_per_page;
  const auto n = static_cast<std::uint32_t>(w.requests.size());
  const std::int64_t attn_layers = model.attention_layers();
  const std::int64_t rec_layers = model.recurrent_layers();

  std::vector<alloc_event> events;
  events.reserve(std::size_t{n} * 8);
  alloc_replay_result res;
  for (std::uint32_t i = 0; i < n; ++i) {
    const alloc_request& r = w.requests[i];
    events.push_back({r.arrival_tick, 2, i});
    events.push_back({r.departure_tick(), 0, i});
    if (r.prompt_tokens <= 0) continue;
    std::int64_t blocks = (r.prompt_tokens + page_tokens - 1) / page_tokens;
    for (std::int64_t s = 0; s < r.gen_tokens; ++s) {
      const std::int64_t need = (r.prompt_tokens + s + 1 + page_tokens - 1) / page_tokens;
      if (need > blocks) {
        blocks = need;
        events.push_back({r.arrival_tick + r.prompt_tokens + s + 1, 1, i});
        ++res.growth_events;
      }
    }
  }
  std::sort(events.begin(), events.end());

  std::vector<std::vector<packed_handle>> held(n);
  // Reference quirk emulation (padded pool only): page id -> its current handle and owner.
  const bool id_reuse = unified && cfg.reference_padded_id_reuse;
  std::vector<std::vector<std::uint32_t>> held_units(id_reuse ? n : 0);
  std::vector<packed_handle> handle_of_unit;
  std::vector<std::uint32_t> owner_of_unit, seen_stamp;
  if (id_reuse) {
    const auto units = static_cast<std::size_t>(pool.stats(pool_kind::kv).total_units);
    handle_of_unit.resize(units);
    owner_of_unit.resize(units);
    seen_stamp.assign(units, 0xffffffffu);
  }
  std::vector<std::uint8_t> active(n, 0), had_oom(n, 0), evicted(n, 0);
  request_lru lru[2] = {request_lru(n), request_lru(n)};
  std::vector<packed_handle> buf;
  std::uint64_t samples = 0, frag_samples = 0;
  double frag_sum = 0, ext_sum = 0;
  std::uint64_t active_count = 0;
  std::vector<std::int64_t> active_samples;  // samples with >= 1 active request (batch_size_p50)
  std::int64_t now_tick = 0;                 // the tick of the event being replayed
  std::int64_t first_arrival = 0, last_departure = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const alloc_request& r = w.requests[i];
    first_arrival = i == 0 ? r.arrival_tick : std::min(first_arrival, r.arrival_tick);
    last_departure = i == 0 ? r.departure_tick() : std::max(last_departure, r.departure_tick());
  }

  auto evict_one = [&](int domain) -> bool {
    auto victim = lru[domain].oldest();
    if (!victim) return false;
    for (packed_handle h : lru[domain].drop(*victim)) (void)pool.free(h);
    if (whole && !unified)
      for (packed_handle h : lru[1 - domain].drop(*victim)) (void)pool.free(h);
    ++res.eviction_events;
    if (!evicted[*victim]) {
      evicted[*victim] = 1;
      ++res.evicted;
    }
    return true;
  };
  auto call = [&](std::uint32_t r, pool_kind kind, std::int64_t units) {
    ++res.allocate_calls;
    const auto call_start = clock::now();
    const auto rebalances_before = pool.counters().rebalances;  // the pools count in int64 or uint64
    const int domain = unified ? 0 : static_cast<int>(kind);
    buf.resize(static_cast<std::size_t>(units));
    const bool rebalance_inline = lad == ladder::rebalance_first;
    bool evicted_for_call = false;
    bool ok = pool.allocate_n(kind, std::span<packed_handle>(buf), rebalance_inline).has_value();
    if (!ok) {
      evicted_for_call = evict_one(domain);
      ok = pool.allocate_n(kind, std::span<packed_handle>(buf), rebalance_inline).has_value();
    }
    if constexpr (requires { pool.rebalance_on_failure(kind, std::int64_t{1}); }) {
      if (!ok && lad == ladder::evict_then_rebalance) {
        const auto migration_start = clock::now();
        const bool moved = pool.rebalance_on_failure(kind, units) > 0;
        res.migration_seconds += seconds_since(migration_start);
        if (moved) ok = pool.allocate_n(kind, std::span<packed_handle>(buf), false).has_value();
      }
    }
    if (!ok) {
      ++res.oom_events;
      if (!res.time_to_first_oom_ticks) res.time_to_first_oom_ticks = now_tick - first_arrival;
      had_oom[r] = 1;
      res.oom_retry_seconds += seconds_since(call_start);
      return;
    }
    if (pool.counters().rebalances != rebalances_before) ++res.calls_served_after_rebalance;
    else if (evicted_for_call) ++res.calls_served_after_eviction;
    else ++res.calls_served_directly;
    lru[domain].touch(r, buf);
    held[r].insert(held[r].end(), buf.begin(), buf.end());
    if constexpr (requires { pool.padding_waste_bytes(); })
      res.padding_bytes_peak = std::max(res.padding_bytes_peak, pool.padding_waste_bytes());
    if constexpr (requires { pool.unit_of(buf[0]); }) {
      if (id_reuse) {
        for (packed_handle h : buf) {
          const std::uint32_t u = *pool.unit_of(h);
          handle_of_unit[u] = h;
          owner_of_unit[u] = r;
          held_units[r].push_back(u);
        }
      }
    }
    res.service_seconds += seconds_since(call_start);
  };
  auto sample = [&] {
    ++samples;
    if (active_count == 0) return;
    active_samples.push_back(static_cast<std::int64_t>(active_count));
    const std::int64_t total = total_units(pool, unified);
    const double f = total ? static_cast<double>(free_units_of(pool, unified)) / static_cast<double>(total) : 0.0;
    frag_sum += f;
    res.fragmentation_peak = std::max(res.fragmentation_peak, f);
    double ext = 0;
    if (!unified) {
      const auto kv = pool.stats(pool_kind::kv), ssm = pool.stats(pool_kind::ssm);
      const double free_all = static_cast<double>(kv.free_units * kv.unit_bytes + ssm.free_units * ssm.unit_bytes);
      if (free_all > 0)
        ext = (kv.fragmentation * static_cast<double>(kv.free_units * kv.unit_bytes) +
               ssm.fragmentation * static_cast<double>(ssm.free_units * ssm.unit_bytes)) /
              free_all;
    }
    ext_sum += ext;
    ++frag_samples;
  };

  std::uint64_t event_count = 0;
  for (const alloc_event& e : events) {
    ++event_count;
    const std::uint32_t r = e.request;
    const alloc_request& req = w.requests[r];
    now_tick = e.tick;
    if (e.priority == 2) {
      ++res.submitted;
      const std::int64_t kv_pages = std::max<std::int64_t>(1, (req.prompt_tokens + page_tokens - 1) / page_tokens);
      for (std::int64_t l = 0; l < attn_layers; ++l) call(r, pool_kind::kv, kv_pages);
      for (std::int64_t l = 0; l < rec_layers; ++l) call(r, pool_kind::ssm, 1);
      active[r] = 1;
      ++active_count;
    } else if (e.priority == 1) {
      if (active[r])
        for (std::int64_t l = 0; l < attn_layers; ++l) call(r, pool_kind::kv, 1);
    } else if (active[r]) {
      const auto free_start = clock::now();
      if (id_reuse) {
        for (std::uint32_t u : held_units[r]) {  // by page id, like the reference
          if (seen_stamp[u] == r) continue;
          seen_stamp[u] = r;
          const packed_handle h = handle_of_unit[u];
          if (pool.free(h)) lru[0].remove(owner_of_unit[u], h);
        }
        held_units[r].clear();
      } else {
        for (packed_handle h : held[r]) (void)pool.free(h);  // evicted units: stale, skipped
      }
      held[r].clear();
      held[r].shrink_to_fit();
      (void)lru[0].drop(r);
      (void)lru[1].drop(r);
      res.service_seconds += seconds_since(free_start);  // frees succeed: service, as the reference
      active[r] = 0;
      --active_count;
      if (!had_oom[r]) {
        ++res.completed_reference;
        if (!evicted[r]) ++res.completed;
      }
    }
    if (cfg.sample_every_events > 0 && event_count % static_cast<std::uint64_t>(cfg.sample_every_events) == 0)
      sample();
  }
  sample();

  res.fragmentation_mean = frag_samples ? frag_sum / static_cast<double>(frag_samples) : 0.0;
  res.external_fragmentation_mean = frag_samples ? ext_sum / static_cast<double>(frag_samples) : 0.0;
  const auto& c = pool.counters();
  res.rebalances = c.rebalances;
  res.bytes_migrated = c.bytes_migrated;
  res.bytes_wasted = c.bytes_wasted;
  res.compactions = c.compactions;
  res.peak_reserved_bytes = pool.reserved_bytes();
  if (unified) {
    res.kv_bytes_end = res.ssm_bytes_end = 0;
  } else {
    res.kv_bytes_end = pool.stats(pool_kind::kv).total_bytes();
    res.ssm_bytes_end = pool.stats(pool_kind::ssm).total_bytes();
  }
  res.wall_seconds = seconds_since(start);
  res.replay_ticks = last_departure - first_arrival;
  res.goodput_per_ktick =
      res.replay_ticks > 0 ? 1000.0 * static_cast<double>(res.completed) / static_cast<double>(res.replay_ticks) : 0.0;
  res.goodput_requests_per_second =
      res.wall_seconds > 0 ? static_cast<double>(res.completed_reference) / res.wall_seconds : 0.0;
  res.batch_size_p50 = linear_percentile(active_samples, 50);
  res.idle_seconds = std::max(0.0, res.wall_seconds - res.service_seconds - res.oom_retry_seconds);
  return res;
}

}  // namespace detail

/// The rebalancer settings each dynamic variant uses by default.
[[nodiscard]] inline memory::rebalancer_config default_rebalancer_config(alloc_variant v) {
  memory::rebalancer_config rc;  // the paper's: 0.05 / 0.30, batch 128, 1000-op throttle
  if (v == alloc_variant::vmm_dynamic) {  // tuned on the sweep grid, see docs/memory.md
    rc.threshold_low = 0.01;
    rc.threshold_high = 0.05;
    rc.min_rebalance_interval_ops = 100;
    rc.size_to_demand = true;
  }
  return rc;
}

/// Replays `w` for `model` through `variant`. @throws invalid_argument / capacity_error
/// when the budget cannot hold the variant's pools.
[[nodiscard]] inline alloc_replay_result replay_alloc(const alloc_workload& w, const model_spec& spec,
                                                      alloc_variant variant, const alloc_replay_config& cfg = {}) {
  using namespace memory;
  HYBRIDCACHE_EXPECTS(cfg.tokens_per_page > 0, invalid_argument, "alloc replay: tokens_per_page must be > 0");
  const cost_model model(spec);
  const byte_count kv = kv_page_bytes(model, cfg.tokens_per_page);
  const byte_count ssm = ssm_block_bytes(model);
  switch (variant) {
    case alloc_variant::padded_unified: {
      padded_unified_pool<counting_backing> pool({.capacity_bytes = cfg.capacity_bytes, .kv_page_bytes = kv,
                                                  .ssm_block_bytes = ssm});
      auto r = detail::run_alloc_replay(pool, w, model, detail::ladder::evict_only, true, cfg);
      return r;
    }
    case alloc_variant::fixed_dual_mr05:
    case alloc_variant::fixed_dual_mr09: {
      fixed_dual_pool<counting_backing> pool({.capacity_bytes = cfg.capacity_bytes, .kv_page_bytes = kv,
                                              .ssm_block_bytes = ssm,
                                              .ssm_ratio = variant == alloc_variant::fixed_dual_mr05 ? 0.5 : 0.9});
      return detail::run_alloc_replay(pool, w, model, detail::ladder::evict_only, false, cfg);
    }
    case alloc_variant::avmp_static_mr05: {
      simulated_vmm_pool<no_rebalancer> pool(
          {.capacity_bytes = cfg.capacity_bytes, .kv_page_bytes = kv, .ssm_block_bytes = ssm, .ssm_fraction = 0.5});
      return detail::run_alloc_replay(pool, w, model, detail::ladder::evict_only, false, cfg);
    }
    case alloc_variant::avmp_dynamic_b128:
      if (cfg.reference_avmp_stores) {
        // The reference's forced path takes only the batch size (its thresholds and throttle
        // are dead code, hence the paper's null threshold sweep).
        const std::uint64_t batch = cfg.rebalancer ? cfg.rebalancer->migration_batch_size : 128;
        HYBRIDCACHE_EXPECTS(batch > 0 && batch <= 0xffffffffu, invalid_argument,
                            "alloc replay: migration_batch_size must be in [1, 2^32)");
        detail::reference_avmp_pool pool(cfg.capacity_bytes, kv, ssm, 0.5, static_cast<std::uint32_t>(batch));
        return detail::run_alloc_replay(pool, w, model, alloc_ladder::evict_then_rebalance, false, cfg);
      }
      [[fallthrough]];
    case alloc_variant::vmm_dynamic: {
      const bool ours = variant == alloc_variant::vmm_dynamic;
      simulated_vmm_pool<threshold_rebalancer> pool(
          {.capacity_bytes = cfg.capacity_bytes, .kv_page_bytes = kv, .ssm_block_bytes = ssm, .ssm_fraction = 0.5,
           .compaction = cfg.compaction.value_or(ours)},
          threshold_rebalancer(cfg.rebalancer.value_or(default_rebalancer_config(variant))));
      const alloc_ladder lad = cfg.ladder.value_or(alloc_ladder::evict_then_rebalance);
      return detail::run_alloc_replay(pool, w, model, lad, false, cfg, cfg.evict_whole_request.value_or(ours));
    }
  }
  throw invalid_argument("alloc replay: unknown variant");
}

}  // namespace hybridcache::sim
