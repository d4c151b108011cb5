// hybridcache/tiered/tiered_store.hpp
//
// `tiered_store`: CaR's cache table over N tiers (HBM first, then host / CXL), with
// page-granular capacity accounting per tier, an O(log n) demotion index per tier, and a
// two-phase move protocol (`prepare_move` / `complete_move`) that keeps every entry in
// exactly one tier at all times:
//
//   prepare_move(id, dst)  reserves the destination pages, marks the entry `moving` and
//                          returns a ticket naming source and destination pages; the
//                          caller (offload engine, loader) copies the bytes.
//   complete_move(t, ok)   ok: the destination becomes the home, the source pages are
//                          freed. failed: the destination pages are freed, the entry stays
//                          where it was. Either way the entry is `resident` again.
//
// While `moving`, an entry can be neither pinned, nor erased, nor moved again, nor picked
// as a victim (page_state.hpp), so no copy can race with a reuse of its pages. A ticket
// carries the entry's move sequence number: a stale or forged ticket is rejected.
//
// The store holds metadata only (page indices, not pointers): a simulator uses it as is,
// a runtime maps pages to its arenas (host_copy_engine.hpp, cuda/copy_engine.cuh).
//
// Thread safety: every member function locks one mutex (the TensorRT-LLM V2 rule: one
// lock over shared state); copies run outside it. Costs (n = entries in the tier, k = pages
// of the entry): insert O(k + log n), find O(k), pin/unpin/touch/add_score O(log n),
// prepare_move O(k + log n), complete_move O(k + log n), erase O(k + log n),
// victim O(log n) (O(log n + s · x) when it skips s of x excluded ids), split/join
// O(k + log n), exchange_pages O(pages exchanged). Insert and moves allocate the page lists
// and an index node; pin, unpin, touch and add_score re-key the index (one node freed, one
// allocated by std::set).
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/concepts/copy_engine.hpp"
#include "hybridcache/concepts/tier_entry.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"
#include "hybridcache/tiered/page_state.hpp"
#include "hybridcache/tiered/tier.hpp"

namespace hybridcache::tiered {

/// Per-tier occupancy, in bytes (page granular).
struct tier_usage {
  std::int64_t capacity_bytes = 0;
  std::int64_t used_bytes = 0;       ///< pages held by entries, including move reservations
  std::int64_t evictable_bytes = 0;  ///< pages of entries that are resident (not pinned/moving)
  std::int64_t entries = 0;          ///< entries whose home is this tier
};

/// CaR's cache table over N tiers. `Scorer` orders demotion victims (demotion_policy.hpp).
template <demotion_scorer Scorer = lru_demotion>
class tiered_store {
 public:
  /// @param tiers      tier 0 must be HBM (validated, tier.hpp)
  /// @param page_bytes allocation unit of every tier (> 0, <= every tier's capacity)
  /// @throws invalid_argument naming the bad tier or field; capacity_error when a tier has
  ///         more than 2^32 - 1 pages.
  tiered_store(std::vector<tier_config> tiers, std::int64_t page_bytes, Scorer scorer = Scorer{})
      : configs_(std::move(tiers)), page_bytes_(page_bytes), scorer_(std::move(scorer)) {
    validate_tiers(configs_, page_bytes_);
    tiers_.resize(configs_.size());
    for (std::size_t t = 0; t < configs_.size(); ++t) {
      const std::int64_t pages = configs_[t].capacity_bytes / page_bytes_;
      if (pages >= (std::int64_t{1} << 32) - 1)
        throw capacity_error("tier " + std::to_string(t) + ": too many pages (raise page_bytes)");
      auto& s = tiers_[t];
      s.capacity_pages = pages;
      s.free_pages.reserve(static_cast<std::size_t>(pages));
      // Popped from the back: the lowest pages come out first, in ascending order, so fresh
      // entries get adjacent pages and their copies coalesce.
      for (std::int64_t p = pages - 1; p >= 0; --p) s.free_pages.push_back(static_cast<std::uint32_t>(p));
    }
  }

  tiered_store(const tiered_store&) = delete;
  tiered_store& operator=(const tiered_store&) = delete;

  [[nodiscard]] std::size_t tier_count() const noexcept { return configs_.size(); }
  [[nodiscard]] const tier_config& config(tier_id t) const { return configs_.at(t.value); }
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return page_bytes_; }
  /// Pages needed to hold `bytes` (0 for bytes <= 0). Exact up to INT64_MAX: rounding up
  /// by adding page_bytes - 1 first would overflow near it.
  [[nodiscard]] std::int64_t pages_for(std::int64_t bytes) const noexcept {
    if (bytes <= 0) return 0;
    return bytes / page_bytes_ + (bytes % page_bytes_ != 0 ? 1 : 0);
  }

