// hybridcache/stores/detail/tiered_state_store_impl.hpp
//
// The member functions of `tiered_state_store` (stores/tiered_state_store.hpp) that are
// too long to read inside the class: construction, allocation and release, the copies in
// flight (submit, poll, finish), room in the lower tiers and the watermark cleaner; the
// hit path (lookup, settle) is tiered_state_hits.hpp, loading a hit tiered_state_loads.hpp.
// Included at the end of the store's header; not for direct use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "hybridcache/stores/tiered_state_store.hpp"

namespace hybridcache::stores {

// --- construction ------------------------------------------------------------------------

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
tiered_state_store<H, E, S>::tiered_state_store(const tiered_state_store_config& c, E& engine, S sizer, H host)
    : config_(c),
      kv_per_token_(c.kv_bytes_per_token),
      checkpoint_(c.checkpoint_bytes),
      capacity_(c.capacity_bytes),
      page_(page_bytes_for(c)),
      pages_per_layer_token_(c.kv_bytes_per_token / c.attention_layers / page_bytes_for(c)),
      kv_segments_(c.attention_layers),
      ckpt_segments_(c.recurrent_layers),
      write_(c.write),
      write_through_hits_(c.write_through_hits),
      marks_(c.offload),
      model_id_(c.model_id),
      store_(std::make_unique<tiered::tiered_store<H>>(tiers_for(c), page_bytes_for(c), std::move(host))),
      engine_(&engine),
      sizer_(std::move(sizer)) {
  HYBRIDCACHE_EXPECTS(c.write_through_hits >= 1, invalid_argument, "tiered_state_store: write_through_hits must be >= 1");
  marks_.validate();
  staging_capacity_ = c.staging_bytes / page_ * page_;
  if (checkpoint_ > capacity_)
    throw capacity_error("tiered_state_store: HBM capacity " + std::to_string(capacity_) +
                         " B is smaller than one SSM checkpoint (" + std::to_string(checkpoint_) + " B)");
  // An engine laid out for other tiers or pages would refuse or misplace every copy.
  if constexpr (paged_copy_engine<E>) {
    if (engine.page_bytes() != page_)
      throw invalid_argument("tiered_state_store: the copy engine's page (" + std::to_string(engine.page_bytes()) +
                             " B) is not the store's (" + std::to_string(page_) +
                             " B): build it from tiers_for(config) and page_bytes_for(config)");
  }
  if constexpr (arena_copy_engine<E>) {
    for (std::size_t t = 0; t < store_->tier_count(); ++t) {
      const tier_id id{static_cast<std::uint8_t>(t)};
      if (tiered::is_storage(store_->config(id).kind)) continue;  // no arena: a backend holds it
      if (engine.arena_bytes(id) < store_->config(id).capacity_bytes)
        throw invalid_argument("tiered_state_store: the copy engine's arena of tier " + std::to_string(t) + " (" +
                               std::to_string(engine.arena_bytes(id)) + " B) is smaller than the tier (" +
                               std::to_string(store_->config(id).capacity_bytes) +
                               " B): build it from tiers_for(config) and page_bytes_for(config)");
    }
  }
  stuck_.resize(store_->tier_count());
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
std::int64_t tiered_state_store<H, E, S>::page_bytes_for(const tiered_state_store_config& c) {
  HYBRIDCACHE_EXPECTS(c.kv_bytes_per_token >= 0 && c.checkpoint_bytes >= 0 &&
                          (c.kv_bytes_per_token > 0 || c.checkpoint_bytes > 0),
                      invalid_argument, "tiered_state_store: bytes per token / checkpoint must be >= 0, not both 0");
  HYBRIDCACHE_EXPECTS(c.attention_layers >= 1 && c.recurrent_layers >= 1, invalid_argument,
                      "tiered_state_store: attention_layers and recurrent_layers must be >= 1");
  HYBRIDCACHE_EXPECTS(c.kv_bytes_per_token % c.attention_layers == 0 && c.checkpoint_bytes % c.recurrent_layers == 0,
                      invalid_argument,
                      "tiered_state_store: attention_layers must divide kv_bytes_per_token and recurrent_layers "
                      "checkpoint_bytes (layer-major segments)");
  return std::gcd(c.kv_bytes_per_token / c.attention_layers, c.checkpoint_bytes / c.recurrent_layers);
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
std::vector<tiered::tier_config> tiered_state_store<H, E, S>::tiers_for(const tiered_state_store_config& c) {
  HYBRIDCACHE_EXPECTS(c.capacity_bytes > 0, invalid_argument, "tiered_state_store: capacity_bytes must be > 0");
  HYBRIDCACHE_EXPECTS(c.staging_bytes >= 0, invalid_argument, "tiered_state_store: staging_bytes must be >= 0");
  HYBRIDCACHE_EXPECTS(c.host_capacity_bytes >= 0, invalid_argument, "tiered_state_store: host_capacity_bytes must be >= 0");
  HYBRIDCACHE_EXPECTS(c.lower_tiers.empty() || c.host_capacity_bytes == 0, invalid_argument,
                      "tiered_state_store: give host_capacity_bytes or lower_tiers, not both");
  const std::int64_t page = page_bytes_for(c);
  std::vector<tiered::tier_config> out;
  out.push_back(tiered::tier_config{.kind = tiered::tier_kind::hbm,
                            .capacity_bytes = (c.capacity_bytes / page + c.staging_bytes / page) * page,
                            .link_gbps = 0.0});
  if (c.lower_tiers.empty()) {
    if (c.host_capacity_bytes > 0)  // else HBM only: what the cache evicts is dropped (the single-tier baseline)
      out.push_back(tiered::tier_config{.kind = tiered::tier_kind::host,
                                .capacity_bytes = std::max(c.host_capacity_bytes / page, std::int64_t{1}) * page,
                                .link_gbps = c.link_gbps});
  } else {
    for (tiered::tier_config t : c.lower_tiers) {
      if (t.capacity_bytes > 0) t.capacity_bytes = std::max(t.capacity_bytes / page, std::int64_t{1}) * page;
      out.push_back(t);
    }
  }
  tiered::validate_tiers(out, page);  // names the bad tier and field
  if (out.size() > max_hit_tiers)     // a hit counts its tokens per tier in a fixed array
    throw invalid_argument("tiered_state_store: " + std::to_string(out.size()) + " tiers; at most " +
                           std::to_string(max_hit_tiers) + " (hbm and " + std::to_string(max_hit_tiers - 1) +
                           " below it) are supported");
  return out;
}

// --- allocation and release ----------------------------------------------------------------

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<entry_id> tiered_state_store<H, E, S>::allocate(std::int64_t bytes, kind k, std::int64_t tokens) noexcept {
  if (bytes > capacity_ - used_) return unexpected(errc::out_of_capacity);
  if (bytes == 0) return no_entry;  // nothing to hold (empty handle)
  try {
    // A write-back in flight still holds its HBM pages: the allocation waits for it.
    if (!wait_for_hbm_pages(store_->pages_for(bytes))) return unexpected(errc::out_of_capacity);
    const entry_id id = make_entry_id(++next_id_);
    reserve_for(meta_, meta_.size() + 1);
    auto r = store_->insert(id, bytes, hbm_tier, {}, false, segments(k));
    if (!r) return unexpected(r.error());
    meta m;
    m.k = k;
    m.tokens = tokens;
    meta_.emplace(id, m);  // reserved: no rehash, no throw
    used_ += bytes;
    return id;
  } catch (...) {
    return unexpected(errc::out_of_capacity);
  }
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<tiered_kv_extent> tiered_state_store<H, E, S>::split_kv(kv_extent& whole, std::int64_t n) noexcept {
  if (n <= 0 || n >= whole.tokens) return unexpected(errc::invalid_argument);
  if (whole.id == no_entry) {  // zero-byte KV (a model without attention layers)
    whole.tokens -= n;
    return kv_extent{no_entry, n};
  }
  quiesce(whole.id);  // a copy down reading it lands first (its replica splits with it)
  try {
    reserve_for(meta_, meta_.size() + 1);
    const entry_id head = make_entry_id(next_id_ + 1);
    if (auto r = store_->split(whole.id, head, n * kv_per_token_); !r) return unexpected(r.error());
    (void)store_->set_score(head, 0.0);  // a new node's entry: its score starts at 0 (no allocation)
    ++next_id_;
    meta& w = meta_.at(whole.id);
    meta h;
    h.k = kind::kv;
    h.tokens = n;
    if (w.named && static_cast<std::int64_t>(w.interior.size()) == w.tokens - 1) {  // the keys split with it
      h.named = true;
      h.key = w.interior[static_cast<std::size_t>(n - 1)];
      h.end = w.end - w.tokens + n;
      h.interior.assign(w.interior.begin(), w.interior.begin() + (n - 1));
      w.interior.erase(w.interior.begin(), w.interior.begin() + n);
    }
    meta_.emplace(head, std::move(h));
    w.tokens -= n;
    whole.tokens -= n;
    return kv_extent{head, n};
  } catch (...) {
    return unexpected(errc::out_of_capacity);
  }
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<void> tiered_state_store<H, E, S>::join_kv(kv_extent& front, kv_extent&& back) noexcept {
  if (front.id == no_entry || back.id == no_entry) {  // zero-byte KV: only lengths
    if (front.id != back.id) return unexpected(errc::invalid_argument);
    front.tokens += std::exchange(back.tokens, 0);
    return {};
  }
  quiesce(front.id);
  quiesce(back.id);
  try {
    const auto f = store_->find(front.id);
    const auto b = store_->find(back.id);
    if (!f || !b) return unexpected(errc::not_found);
    // Clean replicas below HBM join only when both have them in the same tiers; otherwise
    // they go (a replica is only a saved copy, and the joined span needs a new one).
    bool same = f->copies.size() == b->copies.size();
    for (std::size_t i = 0; same && i < f->copies.size(); ++i) same = f->copies[i].tier == b->copies[i].tier;
    if (!same)
      for (const auto* row : {&*f, &*b})
        for (const auto& c : row->copies)
          if (c.tier != hbm_tier) (void)store_->drop_copy(row->id, c.tier);
    if (auto r = store_->join(front.id, back.id); !r) return unexpected(r.error());
    (void)store_->set_score(front.id, b->score);  // back's node is the one that stays (no allocation)
    meta& fm = meta_.at(front.id);
    meta& bm = meta_.at(back.id);
    if (fm.named && bm.named) {  // front's keys, front's end key, back's keys
      fm.interior.push_back(fm.key);
      fm.interior.insert(fm.interior.end(), bm.interior.begin(), bm.interior.end());
    } else {
      fm.interior.clear();
    }
    fm.tokens += bm.tokens;
    fm.key = bm.key;  // the joined span ends where `back` did
    fm.end = bm.end;
    fm.named = bm.named && fm.named;
    meta_.erase(back.id);
    front.tokens += back.tokens;
    back = kv_extent{};
    return {};
  } catch (...) {
    return unexpected(errc::out_of_capacity);
  }
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::release_from_tree(entry_id id) noexcept {
  const auto it = meta_.find(id);
  if (it == meta_.end()) return;
  meta& e = it->second;
  const std::int64_t b = bytes_of(e);
  try {
    (void)store_->set_score(id, 0.0);  // the tree's score leaves with the tree (no allocation)
  } catch (...) {  // only the table's lock could throw: the score stays
  }
  used_ -= b;
  draining_ += b;  // a free entry with an HBM copy
  e.r = role::free;
  if (!e.named || b == 0 || !has_lower()) {  // a rolled-back allocation, or nowhere to go
    forget(id);
    return;
  }
  counters_.demoted_entries += 1;
  counters_.demoted_bytes += b;
  auto& keys = keys_of(e.k);
  if (keys.count(e.key) != 0) {  // the same bytes are below already (content keys)
    drop(id);
    return;
  }
  const auto row = store_->find(id);
  const bool clean = row && row->clean_below(hbm_tier);
  // What a write-back would store (a sparsified copy keeps fewer bytes, loaded whole).
  const std::int64_t keep = e.k == kind::kv && row && !clean ? std::clamp<std::int64_t>(sizer_.stored_bytes(*row), 1, b) : b;
  try {
    keys.emplace(e.key, id);
    // Findable in part too, unless sparsified: those tokens cannot be sliced out of it.
    if (keep == b)
      for (const std::uint64_t k : e.interior) kv_inside_.try_emplace(k, id);
  } catch (...) {
    drop(id);
    return;
  }
  if (clean) {  // a clean copy below: the HBM copy goes for free
    counters_.clean_drops += 1;
    settle_free(id);
    return;
  }
  if (e.replicating) return;  // its copy down is in flight: poll drops the HBM copy when it lands
  // Write-back: copy it down now; the HBM pages are freed when the copy lands.
  if (!make_room(host_tier, keep)) {
    drop(id);
    return;
  }
  auto t = store_->prepare_copy(id, hbm_tier, host_tier, keep == b ? 0 : keep);
  if (!t) {
    drop(id);
    return;
  }
  meta_.at(id).replicating = true;
  if (!submit(std::move(*t), purpose::write_back)) {
    meta_.at(id).replicating = false;
    drop(id);
    return;
  }
  counters_.write_backs += 1;
  counters_.write_back_bytes += keep;
  counters_.sparsified_bytes += b - keep;
}

// A free entry after something changed around it: its HBM copy goes once a copy below is
// valid and nobody reads it; it goes entirely when it has no copy below and none is coming
// (a failed write-back), or when the tree named the same key again (superseded). A staged
// entry no hit holds any more, whose forget was refused while a join's copy read it, goes
// once that copy landed.
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::settle_free(entry_id id) noexcept {
  const auto it = meta_.find(id);
  if (it == meta_.end()) return;
  meta& e = it->second;
  if (e.r == role::staged) {  // a join read it while its hits let go: it goes now
    if (e.holds == 0 && !e.claimable && e.pending_src == no_entry) {
      const auto row = store_->find(id);
      if (row && row->copies.front().idle()) forget(id);
    }
    return;
  }
  if (e.r != role::free) return;
  const auto row = store_->find(id);
  if (!row) return;
  bool in_flight = false, all_idle = true;
  for (const auto& c : row->copies) {
    in_flight = in_flight || c.state == copy_state::filling;
    all_idle = all_idle && c.idle();
  }
  if (e.superseded && e.holds == 0 && all_idle) {
    counters_.promoted_entries += 1;
    counters_.promoted_bytes += bytes_of(e);
    forget(id);
    return;
  }
  const tier_copy* hbm = row->in(hbm_tier);
  if (hbm == nullptr || hbm->state != copy_state::valid || !hbm->idle()) return;
  if (row->clean_below(hbm_tier)) {
    if (store_->drop_copy(id, hbm_tier)) draining_ -= bytes_of(e);
  } else if (!in_flight && e.holds == 0) {
    drop(id);  // its copy down failed: HBM was its last copy
  }
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::forget(entry_id id) noexcept {
  const auto it = meta_.find(id);
  if (it == meta_.end()) return;
  meta& e = it->second;
  const auto row = store_->find(id);
  if (row && !store_->erase(id)) return;  // in use (pinned, read or filling): the caller retries later
  const tier_copy* hbm = row ? row->in(hbm_tier) : nullptr;
  if (e.r == role::tree) used_ -= bytes_of(e);
  else if (e.r == role::staged && hbm != nullptr) staged_used_ -= hbm->bytes;
  else if (e.r == role::free && hbm != nullptr) draining_ -= bytes_of(e);
  if (e.r == role::free && e.named) {
    auto& keys = keys_of(e.k);
    if (const auto k = keys.find(e.key); k != keys.end() && k->second == id) keys.erase(k);
    for (const std::uint64_t key : e.interior)
      if (const auto k = kv_inside_.find(key); k != kv_inside_.end() && k->second == id) kv_inside_.erase(k);
  }
  if (e.r == role::staged)
    if (const auto x = extracts_.find({e.src, e.range.first, e.range.pages}); x != extracts_.end() && x->second == id)
      extracts_.erase(x);
  meta_.erase(it);
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::drop(entry_id id) noexcept {
  const auto it = meta_.find(id);
  if (it == meta_.end()) return;
  if (it->second.named) {
    counters_.dropped_entries += 1;
    counters_.dropped_bytes += bytes_of(it->second);
  }
  forget(id);
}

// --- copies in flight ------------------------------------------------------------------------

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
bool tiered_state_store<H, E, S>::submit(move_ticket&& t, purpose p) noexcept {
  try {
    inflight_.reserve(inflight_.size() + 1);  // the push below cannot throw once submitted
    auto ev = engine_->submit(t);
    if (!ev) {
      (void)store_->complete_move(t, false);
      counters_.copy_failures += 1;
      return false;
    }
    inflight_.push_back(inflight{std::move(t), std::move(*ev), p});
    return true;
  } catch (...) {
    (void)store_->complete_move(t, false);
    counters_.copy_failures += 1;
    return false;
  }
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
std::int64_t tiered_state_store<H, E, S>::poll() noexcept {
  std::int64_t done = 0;
  for (std::size_t i = 0; i < inflight_.size();) {
    bool landed = false;
    try {
      landed = engine_->query(inflight_[i].ev);
    } catch (...) {
      landed = true;  // wait reports the failure
    }
    if (!landed) {
      ++i;
      continue;
    }
    finish_copy(i);
    ++done;
    i = 0;  // after_copy may have finished others (quiesce): start over
  }
  return done;
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::finish_copy(std::size_t i) noexcept {
  inflight f = std::move(inflight_[i]);
  if (i + 1 != inflight_.size()) inflight_[i] = std::move(inflight_.back());
  inflight_.pop_back();
  bool ok = false;
  try {
    ok = engine_->wait(f.ev).has_value();
  } catch (...) {
    ok = false;
  }
  (void)store_->complete_move(f.t, ok);
  if (!ok) counters_.copy_failures += 1;
  after_copy(f, ok);
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::after_copy(const inflight& f, bool ok) noexcept {
  const auto it = meta_.find(f.t.id);
  switch (f.p) {
    case purpose::write_back:
    case purpose::replica:
      if (it != meta_.end()) it->second.replicating = false;
      settle_free(f.t.id);  // a free entry: drop the HBM copy (clean now), or the entry (copy failed)
      break;
    case purpose::cascade:
      break;  // the table dropped the source (if idle); nothing else changes
    case purpose::load:
      if (it != meta_.end()) {
        meta& m = it->second;
        if (!ok) {  // the copy failed: the table removed the staged entry
          staged_used_ -= f.t.dst_bytes;
          m.failed = true;
          if (const auto x = extracts_.find({m.src, m.range.first, m.range.pages}); x != extracts_.end() && x->second == f.t.id)
            extracts_.erase(x);
        }
        // Joins waiting for these bytes: copy them in HBM now (or fail with it). Searched
        // afresh after each start: starting one may finish other copies whose joins start
        // and leave `pending_` (a join behind the cursor once moved ahead of it and was
        // never started: it waited forever, and its source went when its hit let go).
        for (;;) {
          const auto j = std::find_if(pending_.begin(), pending_.end(),
                                      [&](entry_id p) { return meta_.at(p).pending_src == f.t.id; });
          if (j == pending_.end()) break;
          start_join(*j);  // removes it from pending_
        }
        const auto again = meta_.find(f.t.id);
        if (again != meta_.end() && again->second.holds == 0) {
          if (again->second.failed) meta_.erase(again);
          else if (!again->second.claimable) forget(f.t.id);  // every hit let go while it was loading
        }
      }
      settle_free(f.t.src_id);  // the source has one reader less
      break;
  }
}

// HBM beyond the cache's budget and the staging room holds only free entries whose HBM copy
// has not gone yet (draining_): each goes once its copy down lands and nothing reads it. So
// the copies worth waiting for are those copies down, and the copies that read a free
// entry's HBM copy (a load whose source is one: when it lands the source may go). Pins of
// outstanding hits are not waited for: the hit that holds one lets it go when it loads.
// O(copies in flight) per copy waited for.
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
bool tiered_state_store<H, E, S>::wait_for_hbm_pages(std::int64_t pages) noexcept {
  poll();
  while (free_pages(hbm_tier) < pages) {
    // The oldest such copy; copies down first (they free the most, and surely).
    std::size_t pick = inflight_.size(), reader = inflight_.size();
    for (std::size_t i = 0; i < inflight_.size() && pick == inflight_.size(); ++i) {
      const auto& c = inflight_[i];
      if (c.p == purpose::write_back || c.p == purpose::replica) {
        if (const auto m = meta_.find(c.t.id); m != meta_.end() && m->second.r == role::free) pick = i;
      } else if (c.p == purpose::load && reader == inflight_.size() && c.t.src == hbm_tier) {
        if (const auto m = meta_.find(c.t.src_id); m != meta_.end() && m->second.r == role::free) reader = i;
      }
    }
    if (pick == inflight_.size()) pick = reader;
    if (pick == inflight_.size()) return false;
    counters_.write_back_waits += 1;
    finish_copy(pick);
  }
  return true;
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::quiesce(entry_id id) noexcept {
  for (std::size_t i = 0; i < inflight_.size();) {
    if (inflight_[i].t.id == id || inflight_[i].t.src_id == id) {
      finish_copy(i);
      i = 0;  // indices moved
      continue;
    }
    ++i;
  }
}

// Makes room for `bytes` in lower tier t: drops copies that are valid elsewhere, moves the
// others one tier down (and waits for that copy), drops from the last tier. False, with
// nothing dropped from t, when t cannot take the bytes (free + idle pages too few).
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
bool tiered_state_store<H, E, S>::make_room(tier_id t, std::int64_t bytes) noexcept {
  try {
    if (t.value >= store_->tier_count() || !store_->would_fit(t, bytes)) return false;
    const std::int64_t need = store_->pages_for(bytes);
    auto& stuck = stuck_[t.value];
    stuck.clear();
    const bool last = t.value + 1u >= store_->tier_count();
    for (int guard = 0; guard < (1 << 20); ++guard) {
      if (free_pages(t) >= need) return true;
      const auto v = store_->victim(t, stuck);
      if (!v) return false;
      const auto row = store_->find(*v);
      if (!row) continue;
      bool elsewhere = false;
      for (const auto& c : row->copies) elsewhere = elsewhere || (c.tier != t && c.state == copy_state::valid);
      if (elsewhere) {  // a replica (or a copy that moved down): free to drop here
        if (!store_->drop_copy(*v, t)) stuck.push_back(*v);
        continue;
      }
      const auto m = meta_.find(*v);
      if (m == meta_.end() || m->second.r != role::free || m->second.holds > 0) {
        stuck.push_back(*v);
        continue;
      }
      if (last) {  // the last tier: it leaves the cache
        drop(*v);
        continue;
      }
      const tier_id next{static_cast<std::uint8_t>(t.value + 1)};
      if (!make_room(next, row->bytes())) {
        stuck.push_back(*v);
        continue;
      }
      auto mt = store_->prepare_move(*v, next);
      if (!mt) {
        stuck.push_back(*v);
        continue;
      }
      counters_.cascades += 1;
      counters_.cascade_bytes += mt->dst_bytes;
      if (!submit(std::move(*mt), purpose::cascade)) {
        stuck.push_back(*v);
        continue;
      }
      finish_copy(inflight_.size() - 1);  // its pages in t are freed when it lands
      // A failed move leaves the entry in t: skip it for the rest of this call, or the next
      // victim() picks it again and a copy that always fails is retried without end.
      if (const auto after = store_->find(*v); after && after->in(t) != nullptr) stuck.push_back(*v);
    }
  } catch (...) {
  }
  return false;
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::replicate(entry_id id) noexcept {
  if (!has_lower()) return;
  const auto it = meta_.find(id);
  if (it == meta_.end() || it->second.replicating) return;
  try {
    const auto row = store_->find(id);
    if (!row || row->copies.size() != 1 || !row->valid_in_gpu()) return;
    const std::int64_t b = row->bytes();
    if (!make_room(host_tier, b)) return;
    auto t = store_->prepare_copy(id, hbm_tier, host_tier);
    if (!t) return;
    meta_.at(id).replicating = true;
    if (!submit(std::move(*t), purpose::replica)) {
      meta_.at(id).replicating = false;
      return;
    }
    counters_.replicas += 1;
    counters_.replica_bytes += b;
  } catch (...) {
  }
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
std::int64_t tiered_state_store<H, E, S>::offload() noexcept {
  poll();
  if (!has_lower() || marks_.high >= 1.0) return 0;  // high = 1: the cleaner is off
  const auto cap = static_cast<double>(capacity_);
  const double in_use = static_cast<double>(used_);  // the cache's budget: what eviction frees
  if (in_use < marks_.high * cap) return 0;
  const double target = in_use - marks_.low * cap;  // the coldest bytes that should be clean
  std::int64_t started = 0;
  try {
    candidates_.clear();
    double walked = 0.0;
    store_->for_each_victim(hbm_tier, [&](const cache_entry& e) {
      if (walked >= target) return false;
      walked += static_cast<double>(e.in(hbm_tier)->bytes);
      if (e.copies.size() == 1) candidates_.push_back(e.id);  // dirty: no copy below
      return true;
    });
    for (const entry_id id : candidates_) {
      const auto it = meta_.find(id);
      if (it == meta_.end() || it->second.r != role::tree || !it->second.named) continue;
      const std::int64_t before = counters_.replicas;
      replicate(id);
      if (counters_.replicas > before) started += bytes_of(meta_.at(id));
    }
  } catch (...) {
  }
  return started;
}

}  // namespace hybridcache::stores

#include "hybridcache/stores/detail/tiered_state_hits.hpp"  // IWYU pragma: keep
