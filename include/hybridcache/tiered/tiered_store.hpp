// hybridcache/tiered/tiered_store.hpp
//
// `tiered_store`: CaR's cache table over N tiers (HBM first, then host / CXL / ...), with
// page-granular capacity per tier, an O(log n) demotion index per tier and a two-phase copy
// protocol. An entry may have one copy in each tier (concepts/tier_entry.hpp), so
//
//   prepare_move(id, dst)     copies the home copy into `dst` and drops the source once the
//                             copy landed (demotion, promotion);
//   prepare_copy(id, src, dst) copies without dropping: a clean replica (write-through),
//                             after which the faster copy can be dropped for free;
//   prepare_extract(...)      copies some pages of every layer segment of one entry into a
//                             new entry (a load of just the tokens a request needs);
//   complete_move(t, ok)      ok: the destination copy is valid. failed: it goes, its
//                             pages are freed. The source copy is valid throughout.
//
// A copy in flight leaves its source readable and pinnable; its destination is `filling`
// and invisible until completion (page_state.hpp). A moved source that a reader pinned
// meanwhile stays as a clean replica instead of going. `pin_in(id, tier)` pins the copy of
// one tier atomically (no locate-then-pin race with a mover); a promotion touches the
// entry, so a promoted entry is not the next victim. Tickets carry the destination copy's
// sequence number: a stale or forged ticket is rejected.
//
// Pages are runs (core/page_runs.hpp); an entry's logical order is layer-major in
// `segments` segments, so `split` (at a token) and `join` re-partition every copy's runs
// segment by segment, and `exchange_pages` swaps logical ranges between two entries,
// without copying. The store holds metadata only (page indices, not pointers): a
// simulator uses it as is, a runtime maps pages to its arenas (host_copy_engine.hpp,
// cuda/copy_engine.cuh).
//
// Thread safety: every member function locks one mutex (the TensorRT-LLM V2 rule: one
// lock over shared state); copies run outside it. Costs (n = copies in the tier, c =
// copies of the entry (<= tiers), r = page runs of a copy, F = free runs of a tier):
// insert O(log F + log n); find O(c · r); pin/unpin/touch/add_score/set_score O(c log n);
// prepare_* O(r + log F + log n); complete_move O(r log F + log n); drop_copy/erase
// O(c (r log F + log n)); victim O(log n) (+ s · x when it skips s of x excluded ids);
// split/join O(c (r + segments) + log n); exchange_pages O(r). Insert and copies allocate
// run lists and index nodes; the free-run maps recycle their nodes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/concepts/copy_engine.hpp"
#include "hybridcache/concepts/tier_entry.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/page_runs.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"
#include "hybridcache/tiered/page_state.hpp"
#include "hybridcache/tiered/tier.hpp"

namespace hybridcache::tiered {

/// Per-tier occupancy, in bytes (page granular).
struct tier_usage {
  std::int64_t capacity_bytes = 0;
  std::int64_t used_bytes = 0;       ///< pages held by copies, filling ones included
  std::int64_t evictable_bytes = 0;  ///< pages of idle copies (valid, no pin, no reader)
  std::int64_t entries = 0;          ///< copies in this tier
};

/// Which pages of every segment of a source entry `prepare_extract` copies.
struct segment_range {
  std::int64_t first = 0;  ///< first page inside each segment
  std::int64_t pages = 0;  ///< pages per segment
};

/// CaR's cache table over N tiers. `Scorer` orders demotion victims (demotion_policy.hpp).
template <demotion_scorer Scorer = lru_demotion>
class tiered_store {
 public:
  /// @param tiers      tier 0 must be HBM (validated, tier.hpp)
  /// @param page_bytes allocation unit of every tier (> 0, <= every tier's capacity)
  /// @throws invalid_argument naming the bad tier or field; capacity_error when a tier has
  ///         2^32 - 1 pages or more.
  tiered_store(std::vector<tier_config> tiers, std::int64_t page_bytes, Scorer scorer = Scorer{})
      : configs_(std::move(tiers)), page_bytes_(page_bytes), scorer_(std::move(scorer)) {
    validate_tiers(configs_, page_bytes_);
    for (std::size_t t = 0; t < configs_.size(); ++t) {
      const std::int64_t pages = configs_[t].capacity_bytes / page_bytes_;
      if (pages >= (std::int64_t{1} << 32) - 1)
        throw capacity_error("tier " + std::to_string(t) + ": too many pages (raise page_bytes)");
      tiers_.emplace_back(pages);
    }
  }