  /// Inserts a new entry of `bytes` in `tier`: resident, or `writing` when `writing` is
  /// true (its request is still producing the bytes: nobody may pin, copy or pick it until
  /// `publish`). Does not evict: when the tier lacks free pages it returns
  /// `out_of_capacity` (demote first; see `victim`), also for sizes larger than the whole
  /// tier, up to INT64_MAX. Returns `invalid_argument` for bytes <= 0, an unknown tier or
  /// an id already present.
  [[nodiscard]] expected<void> insert(entry_id id, std::int64_t bytes, tier_id tier = hbm_tier, node_info info = {},
                                      bool writing = false) {
    std::lock_guard lock(mu_);
    if (bytes <= 0 || tier.value >= tiers_.size() || entries_.count(id)) return unexpected(errc::invalid_argument);
    auto& ts = tiers_[tier.value];
    const std::int64_t need = pages_for(bytes);
    if (static_cast<std::int64_t>(ts.free_pages.size()) < need) return unexpected(errc::out_of_capacity);
    cache_entry e;
    e.id = id;
    e.tier = tier;
    e.bytes = bytes;
    e.info = info;
    e.last_access = ++clock_;
    e.pages = take_pages(ts, need);
    if (writing) e.state = page_state::writing;
    ts.entries += 1;
    auto [it, ok] = entries_.emplace(id, std::move(e));
    (void)ok;
    index_add(it->second);
    return {};
  }

  /// A copy of the entry's row, or nullopt.
  [[nodiscard]] std::optional<cache_entry> find(entry_id id) const {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
  }

  /// Where the entry lives now (nullopt if absent). O(1) expected; no page-list copy.
  [[nodiscard]] std::optional<std::pair<tier_id, page_state>> locate(entry_id id) const {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    return std::pair{it->second.tier, it->second.state};
  }

  [[nodiscard]] bool contains(entry_id id) const {
    std::lock_guard lock(mu_);
    return entries_.count(id) != 0;
  }

  /// Pins the entry (a request uses it; it cannot be demoted or erased). `busy` while moving.
  [[nodiscard]] expected<void> pin(entry_id id) { return apply(id, page_event::pin); }

