// hybridcache/stores/detail/tiered_state_loads.hpp
//
// Loading a hit of `tiered_state_store` (stores/tiered_state_store.hpp) into HBM's staging
// room: `load` plans the pages each pinned source adds (`plan_load`), then stages each one
// (`stage_planned`): joined to a staged entry that brings the same bytes (`join_planned`),
// or extracted into HBM, waiting for HBM pages (reading the copy below when HBM has no
// room for a second one: `read_from_below`); the extracts go to the engine as one group
// (`submit_group_loads`). Then the waits, whole or per layer. Included by
// tiered_state_hits.hpp; not for direct use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "hybridcache/stores/detail/tiered_state_hits.hpp"

namespace hybridcache::stores {

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<void> tiered_state_store<H, E, S>::load(const tiered_hit& hit) {
  outstanding_hit* slot = find_hit(hit.ticket);
  if (slot == nullptr) return unexpected(errc::stale_handle);
  if (!slot->staged.empty()) return {};
  poll();
  const std::int64_t need = plan_load(*slot);
  // Loaded data no hit holds any more goes first when the room is short.
  while (need > staging_capacity_ - staged_used_ && drop_one_orphan()) {
  }
  if (need > staging_capacity_ - staged_used_) return unexpected(errc::out_of_capacity);  // nothing changed
  slot->staged.reserve(plan_.size());  // may throw: nothing moved yet
  reserve_for(meta_, meta_.size() + plan_.size());
  reserve_for(extracts_, extracts_.size() + plan_.size());
  pending_.reserve(pending_.size() + plan_.size());
  group_.clear();
  group_.reserve(plan_.size());
  for (const planned_load& p : plan_)
    if (auto staged = stage_planned(*slot, p); !staged) return staged;
  if (!submit_group_loads(*slot)) {  // what the engine refused is unstaged: the hit is lost
    release_holds(*slot);
    return unexpected(errc::busy);
  }
  // Sources the plan did not read (none, with lookup's chain) go the same way.
  for (const detail::pinned_source& src : slot->pinned)
    if (src.id != no_entry) let_go(*slot, src);
  slot->pinned.clear();
  return {};
}

// load's plan (`plan_`): per pinned entry, the pages of every layer segment this hit needs
// (for KV, the tokens it adds beyond what HBM and the earlier entries cover), and whether a
// staged entry already holds (or is loading) exactly those: one no hit holds is claimed,
// one another hit holds is copied inside HBM once it landed (the link carries it once).
// Returns the staging bytes the plan needs. Changes nothing else.
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
std::int64_t tiered_state_store<H, E, S>::plan_load(const outstanding_hit& slot) {
  plan_.clear();
  std::int64_t need = 0;
  std::int64_t cursor = slot.covered;  // KV entries come in chain order: each adds from here
  for (const detail::pinned_source& src : slot.pinned) {
    const meta& e = meta_.at(src.id);
    planned_load p{src, {0, -1}, e.end, e.end, no_entry};
    if (e.k == kind::kv) {
      const std::int64_t begin = e.end - e.tokens;
      p.begin = std::max(begin, cursor);
      p.end = std::min(src.reach, slot.best);
      if (p.end <= p.begin) continue;
      cursor = p.end;
      if (stored_of(src) == bytes_of(e))  // sparsified copies load whole
        p.range = {(p.begin - begin) * pages_per_layer_token_, (p.end - p.begin) * pages_per_layer_token_};
      else
        p.begin = begin, p.end = e.end;
    }
    const auto x = extracts_.find({src.id, p.range.first, p.range.pages});
    if (x != extracts_.end()) p.join = x->second;
    if (x == extracts_.end() || meta_.at(x->second).holds > 0) need += planned_bytes(p);
    plan_.push_back(p);
  }
  return need;
}

// A source whose bytes are on their way (its copy reads it: the table counts that reader;
// or a join reads another staged entry) is no longer the hit's to pin. Letting it go at
// once matters when it is a free entry whose HBM copy is clean below: that copy can go as
// soon as the read lands, which is what a later step's wait for HBM pages waits for.
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::let_go(outstanding_hit& slot, const detail::pinned_source& src) noexcept {
  for (detail::pinned_source& pin : slot.pinned) {
    if (pin.id != src.id || pin.tier != src.tier) continue;
    (void)store_->unpin_in(pin.id, pin.tier);
    meta& e = meta_.at(pin.id);
    if (e.holds > 0) e.holds -= 1;
    const entry_id id = std::exchange(pin.id, no_entry);  // release_holds skips it
    settle_free(id);
    return;
  }
}

// One step of load: the planned source joined to a staged entry, or its extract into HBM
// prepared (into group_, submitted with the rest). On an error what the hit staged so far
// is submitted as it would have been alone and its holds are released; the caller returns
// the error.
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<void> tiered_state_store<H, E, S>::stage_planned(outstanding_hit& slot, planned_load p) {
  const auto fail = [&](errc why, bool submit_staged) {
    if (submit_staged) (void)submit_group_loads(slot);
    release_holds(slot);
    return unexpected(why);
  };
  // The earlier steps may have run copies to completion (waiting for HBM pages): the
  // extract planned as a join may have landed, failed or gone since. A failed or gone one
  // is no join: its joins were started (and failed) when it failed, so a join registered
  // now would wait for it forever; this hit loads the bytes itself.
  if (p.join != no_entry && !joinable(p.join)) {
    p.join = no_entry;
    if (planned_bytes(p) > staging_capacity_ - staged_used_) return fail(errc::out_of_capacity, true);
  }
  if (p.join != no_entry) {
    join_planned(slot, p);
    return {};
  }
  const entry_id id = make_entry_id(++next_id_);  // before the waits below: the order ids were always given in
  const kind k = meta_.at(p.src.id).k;
  const bool ckpt = k == kind::checkpoint;
  const std::int64_t first = ckpt ? p.end : p.begin;
  const std::int64_t pages = p.range.pages < 0 ? store_->pages_for(stored_of(p.src)) : p.range.pages * segments(k);
  // Short of HBM pages: what this hit staged so far is submitted now, not with the rest,
  // because the wait below may need exactly those reads to land (a source that is a free
  // HBM entry, clean below, goes once its read lands).
  if (free_pages(hbm_tier) < pages && !submit_group_loads(slot)) return fail(errc::busy, false);
  if (!wait_for_hbm_pages(pages) && p.src.tier == hbm_tier) read_from_below(slot, p.src);
  if (free_pages(hbm_tier) < pages && !wait_for_hbm_pages(pages)) return fail(errc::out_of_capacity, true);
  const node_info info{first, p.end, ckpt};
  auto t = store_->prepare_extract(p.src.id, p.src.tier, p.range, id, hbm_tier, info);
  if (!t) return fail(errc::busy, true);
  const std::int64_t bytes = t->dst_bytes;
  meta m = staged_meta(k, p);
  m.src = p.src.id;
  m.range = p.range;
  m.transferred = p.src.tier != hbm_tier ? bytes : 0;
  meta_.emplace(id, m);
  extracts_.emplace(extract_key{p.src.id, p.range.first, p.range.pages}, id);
  staged_used_ += bytes;
  slot.staged.push_back({id, first, p.end, ckpt, m.transferred});
  group_.push_back(std::move(*t));  // room reserved: cannot throw. Submitted together later
  counters_.staged_entries += 1;
  counters_.staged_bytes += bytes;
  let_go(slot, p.src);
  return {};
}

// A planned source that a staged entry already brings (p.join, joinable): a staged entry
// no hit holds is claimed by this hit; one another hit holds is copied inside HBM once its
// own copy landed (a new staged entry, pending on it).
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::join_planned(outstanding_hit& slot, const planned_load& p) {
  const kind k = meta_.at(p.src.id).k;
  const bool ckpt = k == kind::checkpoint;
  const std::int64_t first = ckpt ? p.end : p.begin;
  counters_.joined_loads += 1;
  if (meta& j = meta_.at(p.join); j.holds == 0) {  // loaded for no one now: this hit's
    j.holds = 1;
    j.claimable = false;
    slot.staged.push_back({p.join, first, p.end, ckpt, j.transferred});
    let_go(slot, p.src);
    return;
  }
  const entry_id id = make_entry_id(++next_id_);
  meta m = staged_meta(k, p);
  m.pending_src = p.join;
  m.pending_bytes = store_->find(p.join)->copies.front().bytes;
  meta_.emplace(id, m);
  staged_used_ += m.pending_bytes;
  pending_.push_back(id);
  slot.staged.push_back({id, first, p.end, ckpt, 0});
  if (const auto row = store_->find(p.join); row && row->valid_in_gpu()) start_join(id);
  let_go(slot, p.src);
}

// A source read in HBM while its write-back is in flight, when HBM has no room for a
// copy: wait for the write-back, read the copy below instead, and let the HBM one go
// (src and the hit's pin follow it).
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::read_from_below(outstanding_hit& slot, detail::pinned_source& src) {
  quiesce(src.id);
  const auto row = store_->find(src.id);
  const tier_copy* below = nullptr;  // points into `row`, which outlives its use below
  if (row)
    for (const auto& c : row->copies)
      if (c.tier != hbm_tier && c.state == copy_state::valid && below == nullptr) below = &c;
  if (below == nullptr || !store_->pin_in(src.id, below->tier)) return;
  const tier_id from = below->tier;
  (void)store_->unpin_in(src.id, hbm_tier);
  for (auto& pin : slot.pinned)
    if (pin.id == src.id && pin.tier == hbm_tier) pin.tier = from;
  src.tier = from;
  settle_free(src.id);
}

// The copies `load` staged for `slot` (`group_`), submitted together: as one group over an
// engine that takes groups (its layer segments interleaved across the entries, so layer 0
// of every entry lands first; `grouped_copy_engine`), else one by one in order. What the
// engine refuses, and every copy after it, is unstaged (`unstage`) and false comes back;
// the caller then lets the hit go (copies submitted before the refusal run, and their
// entries go when they land, as any copy of a hit let go).
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
bool tiered_state_store<H, E, S>::submit_group_loads(outstanding_hit& slot) noexcept {
  std::size_t submitted = 0;
  bool refused_completed = false;  // the refused copy was completed as failed by `submit`
  if constexpr (grouped_copy_engine<E>) {
    if (group_.empty()) return true;
    bool ok = false;
    try {
      inflight_.reserve(inflight_.size() + group_.size());  // the pushes below cannot throw once submitted
      group_events_.resize(group_.size());
      ok = engine_->submit_group(std::span<const move_ticket>(group_), std::span<event_type>(group_events_)).has_value();
    } catch (...) {
      ok = false;
    }
    if (ok) {
      for (std::size_t k = 0; k < group_.size(); ++k)
        inflight_.push_back(inflight{std::move(group_[k]), group_events_[k], purpose::load});
      submitted = group_.size();
    }
  } else {
    while (submitted < group_.size() && submit(std::move(group_[submitted]), purpose::load)) ++submitted;
    refused_completed = submitted < group_.size();
  }
  for (std::size_t k = submitted; k < group_.size(); ++k) unstage(slot, group_[k], refused_completed && k == submitted);
  const bool all = submitted == group_.size();
  group_.clear();
  return all;
}

// Undoes the staging of a copy `load` prepared but could not submit: the table drops the
// staged copy (unless `submit` already completed it as failed), the entry leaves the hit
// and the counters, and its source, which the hit let go when staging it, has one reader less.
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::unstage(outstanding_hit& slot, const move_ticket& t, bool completed) noexcept {
  if (!completed) {
    (void)store_->complete_move(t, false);
    counters_.copy_failures += 1;
  }
  staged_used_ -= t.dst_bytes;
  counters_.staged_entries -= 1;
  counters_.staged_bytes -= t.dst_bytes;
  if (const auto it = meta_.find(t.id); it != meta_.end()) {
    extracts_.erase({it->second.src, it->second.range.first, it->second.range.pages});
    meta_.erase(it);
  }
  slot.staged.erase(std::remove_if(slot.staged.begin(), slot.staged.end(), [&](const staged_entry& e) { return e.id == t.id; }),
                    slot.staged.end());
  settle_free(t.src_id);
}

// Whether a staged extract can still be joined or claimed: known, not failed, and landed
// in HBM or still loading there (its copy's after_copy then starts the joins).
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
bool tiered_state_store<H, E, S>::joinable(entry_id id) const {
  const auto it = meta_.find(id);
  if (it == meta_.end() || it->second.failed || it->second.pending_src != no_entry) return false;
  const auto row = store_->find(id);
  if (!row) return false;
  const tier_copy* c = row->in(hbm_tier);
  return c != nullptr && (c->state == copy_state::valid || c->state == copy_state::filling);
}

// A join whose source landed: its own staged copy, copied inside HBM from the source.
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::start_join(entry_id id) noexcept {
  const auto it = meta_.find(id);
  if (it == meta_.end() || it->second.pending_src == no_entry) return;
  const entry_id src = std::exchange(it->second.pending_src, no_entry);
  const std::int64_t bytes = it->second.pending_bytes;
  pending_.erase(std::remove(pending_.begin(), pending_.end(), id), pending_.end());
  const auto row = store_->find(src);
  bool ok = false;
  try {
    ok = row && row->valid_in_gpu() && wait_for_hbm_pages(store_->pages_for(bytes));
    if (ok) {
      auto t = store_->prepare_extract(src, hbm_tier, {0, -1}, id, hbm_tier, row->info);
      ok = t && submit(std::move(*t), purpose::load);
    }
  } catch (...) {
    ok = false;
  }
  if (!ok) {  // the source failed or went: this hit's load fails
    staged_used_ -= bytes;
    meta_.at(id).failed = true;
  }
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
bool tiered_state_store<H, E, S>::drop_one_orphan() noexcept {
  for (auto it = extracts_.begin(); it != extracts_.end(); ++it) {
    if (meta_.at(it->second).holds > 0) continue;
    const auto row = store_->find(it->second);
    if (!row || !row->valid_in_gpu() || !row->copies.front().idle()) continue;
    forget(it->second);
    return true;
  }
  return false;
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<void> tiered_state_store<H, E, S>::wait_loaded(const tiered_hit& hit) {
  outstanding_hit* slot = find_hit(hit.ticket);
  if (slot == nullptr) return unexpected(errc::stale_handle);
  bool failed = false;
  for (const staged_entry& s : slot->staged) {
    if (const auto it = meta_.find(s.id); it != meta_.end() && it->second.pending_src != no_entry)
      quiesce(it->second.pending_src);  // its source lands, then its own copy starts
    quiesce(s.id);
    const auto it = meta_.find(s.id);
    failed = failed || it == meta_.end() || it->second.failed;
  }
  if (failed) {
    release_holds(*slot);
    return unexpected(errc::busy);
  }
  return {};
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<bool> tiered_state_store<H, E, S>::loaded(const tiered_hit& hit) {
  const outstanding_hit* slot = find_hit(hit.ticket);
  if (slot == nullptr) return unexpected(errc::stale_handle);
  (void)poll();
  for (const staged_entry& s : slot->staged) {
    if (const auto it = meta_.find(s.id); it != meta_.end() && it->second.pending_src != no_entry) return false;
    for (const auto& c : inflight_)
      if (c.t.id == s.id) return false;
  }
  auto r = wait_loaded(hit);  // nothing of it in flight: completes without blocking
  if (!r) return unexpected(r.error());
  return true;
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<bool> tiered_state_store<H, E, S>::layer_loaded(const tiered_hit& hit, layer_kind k, std::int32_t layer)
  requires layered_copy_engine<E>
{
  return layer_pass(hit, k, layer, layer_wait::query);
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<void> tiered_state_store<H, E, S>::wait_layer(const tiered_hit& hit, layer_kind k, std::int32_t layer)
  requires layered_copy_engine<E>
{
  const auto r = layer_pass(hit, k, layer, layer_wait::block);
  if (!r) return unexpected(r.error());
  return {};
}

// The hit's staged entries of `k`'s kind: each landed whole (no copy in flight), or its copy
// has landed its first layer + 1 segments (the engine counts in the ticket's segments; a
// copy that is not segment-aligned lands them all at once). A join not started yet waits for its source
// (`block`), or is not there yet (`query`). A failed copy (or join) is busy; nothing here
// completes a copy, so the failure is still `wait_loaded`'s to report.
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<bool> tiered_state_store<H, E, S>::layer_pass(const tiered_hit& hit, layer_kind k, std::int32_t layer,
                                                        layer_wait how)
  requires layered_copy_engine<E>
{
  const outstanding_hit* slot = find_hit(hit.ticket);
  if (slot == nullptr) return unexpected(errc::stale_handle);
  if (k == layer_kind::mlp || layer < 0 || layer >= segments(k == layer_kind::attention ? kind::kv : kind::checkpoint))
    return unexpected(errc::invalid_argument);
  (void)poll();  // completes what landed (a failed copy marks its entry)
  const bool checkpoint = k == layer_kind::recurrent;
  for (const staged_entry& s : slot->staged) {
    if (s.checkpoint != checkpoint || s.id == no_entry) continue;
    auto it = meta_.find(s.id);
    if (it == meta_.end() || it->second.failed) return unexpected(errc::busy);
    if (it->second.pending_src != no_entry) {
      if (how == layer_wait::query) return false;
      quiesce(it->second.pending_src);  // its source lands; its own copy starts (after_copy)
      it = meta_.find(s.id);
      if (it == meta_.end() || it->second.failed || it->second.pending_src != no_entry) return unexpected(errc::busy);
    }
    for (const inflight& c : inflight_) {
      if (c.t.id != s.id) continue;
      const std::int32_t need = std::min<std::int32_t>(layer + 1, std::max<std::int32_t>(1, c.t.segments));
      try {  // an engine that throws (cuda_error) reports a failed copy: busy, as poll does
        if (how == layer_wait::block) {
          if (!engine_->wait_segments(c.ev, need)) return unexpected(errc::busy);
        } else if (engine_->landed_segments(c.ev) < need) {
          if (engine_->query(c.ev)) return unexpected(errc::busy);  // it ran, short of the layer: failed
          return false;
        }
      } catch (...) {
        return unexpected(errc::busy);
      }
      break;
    }
  }
  return true;
}

}  // namespace hybridcache::stores