  tiered_store(const tiered_store&) = delete;
  tiered_store& operator=(const tiered_store&) = delete;

  [[nodiscard]] std::size_t tier_count() const noexcept { return configs_.size(); }
  /// The demotion order's scorer (a copy orders a replica's tiers alike).
  [[nodiscard]] const Scorer& scorer() const noexcept { return scorer_; }
  [[nodiscard]] const tier_config& config(tier_id t) const { return configs_.at(t.value); }
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return page_bytes_; }
  /// Pages needed to hold `bytes` (0 for bytes <= 0). Exact up to INT64_MAX: rounding up
  /// by adding page_bytes - 1 first would overflow near it.
  [[nodiscard]] std::int64_t pages_for(std::int64_t bytes) const noexcept {
    if (bytes <= 0) return 0;
    return bytes / page_bytes_ + (bytes % page_bytes_ != 0 ? 1 : 0);
  }

  /// Inserts a new entry of `bytes` with one copy in `tier`: valid, or `writing` (its
  /// request is still producing the bytes: nobody may pin, copy or pick it until
  /// `publish`). `segments`: layer segments of its logical order (its pages must divide
  /// evenly). Does not evict: `out_of_capacity` when the tier lacks free pages (also for
  /// sizes beyond the tier, up to INT64_MAX). `invalid_argument` for bytes <= 0, an unknown
  /// tier, an id already present or pages that do not divide into the segments.
  [[nodiscard]] expected<void> insert(entry_id id, std::int64_t bytes, tier_id tier = hbm_tier, node_info info = {},
                                      bool writing = false, std::int32_t segments = 1) {
    std::lock_guard lock(mu_);
    if (bytes <= 0 || tier.value >= tiers_.size() || segments < 1 || entries_.count(id))
      return unexpected(errc::invalid_argument);
    const std::int64_t need = pages_for(bytes);
    if (need % segments != 0) return unexpected(errc::invalid_argument);
    auto& ts = tiers_[tier.value];
    if (ts.alloc.free_pages() < need) return unexpected(errc::out_of_capacity);
    cache_entry e = fresh_entry(id, info, segments);
    e.copies.push_back(tier_copy{tier, writing ? copy_state::writing : copy_state::valid, 0, 0, bytes, {}, 0, {}});
    auto pages = ts.alloc.take(need);  // may throw: nothing changed yet
    e.copies.front().pages = std::move(*pages);
    try {
      auto [it, ok] = entries_.emplace(id, std::move(e));
      (void)ok;
      ts.copies += 1;
      index_add(it->second, it->second.copies.front());
    } catch (...) {
      ts.alloc.give(e.copies.front().pages);
      throw;
    }
    return {};
  }

  /// A copy of the entry's row, or nullopt.
  [[nodiscard]] std::optional<cache_entry> find(entry_id id) const {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
  }

  /// Calls `f(const tier_copy&)` with the entry's copy in `tier`, under the lock, and
  /// returns true; false (f not called) when there is no such copy. Reads a copy's pages
  /// without copying the row (a runtime that maps pages to its arena itself: the pool
  /// store's host tier). `f` must not call back into the store. O(c) + f; no allocation.
  template <class F>
  bool visit_copy(entry_id id, tier_id tier, F&& f) const {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    const tier_copy* c = it->second.in(tier);
    if (c == nullptr) return false;
    f(*c);
    return true;
  }