  /// Makes a `writing` entry usable (resident). `invalid_argument` unless it is writing.
  [[nodiscard]] expected<void> publish(entry_id id) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    if (it->second.state != page_state::writing) return unexpected(errc::invalid_argument);
    it->second.state = page_state::resident;
    it->second.last_access = ++clock_;
    index_add(it->second);
    return {};
  }

  /// Releases one pin. `invalid_argument` if the entry is not pinned.
  [[nodiscard]] expected<void> unpin(entry_id id) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    auto& e = it->second;
    if (e.state != page_state::pinned) return unexpected(errc::invalid_argument);
    return transition(e, e.pins > 1 ? page_event::unpin_more : page_event::unpin_last);
  }

  /// Marks the entry used now (recency for LRU-like scorers).
  [[nodiscard]] expected<void> touch(entry_id id) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    rekey(it->second, [&](cache_entry& e) { e.last_access = ++clock_; });
    return {};
  }

  /// Adds `delta` to CaR's score of the entry (see `car_score`).
  [[nodiscard]] expected<void> add_score(entry_id id, double delta) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    rekey(it->second, [&](cache_entry& e) { e.score += delta; });
    return {};
  }

  /// Starts moving a resident entry to tier `dst`, storing `dst_bytes` there (0 = same
  /// size; less when the mover sparsifies). Reserves destination pages. Errors:
  /// not_found, busy (pinned or already moving), invalid_argument (same tier, unknown tier,
  /// dst_bytes < 0 or larger than the entry), out_of_capacity (no free pages at dst).
  [[nodiscard]] expected<move_ticket> prepare_move(entry_id id, tier_id dst, std::int64_t dst_bytes = 0) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    auto& e = it->second;
    if (dst.value >= tiers_.size() || dst == e.tier || dst_bytes < 0 || dst_bytes > e.bytes)
      return unexpected(errc::invalid_argument);
    if (!next_state(e.state, page_event::prepare_move).allowed) return unexpected(errc::busy);
    if (dst_bytes == 0) dst_bytes = e.bytes;
    auto& ds = tiers_[dst.value];
    const std::int64_t need = pages_for(dst_bytes);
    if (static_cast<std::int64_t>(ds.free_pages.size()) < need) return unexpected(errc::out_of_capacity);
    move_ticket t;
    t.id = id;
    t.src = e.tier;
    t.dst = dst;
    t.src_bytes = e.bytes;
    t.dst_bytes = dst_bytes;
    t.src_pages = e.pages;
    t.dst_pages = take_pages(ds, need);
    index_remove(e);
    e.state = page_state::moving;
    e.move_dst = dst;
    t.seq = ++e.move_seq;
    return t;
  }

  /// Finishes a move. `ok`: the entry now lives at the destination (source pages freed).
  /// Not ok: destination pages freed, the entry stays at its source. The entry is resident
  /// afterwards in both cases. Errors: not_found, handle-like `stale_handle` when the
  /// ticket does not belong to the entry's current move.
  [[nodiscard]] expected<void> complete_move(const move_ticket& t, bool ok) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(t.id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    auto& e = it->second;
    if (e.state != page_state::moving || e.move_seq != t.seq || e.tier != t.src) return unexpected(errc::stale_handle);
    if (ok) {
      give_pages(tiers_[t.src.value], e.pages);
      tiers_[t.src.value].entries -= 1;
      tiers_[t.dst.value].entries += 1;
      e.pages = t.dst_pages;
      e.tier = t.dst;
      e.bytes = t.dst_bytes;
    } else {
      give_pages(tiers_[t.dst.value], t.dst_pages);
    }
    e.state = page_state::resident;
    index_add(e);
    return {};
  }

  /// Drops a resident (or writing) entry and frees its pages. not_found / busy (pinned or moving).
  [[nodiscard]] expected<void> erase(entry_id id) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    auto& e = it->second;
    if (!next_state(e.state, page_event::erase).allowed) return unexpected(errc::busy);
    index_remove(e);
    give_pages(tiers_[e.tier.value], e.pages);
    tiers_[e.tier.value].entries -= 1;
    entries_.erase(it);
    return {};
  }

  /// Detaches the first `head_bytes` of a resident entry into a new resident entry
  /// `head_id` of the same tier, without copying: the head takes the entry's first pages
  /// (in logical order), the entry keeps the rest. Both keep the entry's info, recency and
  /// score. Errors (nothing changes): not_found; invalid_argument unless 0 < head_bytes <
  /// bytes, head_bytes is a whole number of pages and head_id is new; busy unless resident.
  [[nodiscard]] expected<void> split(entry_id id, entry_id head_id, std::int64_t head_bytes) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    auto& e = it->second;
    if (head_bytes <= 0 || head_bytes >= e.bytes || head_bytes % page_bytes_ != 0 || entries_.count(head_id))
      return unexpected(errc::invalid_argument);
    if (e.state != page_state::resident) return unexpected(errc::busy);
    const auto head_pages = static_cast<std::size_t>(head_bytes / page_bytes_);
    cache_entry h = e;  // copies the page list: may throw, nothing changed yet
    h.id = head_id;
    h.bytes = head_bytes;
    h.pages.resize(head_pages);
    h.move_seq = 0;
    std::vector<std::uint32_t> tail(e.pages.begin() + static_cast<std::ptrdiff_t>(head_pages), e.pages.end());
    auto [hit, ok] = entries_.emplace(head_id, std::move(h));
    (void)ok;
    index_remove(e);
    e.pages = std::move(tail);
    e.bytes -= head_bytes;
    index_add(e);
    index_add(hit->second);
    tiers_[e.tier.value].entries += 1;
    return {};
  }

  /// Appends `back`'s bytes to `front` without copying (front's pages, then back's) and
  /// removes `back`. Errors (nothing changes): not_found; invalid_argument for the same id,
  /// different tiers or a front that is not a whole number of pages; busy unless both are
  /// resident.
  [[nodiscard]] expected<void> join(entry_id front, entry_id back) {
    std::lock_guard lock(mu_);
    const auto fi = entries_.find(front);
    const auto bi = entries_.find(back);
    if (fi == entries_.end() || bi == entries_.end()) return unexpected(errc::not_found);
    auto& f = fi->second;
    auto& b = bi->second;
    if (front == back || f.tier != b.tier || f.bytes % page_bytes_ != 0) return unexpected(errc::invalid_argument);
    if (f.state != page_state::resident || b.state != page_state::resident) return unexpected(errc::busy);
    f.pages.reserve(f.pages.size() + b.pages.size());  // may throw: nothing changed yet
    index_remove(f);
    index_remove(b);
    f.pages.insert(f.pages.end(), b.pages.begin(), b.pages.end());
    f.bytes += b.bytes;
    tiers_[f.tier.value].entries -= 1;
    entries_.erase(bi);
    index_add(f);
    return {};
  }

  /// Exchanges `n` pages of entry `a` (from its page `a_first`) with `n` pages of entry `b`
  /// (from `b_first`), both in the same tier and neither moving nor being written: a runtime
  /// hands bytes loaded into one entry to another without copying them. Page counts, states
  /// and demotion keys are unchanged. Errors (nothing changes): not_found; invalid_argument
  /// for the same entry, different tiers or ranges outside either entry; busy while either
  /// is moving or writing.
  [[nodiscard]] expected<void> exchange_pages(entry_id a, std::int64_t a_first, entry_id b, std::int64_t b_first,
                                              std::int64_t n) {
    std::lock_guard lock(mu_);
    const auto ai = entries_.find(a);
    const auto bi = entries_.find(b);
    if (ai == entries_.end() || bi == entries_.end()) return unexpected(errc::not_found);
    auto& x = ai->second;
    auto& y = bi->second;
    const auto in_range = [n](const cache_entry& e, std::int64_t first) {
      return first >= 0 && n >= 0 && first + n <= static_cast<std::int64_t>(e.pages.size());
    };
    if (a == b || x.tier != y.tier || !in_range(x, a_first) || !in_range(y, b_first))
      return unexpected(errc::invalid_argument);
    const auto unmovable = [](const cache_entry& e) {
      return e.state == page_state::moving || e.state == page_state::writing;
    };
    if (unmovable(x) || unmovable(y)) return unexpected(errc::busy);
    std::swap_ranges(x.pages.begin() + a_first, x.pages.begin() + a_first + n, y.pages.begin() + b_first);
    return {};
  }

  /// The evictable entry of `tier` with the smallest demotion key, or nullopt.
  [[nodiscard]] std::optional<entry_id> victim(tier_id tier) const { return victim(tier, {}); }

  /// The evictable entry of `tier` with the smallest demotion key whose id is not in
  /// `exclude` (any order), or nullopt. A mover skips the victims it already failed to
  /// move in a pass this way: a failed move puts the entry back under the same key, so
  /// the plain `victim` would return it again. Costs O(log n + s · x) for s skipped
  /// entries and x excluded ids.
  [[nodiscard]] std::optional<entry_id> victim(tier_id tier, std::span<const entry_id> exclude) const {
    std::lock_guard lock(mu_);
    if (tier.value >= tiers_.size()) return std::nullopt;
    for (const auto& [key, id] : tiers_[tier.value].index)
      if (std::find(exclude.begin(), exclude.end(), id) == exclude.end()) return id;
    return std::nullopt;
  }

  /// Occupancy of one tier.
  [[nodiscard]] tier_usage usage(tier_id tier) const {
    std::lock_guard lock(mu_);
    const auto& s = tiers_.at(tier.value);
    return {s.capacity_pages * page_bytes_,
            (s.capacity_pages - static_cast<std::int64_t>(s.free_pages.size())) * page_bytes_,
            s.evictable_pages * page_bytes_, s.entries};
  }

  /// Scheduling dry run: could `bytes` be placed in `tier` by evicting only evictable
  /// entries (free + evictable pages)? False for bytes < 0 and for sizes beyond the tier,
  /// up to INT64_MAX. Changes nothing.
  [[nodiscard]] bool would_fit(tier_id tier, std::int64_t bytes) const {
    std::lock_guard lock(mu_);
    if (tier.value >= tiers_.size() || bytes < 0) return false;
    const auto& s = tiers_[tier.value];
    return pages_for(bytes) <= static_cast<std::int64_t>(s.free_pages.size()) + s.evictable_pages;
  }

  /// Number of entries (all tiers).
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mu_);
    return entries_.size();
  }

  /// Calls `f(const cache_entry&)` for every entry, under the lock (f must not call back).
  template <class F>
  void for_each(F&& f) const {
    std::lock_guard lock(mu_);
    for (const auto& [id, e] : entries_) f(e);
  }

  /// Checks every internal invariant (tests, debugging): each page of each tier is either
  /// free or owned by exactly one entry or one in-flight reservation; counters agree; the
  /// index holds exactly the resident entries. `reserved` lists the tickets in flight.
  /// O(total pages + entries). Returns an empty string when consistent, else the first
  /// violation.
  [[nodiscard]] std::string check_invariants(const std::vector<move_ticket>& reserved = {}) const {
    std::lock_guard lock(mu_);
    std::vector<std::vector<int>> owner(tiers_.size());
    for (std::size_t t = 0; t < tiers_.size(); ++t) {
      owner[t].assign(static_cast<std::size_t>(tiers_[t].capacity_pages), 0);
      for (auto p : tiers_[t].free_pages) owner[t][p] += 1;
    }
    std::vector<std::int64_t> evictable(tiers_.size(), 0), count(tiers_.size(), 0), indexed(tiers_.size(), 0);
    for (const auto& [id, e] : entries_) {
      if (e.id != id) return "entry id mismatch";
      if (static_cast<std::int64_t>(e.pages.size()) != pages_for(e.bytes)) return "page count mismatch";
      for (auto p : e.pages) owner[e.tier.value][p] += 1;
      count[e.tier.value] += 1;
      if (e.state == page_state::resident) evictable[e.tier.value] += static_cast<std::int64_t>(e.pages.size());
      if ((e.state == page_state::pinned) != (e.pins > 0)) return "pin count disagrees with state";
    }
    for (const auto& t : reserved)
      for (auto p : t.dst_pages) owner[t.dst.value][p] += 1;
    for (std::size_t t = 0; t < tiers_.size(); ++t) {
      for (int c : owner[t])
        if (c != 1) return "tier " + std::to_string(t) + ": a page is " + (c == 0 ? "lost" : "owned twice");
      if (evictable[t] != tiers_[t].evictable_pages) return "evictable page counter mismatch";
      if (count[t] != tiers_[t].entries) return "entry counter mismatch";
      for (const auto& [k, id] : tiers_[t].index) {
        const auto it = entries_.find(id);
        if (it == entries_.end() || it->second.tier.value != t || it->second.state != page_state::resident)
          return "index holds a non-resident entry";
        indexed[t] += 1;
      }
    }
    std::int64_t resident = 0, in_index = 0;
    for (const auto& [id, e] : entries_) resident += e.state == page_state::resident;
    for (auto n : indexed) in_index += n;
    if (resident != in_index) return "index misses a resident entry";
    return {};
  }

 private:
  struct tier_state {
    std::int64_t capacity_pages = 0;
    std::int64_t evictable_pages = 0;
    std::int64_t entries = 0;
    std::vector<std::uint32_t> free_pages;  // stack; back = next page handed out
    std::set<std::pair<demotion_key, entry_id>> index;  // resident entries by demotion key
  };

  static std::vector<std::uint32_t> take_pages(tier_state& s, std::int64_t n) {
    std::vector<std::uint32_t> out(s.free_pages.end() - n, s.free_pages.end());
    s.free_pages.resize(s.free_pages.size() - static_cast<std::size_t>(n));
    std::sort(out.begin(), out.end());
    return out;
  }
  static void give_pages(tier_state& s, const std::vector<std::uint32_t>& pages) {
    // Pushed in descending order so the next take pops them ascending again.
    for (auto it = pages.rbegin(); it != pages.rend(); ++it) s.free_pages.push_back(*it);
  }

  void index_add(cache_entry& e) {
    if (e.state != page_state::resident) return;
    auto& s = tiers_[e.tier.value];
    e.indexed_key = scorer_.key(e);
    s.index.emplace(e.indexed_key, e.id);
    s.evictable_pages += static_cast<std::int64_t>(e.pages.size());
  }
  void index_remove(cache_entry& e) {
    if (e.state != page_state::resident) return;
    auto& s = tiers_[e.tier.value];
    s.index.erase({e.indexed_key, e.id});
    s.evictable_pages -= static_cast<std::int64_t>(e.pages.size());
  }
  template <class Mutate>
  void rekey(cache_entry& e, Mutate&& m) {
    index_remove(e);
    m(e);
    index_add(e);
  }

  expected<void> apply(entry_id id, page_event ev) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    return transition(it->second, ev);
  }
  // Applies a pin/unpin event through the table (caller holds the lock).
  expected<void> transition(cache_entry& e, page_event ev) {
    const page_transition t = next_state(e.state, ev);
    if (!t.allowed) return unexpected(errc::busy);
    index_remove(e);
    if (ev == page_event::pin) e.pins += 1;
    if (ev == page_event::unpin_last || ev == page_event::unpin_more) e.pins -= 1;
    e.state = t.to;
    if (ev == page_event::pin) e.last_access = ++clock_;
    index_add(e);
    return {};
  }

  std::vector<tier_config> configs_;
  std::int64_t page_bytes_;
  Scorer scorer_;
  mutable std::mutex mu_;
  std::vector<tier_state> tiers_;
  std::unordered_map<entry_id, cache_entry> entries_;
  std::uint64_t clock_ = 0;
};

}  // namespace hybridcache::tiered