  /// The home tier (fastest valid copy; the first copy's while none is valid) and that
  /// copy's state, or nullopt. No page-list copy.
  [[nodiscard]] std::optional<std::pair<tier_id, copy_state>> locate(entry_id id) const {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end() || it->second.copies.empty()) return std::nullopt;
    const tier_copy* h = it->second.home();
    if (h == nullptr) h = &it->second.copies.front();
    return std::pair{h->tier, h->state};
  }

  [[nodiscard]] bool contains(entry_id id) const {
    std::lock_guard lock(mu_);
    return entries_.count(id) != 0;
  }

  /// Pins the fastest valid copy and returns its tier. not_found; busy while no copy is
  /// valid (writing, or only filling).
  [[nodiscard]] expected<tier_id> pin(entry_id id) {
    return with_entry(id, [&](cache_entry& e) -> expected<tier_id> {
      for (auto& c : e.copies)
        if (c.state == copy_state::valid) {
          adjust(e, c, [](tier_copy& x) { x.pins += 1; });
          e.last_access = ++clock_;
          rekey_all(e);
          return c.tier;
        }
      return unexpected(errc::busy);
    });
  }

  /// Pins the copy in `tier`, atomically: busy when that copy is absent or not valid, so a
  /// caller never pins an entry the offloader just moved elsewhere. not_found.
  [[nodiscard]] expected<void> pin_in(entry_id id, tier_id tier) {
    return with_entry(id, [&](cache_entry& e) -> expected<void> {
      tier_copy* c = copy_in(e, tier);
      if (c == nullptr || !next_state(c->state, page_event::pin).allowed) return unexpected(errc::busy);
      adjust(e, *c, [](tier_copy& x) { x.pins += 1; });
      e.last_access = ++clock_;
      rekey_all(e);
      return {};
    });
  }

  /// Releases one pin of the fastest pinned copy. not_found; invalid_argument if no copy
  /// is pinned.
  [[nodiscard]] expected<void> unpin(entry_id id) {
    return with_entry(id, [&](cache_entry& e) -> expected<void> {
      for (auto& c : e.copies)
        if (c.pins > 0) return unpin_copy(e, c);
      return unexpected(errc::invalid_argument);
    });
  }
  /// Releases one pin of the copy in `tier`. not_found; invalid_argument if it is not pinned.
  [[nodiscard]] expected<void> unpin_in(entry_id id, tier_id tier) {
    return with_entry(id, [&](cache_entry& e) -> expected<void> {
      tier_copy* c = copy_in(e, tier);
      if (c == nullptr || c->pins == 0) return unexpected(errc::invalid_argument);
      return unpin_copy(e, *c);
    });
  }

  /// Makes a `writing` entry valid. not_found; invalid_argument unless it is writing.
  [[nodiscard]] expected<void> publish(entry_id id) {
    return with_entry(id, [&](cache_entry& e) -> expected<void> {
      if (e.copies.size() != 1 || e.copies.front().state != copy_state::writing) return unexpected(errc::invalid_argument);
      e.last_access = ++clock_;
      adjust(e, e.copies.front(), [](tier_copy& x) { x.state = copy_state::valid; });
      return {};
    });
  }

  /// Marks the entry used now (recency for LRU-like scorers).
  [[nodiscard]] expected<void> touch(entry_id id) {
    return with_entry(id, [&](cache_entry& e) -> expected<void> {
      e.last_access = ++clock_;
      rekey_all(e);
      return {};
    });
  }

  /// Sets the token span a scorer reads (e.g. once the entry is named by its position).
  [[nodiscard]] expected<void> set_info(entry_id id, node_info info) {
    return with_entry(id, [&](cache_entry& e) -> expected<void> {
      e.info = info;
      rekey_all(e);
      return {};
    });
  }

  /// Adds `delta` to CaR's score of the entry (see `car_score`) and re-sorts its idle copies.
  /// Errors (nothing changes): not_found; invalid_argument when delta or the sum is not finite.
  /// O(c log n), no allocation (the index nodes are re-keyed in place).
  [[nodiscard]] expected<void> add_score(entry_id id, double delta) {
    return with_entry(id, [&](cache_entry& e) -> expected<void> { return rescore(e, e.score + delta); });
  }
  /// Sets CaR's score of the entry to `score` (a mirror of a Score column kept elsewhere:
  /// tiered/car_score.hpp's board) and re-sorts its idle copies when it changed. Errors
  /// (nothing changes): not_found; invalid_argument for a score that is not finite.
  /// O(1) when unchanged, else O(c log n); no allocation.
  [[nodiscard]] expected<void> set_score(entry_id id, double score) {
    return with_entry(id, [&](cache_entry& e) -> expected<void> { return rescore(e, score); });
  }

  /// Starts moving the home copy to `dst`, storing `dst_bytes` there (0 = same size; fewer
  /// when the mover sparsifies); the source goes when the copy lands. The source stays
  /// readable meanwhile. Errors: not_found; invalid_argument (dst is the home tier, unknown
  /// tier, dst_bytes < 0 or beyond the source); busy (no valid copy, or `dst` already has
  /// a copy: a clean replica, or one in flight); out_of_capacity (no free pages at dst).
  [[nodiscard]] expected<move_ticket> prepare_move(entry_id id, tier_id dst, std::int64_t dst_bytes = 0) {
    return with_entry(id, [&](cache_entry& e) -> expected<move_ticket> {
      const tier_copy* h = e.home();
      if (h == nullptr) return unexpected(errc::busy);
      return prepare(e, h->tier, dst, dst_bytes, /*drop_source=*/true);
    });
  }

  /// Starts copying the copy in `src` to `dst` without dropping it: a replica. Errors as
  /// `prepare_move`, and not_found when `src` holds no copy; busy when it is not valid.
  [[nodiscard]] expected<move_ticket> prepare_copy(entry_id id, tier_id src, tier_id dst, std::int64_t dst_bytes = 0) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end() || copy_in(it->second, src) == nullptr) return unexpected(errc::not_found);
    return prepare(it->second, src, dst, dst_bytes, /*drop_source=*/false);
  }

  /// Starts copying `range` of every layer segment of `src_id`'s copy in `src` into a new
  /// entry `new_id` (same number of segments) with one `filling` copy in `dst`, e.g. the
  /// KV of just the tokens a request needs. `range.pages < 0` (with first 0) copies the
  /// whole copy as it is, a sparsified one too (then as one segment). Errors: not_found;
  /// busy unless that copy is valid; invalid_argument (new_id exists, an empty or
  /// out-of-segment range, a range of a sparsified source, an unknown tier); out_of_capacity.
  [[nodiscard]] expected<move_ticket> prepare_extract(entry_id src_id, tier_id src, segment_range range, entry_id new_id,
                                                      tier_id dst, node_info info = {}) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(src_id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    cache_entry& s = it->second;
    tier_copy* sc = copy_in(s, src);
    if (sc == nullptr) return unexpected(errc::not_found);
    if (sc->state != copy_state::valid) return unexpected(errc::busy);
    // range.pages < 0: the whole copy as it is (also a sparsified one, as one segment).
    const bool whole = range.pages < 0 && range.first == 0;
    const bool full = sc->bytes == full_bytes(s) && sc->pages.size() % s.segments == 0;
    const std::int64_t per = full ? sc->pages.size() / s.segments : sc->pages.size();
    if (dst.value >= tiers_.size() || entries_.count(new_id) || (!whole && (!full || range.pages == 0 || range.first < 0 ||
                                                                            range.first + range.pages > per)))
      return unexpected(errc::invalid_argument);
    const std::int32_t segments = whole && !full ? 1 : s.segments;
    if (whole) range = {0, per};
    const std::int64_t need = range.pages * segments;
    auto& ds = tiers_[dst.value];
    if (ds.alloc.free_pages() < need) return unexpected(errc::out_of_capacity);
    move_ticket t;
    t.id = new_id;
    t.src_id = src_id;
    t.src = src;
    t.dst = dst;
    t.segments = segments;
    for (std::int32_t g = 0; g < segments; ++g) t.src_pages.append(sc->pages.slice(g * per + range.first, range.pages));
    t.src_bytes = t.dst_bytes = whole ? sc->bytes : need * page_bytes_;
    cache_entry n = fresh_entry(new_id, info, segments);
    n.copies.push_back(tier_copy{dst, copy_state::filling, 0, 0, t.dst_bytes, {}, ++seq_, {}});
    t.seq = n.copies.front().seq;
    auto pages = ds.alloc.take(need);  // may throw: nothing changed yet
    t.dst_pages = *pages;
    n.copies.front().pages = std::move(*pages);
    try {
      entries_.emplace(new_id, std::move(n));
    } catch (...) {
      ds.alloc.give(t.dst_pages);
      throw;
    }
    ds.copies += 1;
    adjust(s, *sc, [](tier_copy& x) { x.readers += 1; });
    return t;
  }

  /// Finishes a copy. ok: the destination copy is valid (a promotion touches the entry);
  /// for a move, the source copy goes unless a reader pinned it meanwhile (then it stays,
  /// a clean replica). Not ok: the destination copy goes (an extracted entry with it).
  /// Errors: not_found; stale_handle when the ticket is not the destination's current copy.
  [[nodiscard]] expected<void> complete_move(const move_ticket& t, bool ok) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(t.id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    cache_entry& e = it->second;
    tier_copy* d = copy_in(e, t.dst);
    if (d == nullptr || d->state != copy_state::filling || d->seq != t.seq) return unexpected(errc::stale_handle);
    // The source copy: release its reader (it cannot have gone: readers block drops).
    const auto sit = entries_.find(t.src_id);
    if (sit != entries_.end())
      if (tier_copy* s = copy_in(sit->second, t.src); s != nullptr && s->readers > 0)
        adjust(sit->second, *s, [](tier_copy& x) { x.readers -= 1; });
    if (!ok) {
      remove_copy(e, t.dst);
      if (e.copies.empty()) entries_.erase(it);
      return {};
    }
    adjust(e, *d, [](tier_copy& x) { x.state = copy_state::valid; });
    if (t.dst < t.src) {  // promoted: recently used, not the next victim
      e.last_access = ++clock_;
      rekey_all(e);
    }
    if (t.drop_source && t.src_id == t.id)
      if (tier_copy* s = copy_in(e, t.src); s != nullptr && s->idle()) remove_copy(e, t.src);
    return {};
  }

  /// Drops the copy in `tier` (an idle one: valid, no pin, no reader; or a writer's);
  /// the entry goes with its last copy. Returns whether it went (decided under the lock: a
  /// snapshot taken before may show one copy while a finished move left another). Errors:
  /// not_found; busy otherwise.
  [[nodiscard]] expected<bool> drop_copy(entry_id id, tier_id tier) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    tier_copy* c = copy_in(it->second, tier);
    if (c == nullptr) return unexpected(errc::not_found);
    if (!droppable(*c)) return unexpected(errc::busy);
    remove_copy(it->second, tier);
    if (!it->second.copies.empty()) return false;
    entries_.erase(it);
    return true;
  }

  /// Drops every copy of the entry. not_found; busy unless every copy is droppable.
  [[nodiscard]] expected<void> erase(entry_id id) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    for (const auto& c : it->second.copies)
      if (!droppable(c)) return unexpected(errc::busy);
    while (!it->second.copies.empty()) remove_copy(it->second, it->second.copies.back().tier);
    entries_.erase(it);
    return {};
  }

  /// Detaches the first `head_bytes` of every copy (`head_bytes / segments` from the front
  /// of each segment) into a new entry `head_id` with the same copies, without copying.
  /// Both keep the entry's info, recency and score. Errors (nothing changes): not_found;
  /// invalid_argument unless 0 < head_bytes < bytes, head_bytes is a whole number of pages
  /// per segment, every copy holds the full bytes and head_id is new; busy unless every
  /// copy is idle.
  [[nodiscard]] expected<void> split(entry_id id, entry_id head_id, std::int64_t head_bytes) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    cache_entry& e = it->second;
    const std::int64_t bytes = e.bytes();
    if (head_bytes <= 0 || head_bytes >= bytes || head_bytes % (page_bytes_ * e.segments) != 0 ||
        entries_.count(head_id))
      return unexpected(errc::invalid_argument);
    for (const auto& c : e.copies) {
      if (c.bytes != bytes || c.pages.size() * page_bytes_ != bytes) return unexpected(errc::invalid_argument);
      if (!c.idle()) return unexpected(errc::busy);
    }
    const std::int64_t head_pages = head_bytes / page_bytes_ / e.segments;
    cache_entry h;
    h.id = head_id;
    h.info = e.info;
    h.score = e.score;
    h.last_access = e.last_access;
    h.segments = e.segments;
    std::vector<page_list> tails;
    tails.reserve(e.copies.size());
    for (const auto& c : e.copies) {  // may throw: nothing changed yet
      auto [head, tail] = split_segments(c.pages, e.segments, head_pages);
      h.copies.push_back(tier_copy{c.tier, copy_state::valid, 0, 0, head_bytes, std::move(head), 0, {}});
      tails.push_back(std::move(tail));
    }
    auto [hit, ok] = entries_.emplace(head_id, std::move(h));
    (void)ok;
    for (std::size_t i = 0; i < e.copies.size(); ++i) {
      tier_copy& c = e.copies[i];
      adjust(e, c, [&](tier_copy& x) {
        x.pages = std::move(tails[i]);
        x.bytes -= head_bytes;
      });
      tiers_[c.tier.value].copies += 1;
      index_add(hit->second, hit->second.copies[i]);
    }
    return {};
  }

  /// Appends `back`'s bytes to `front` segment by segment, without copying, and removes
  /// `back`. Errors (nothing changes): not_found; invalid_argument for the same id,
  /// different segments or tiers, a copy that is not full bytes in whole pages; busy unless
  /// every copy of both is idle.
  [[nodiscard]] expected<void> join(entry_id front, entry_id back) {
    std::lock_guard lock(mu_);
    const auto fi = entries_.find(front);
    const auto bi = entries_.find(back);
    if (fi == entries_.end() || bi == entries_.end()) return unexpected(errc::not_found);
    cache_entry& f = fi->second;
    cache_entry& b = bi->second;
    if (front == back || f.segments != b.segments || f.copies.size() != b.copies.size())
      return unexpected(errc::invalid_argument);
    for (std::size_t i = 0; i < f.copies.size(); ++i) {
      const auto& x = f.copies[i];
      const auto& y = b.copies[i];
      if (x.tier != y.tier || x.pages.size() * page_bytes_ != x.bytes || y.pages.size() * page_bytes_ != y.bytes ||
          x.pages.size() % f.segments != 0 || y.pages.size() % f.segments != 0)
        return unexpected(errc::invalid_argument);
      if (!x.idle() || !y.idle()) return unexpected(errc::busy);
    }
    std::vector<page_list> joined;
    joined.reserve(f.copies.size());
    for (std::size_t i = 0; i < f.copies.size(); ++i)  // may throw: nothing changed yet
      joined.push_back(join_segments(f.copies[i].pages, b.copies[i].pages, f.segments));
    for (std::size_t i = 0; i < f.copies.size(); ++i) {
      const std::int64_t add = b.copies[i].bytes;
      adjust(f, f.copies[i], [&](tier_copy& x) {
        x.pages = std::move(joined[i]);
        x.bytes += add;
      });
      index_remove(b.id, b.copies[i]);
      tiers_[b.copies[i].tier.value].copies -= 1;
    }
    entries_.erase(bi);
    return {};
  }

  /// Exchanges `n` logical pages of entry `a`'s copy in `tier` (from its page `a_first`)
  /// with `n` pages of entry `b`'s (from `b_first`): a runtime hands bytes loaded into one
  /// entry to another without copying them. Page counts, states and keys are unchanged.
  /// Errors (nothing changes): not_found; invalid_argument for the same entry, a missing
  /// copy or ranges outside either copy; busy while either copy is not valid or is being
  /// read by a copy in flight.
  [[nodiscard]] expected<void> exchange_pages(entry_id a, std::int64_t a_first, entry_id b, std::int64_t b_first,
                                              std::int64_t n, tier_id tier = hbm_tier) {
    std::lock_guard lock(mu_);
    const auto ai = entries_.find(a);
    const auto bi = entries_.find(b);
    if (ai == entries_.end() || bi == entries_.end()) return unexpected(errc::not_found);
    tier_copy* x = copy_in(ai->second, tier);
    tier_copy* y = copy_in(bi->second, tier);
    const auto in_range = [n](const tier_copy* c, std::int64_t first) {
      return c != nullptr && first >= 0 && n >= 0 && first + n <= c->pages.size();
    };
    if (a == b || !in_range(x, a_first) || !in_range(y, b_first)) return unexpected(errc::invalid_argument);
    if (x->state != copy_state::valid || y->state != copy_state::valid || x->readers > 0 || y->readers > 0)
      return unexpected(errc::busy);
    page_list nx = x->pages.slice(0, a_first);  // may throw: nothing changed yet
    nx.append(y->pages.slice(b_first, n));
    nx.append(x->pages.slice(a_first + n, x->pages.size()));
    page_list ny = y->pages.slice(0, b_first);
    ny.append(x->pages.slice(a_first, n));
    ny.append(y->pages.slice(b_first + n, y->pages.size()));
    x->pages = std::move(nx);
    y->pages = std::move(ny);
    return {};
  }

  /// The idle copy of `tier` with the smallest demotion key, or nullopt.
  [[nodiscard]] std::optional<entry_id> victim(tier_id tier) const { return victim(tier, {}); }

  /// The idle copy of `tier` with the smallest demotion key whose entry is not in
  /// `exclude` (any order), or nullopt. A mover skips the victims it already failed to
  /// move in a pass this way. O(log n + s · x) for s skipped copies and x excluded ids.
  [[nodiscard]] std::optional<entry_id> victim(tier_id tier, std::span<const entry_id> exclude) const {
    std::lock_guard lock(mu_);
    if (tier.value >= tiers_.size()) return std::nullopt;
    for (const auto& [key, id] : tiers_[tier.value].index)
      if (std::find(exclude.begin(), exclude.end(), id) == exclude.end()) return id;
    return std::nullopt;
  }

  /// Calls `f(const cache_entry&)` for the idle copies of `tier` in victim order until it
  /// returns false, under the lock (f must not call back). O(log n + visited).
  template <class F>
  void for_each_victim(tier_id tier, F&& f) const {
    std::lock_guard lock(mu_);
    if (tier.value >= tiers_.size()) return;
    for (const auto& [key, id] : tiers_[tier.value].index)
      if (!f(entries_.at(id))) return;
  }

  /// Occupancy of one tier.
  [[nodiscard]] tier_usage usage(tier_id tier) const {
    std::lock_guard lock(mu_);
    const auto& s = tiers_.at(tier.value);
    return {s.alloc.capacity() * page_bytes_, (s.alloc.capacity() - s.alloc.free_pages()) * page_bytes_,
            s.evictable_pages * page_bytes_, s.copies};
  }

  /// Scheduling dry run: could `bytes` be placed in `tier` by dropping only idle copies
  /// (free + evictable pages)? False for bytes < 0 and sizes beyond the tier. Changes nothing.
  [[nodiscard]] bool would_fit(tier_id tier, std::int64_t bytes) const {
    std::lock_guard lock(mu_);
    if (tier.value >= tiers_.size() || bytes < 0) return false;
    const auto& s = tiers_[tier.value];
    return pages_for(bytes) <= s.alloc.free_pages() + s.evictable_pages;
  }

  /// Number of entries.
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
  /// free or owned by exactly one copy; counters agree; each tier's index holds exactly its
  /// idle copies; every reader count matches a copy in flight. O(total pages + entries).
  /// Returns an empty string when consistent, else the first violation.
  [[nodiscard]] std::string check_invariants() const;  // detail/tiered_store_invariants.hpp

 private:
  // A new entry without copies, used now (ticks the clock).
  cache_entry fresh_entry(entry_id id, node_info info, std::int32_t segments) {
    cache_entry e;
    e.id = id;
    e.info = info;
    e.segments = segments;
    e.last_access = ++clock_;
    return e;
  }

  // f(entry) under the lock; not_found when `id` names no entry.
  template <class F>
  auto with_entry(entry_id id, F&& f) -> decltype(f(std::declval<cache_entry&>())) {
    std::lock_guard lock(mu_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return unexpected(errc::not_found);
    return f(it->second);
  }

  struct tier_state {
    explicit tier_state(std::int64_t pages) : alloc(pages) {}
    page_allocator alloc;
    std::int64_t evictable_pages = 0;
    std::int64_t copies = 0;
    std::set<std::pair<demotion_key, entry_id>> index;  // idle copies by demotion key
  };

  static tier_copy* copy_in(cache_entry& e, tier_id t) noexcept {
    for (auto& c : e.copies)
      if (c.tier == t) return &c;
    return nullptr;
  }
  static bool droppable(const tier_copy& c) noexcept {
    return c.state == copy_state::writing || (c.state == copy_state::valid && c.pins == 0 && c.readers == 0);
  }
  // The entry's bytes when not sparsified: the largest copy's.
  static std::int64_t full_bytes(const cache_entry& e) noexcept {
    std::int64_t b = 0;
    for (const auto& c : e.copies) b = std::max(b, c.bytes);
    return b;
  }

  // Common body of prepare_move / prepare_copy (caller holds the lock).
  expected<move_ticket> prepare(cache_entry& e, tier_id src, tier_id dst, std::int64_t dst_bytes, bool drop_source) {
    tier_copy* s = copy_in(e, src);
    if (dst.value >= tiers_.size() || dst == src || dst_bytes < 0 || dst_bytes > s->bytes)
      return unexpected(errc::invalid_argument);
    if (!next_state(s->state, page_event::read_begin).allowed || copy_in(e, dst) != nullptr)
      return unexpected(errc::busy);
    if (dst_bytes == 0) dst_bytes = s->bytes;
    const std::int64_t need = pages_for(dst_bytes);
    if (need % e.segments != 0 && dst_bytes == s->bytes) return unexpected(errc::invalid_argument);
    auto& ds = tiers_[dst.value];
    if (ds.alloc.free_pages() < need) return unexpected(errc::out_of_capacity);
    move_ticket t;
    t.id = e.id;
    t.src_id = e.id;
    t.src = src;
    t.dst = dst;
    t.src_bytes = s->bytes;
    t.dst_bytes = dst_bytes;
    t.segments = e.segments;
    t.drop_source = drop_source;
    t.src_pages = s->pages;  // may throw: nothing changed yet
    auto pages = ds.alloc.take(need);
    t.dst_pages = *pages;
    tier_copy d{dst, copy_state::filling, 0, 0, dst_bytes, std::move(*pages), ++seq_, {}};
    t.seq = d.seq;
    const auto pos = std::find_if(e.copies.begin(), e.copies.end(), [&](const tier_copy& c) { return dst < c.tier; });
    try {
      e.copies.insert(pos, std::move(d));
    } catch (...) {
      ds.alloc.give(t.dst_pages);
      throw;
    }
    ds.copies += 1;
    adjust(e, *copy_in(e, src), [](tier_copy& x) { x.readers += 1; });
    return t;
  }

  expected<void> unpin_copy(cache_entry& e, tier_copy& c) {
    if (!next_state(c.state, page_event::unpin).allowed || c.pins == 0) return unexpected(errc::invalid_argument);
    adjust(e, c, [](tier_copy& x) { x.pins -= 1; });
    return {};
  }

  // Removes the copy of tier t: frees its pages, unindexes it.
  void remove_copy(cache_entry& e, tier_id t) noexcept {
    const auto it = std::find_if(e.copies.begin(), e.copies.end(), [&](const tier_copy& c) { return c.tier == t; });
    if (it == e.copies.end()) return;
    index_remove(e.id, *it);
    auto& ts = tiers_[t.value];
    ts.alloc.give(it->pages);
    ts.copies -= 1;
    e.copies.erase(it);
  }

  // Indexes a copy that is idle (its tier's victim order, evictable pages).
  void index_add(const cache_entry& e, tier_copy& c) {
    if (!c.idle()) return;
    auto& s = tiers_[c.tier.value];
    c.indexed_key = scorer_.key(e);
    s.index.emplace(c.indexed_key, e.id);
    s.evictable_pages += c.pages.size();
  }
  void index_remove(entry_id id, const tier_copy& c) noexcept {
    if (!c.idle()) return;
    auto& s = tiers_[c.tier.value];
    s.index.erase({c.indexed_key, id});
    s.evictable_pages -= c.pages.size();
  }
  // Applies `m` to copy c of entry e, keeping its index entry and counters right.
  template <class Mutate>
  void adjust(const cache_entry& e, tier_copy& c, Mutate&& m) {
    index_remove(e.id, c);
    m(c);
    index_add(e, c);
  }
  void rekey_all(cache_entry& e) {
    for (auto& c : e.copies) adjust(e, c, [](tier_copy&) {});
  }
  // The score of `e` becomes `score`; each idle copy's index node is extracted, re-keyed and
  // put back, so nothing allocates (add_score / set_score). Unchanged: nothing to do.
  expected<void> rescore(cache_entry& e, double score) {
    if (!std::isfinite(score)) return unexpected(errc::invalid_argument);
    if (score == e.score) return {};
    const double before = std::exchange(e.score, score);
    demotion_key key;
    try {
      key = scorer_.key(e);
    } catch (...) {  // a scorer that throws leaves the entry as it was
      e.score = before;
      throw;
    }
    for (auto& c : e.copies) {
      if (!c.idle()) continue;  // indexed (with a fresh key) when it becomes idle
      auto& index = tiers_[c.tier.value].index;
      auto node = index.extract({c.indexed_key, e.id});
      if (node.empty()) continue;  // not indexed: nothing to re-sort
      node.value().first = key;
      c.indexed_key = key;
      index.insert(std::move(node));
    }
    return {};
  }

  std::vector<tier_config> configs_;
  std::int64_t page_bytes_;
  Scorer scorer_;
  mutable std::mutex mu_;
  std::deque<tier_state> tiers_;  // a deque: a tier's allocator (a pool resource) never moves
  std::unordered_map<entry_id, cache_entry> entries_;
  std::uint64_t clock_ = 0;
  std::uint64_t seq_ = 0;
};

}  // namespace hybridcache::tiered

#include "hybridcache/tiered/detail/tiered_store_invariants.hpp"  // IWYU pragma: keep
