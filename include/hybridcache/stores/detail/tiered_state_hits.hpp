// hybridcache/stores/detail/tiered_state_hits.hpp
//
// The hit path of `tiered_state_store` (stores/tiered_state_store.hpp): lookup below HBM,
// load into the staging room (joining copies in flight), wait, settle (adopt, name,
// promote, write-through) and release. Included at the end of the store's header; not for
// direct use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "hybridcache/stores/detail/tiered_state_store_impl.hpp"

namespace hybridcache::stores {

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
std::int64_t tiered_state_store<H, E, S>::scan(std::span<const token_id> input, const match_result& m,
                                               entry_id& ckpt) {
  ckpt = no_entry;
  chain_.clear();
  kv_reach_ = m.common_prefix;
  if (kv_keys_.empty() && ckpt_keys_.empty()) return m.reusable_tokens;  // nothing below HBM: no hashing
  const auto n = static_cast<std::int64_t>(input.size());
  hash_prefixes(input, m.salt);
  // KV reach: [0, common_prefix) is in HBM; extend with free KV entries that start inside it.
  std::int64_t reach = std::min(m.common_prefix, n);
  for (std::int64_t p = reach + 1; p <= n; ++p) {
    // An entry ending at p, or one holding p inside its span (the input leaves it later).
    const std::uint64_t key = prefix_hash_[static_cast<std::size_t>(p)];
    auto it = kv_keys_.find(key);
    if (it == kv_keys_.end() && (it = kv_inside_.find(key)) == kv_inside_.end()) continue;
    const meta& e = meta_.at(it->second);
    if (e.end - e.tokens > reach) continue;  // starts past what is covered
    reach = p;
    // The input follows this entry up to p (a content key names the whole prefix): only
    // its tokens before p are the input's, whatever the entry holds after.
    if (!chain_.empty() && chain_.back().id == it->second) chain_.back().reach = p;
    else chain_.push_back({it->second, p});
  }
  kv_reach_ = reach;
  // A model without recurrent layers resumes anywhere its KV reaches.
  if (checkpoint_ == 0) return std::max(m.reusable_tokens, std::min(reach, n));
  // Deepest covered position with a checkpoint in any tier (joint-min over tiers).
  for (std::int64_t p = std::min(reach, n); p > m.reusable_tokens; --p) {
    const auto it = ckpt_keys_.find(prefix_hash_[static_cast<std::size_t>(p)]);
    if (it == ckpt_keys_.end()) continue;
    ckpt = it->second;
    return p;
  }
  return m.reusable_tokens;
}

// The KV entries of scan's chain that a hit resuming at `best` reads, in chain order, as
// lookup pins them and probe_hit prices them: `read_from(id, reach)` is the tier the entry
// is read from (nullopt: no valid copy); `use(id, tier, covered, upto)` sees each entry
// read, with the tokens covered before it and how far the input follows it. An entry that
// adds no token before `best` (the ones before it reach there already) is not read at all:
// pinned, it would keep an HBM copy that is clean below from going, and `load` would then
// wait for pages nothing frees. False when an entry the hit needs has no valid copy: the
// tokens it covers would be a hole in the hit (the caller gives the hit up).
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
template <class ReadFrom, class Use>
bool tiered_state_store<H, E, S>::for_each_chain_source(std::int64_t best, std::int64_t covered, ReadFrom&& read_from,
                                                         Use&& use) {
  for (const chain_link& link : chain_) {
    if (covered >= best) break;
    const meta& e = meta_.at(link.id);
    if (e.end - e.tokens >= best) break;  // the chain is ordered by reach
    const std::int64_t upto = std::min(link.reach, best);
    if (upto <= covered) continue;
    const std::optional<tier_id> t = read_from(link.id, link.reach);
    if (!t) return false;
    use(link.id, *t, covered, upto);
    covered = upto;
  }
  return true;
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
tiered_probe tiered_state_store<H, E, S>::probe_hit(std::span<const token_id> input,
                                                    const match_result& m) {
  tiered_probe out;
  entry_id ckpt = no_entry;
  out.resume_tokens = scan(input, m, ckpt);
  if (out.resume_tokens == m.reusable_tokens) return out;
  // The tier `lookup` would pin: the home copy (the fastest valid one), if it is valid.
  auto read_from = [&](entry_id id, std::int64_t) -> std::optional<tier_id> {
    const auto at = store_->locate(id);
    if (!at || at->second != copy_state::valid) return std::nullopt;
    return at->first;
  };
  if (ckpt != no_entry) {
    const auto t = read_from(ckpt, out.resume_tokens);
    if (!t) return {.resume_tokens = m.reusable_tokens};  // lookup finds no hit
    out.checkpoint = *t != hbm_tier;
    out.source_tier = std::max(out.source_tier, *t);
  }
  const std::int64_t covered = std::min<std::int64_t>(m.common_prefix, static_cast<std::int64_t>(input.size()));
  const bool whole = for_each_chain_source(out.resume_tokens, covered, read_from,
                                           [&](entry_id, tier_id t, std::int64_t, std::int64_t) {
                                             if (t != hbm_tier) out.source_tier = std::max(out.source_tier, t);
                                             out.kv_entries += 1;
                                           });
  if (!whole) return {.resume_tokens = m.reusable_tokens};  // lookup finds no hit
  return out;
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
tiered_hit tiered_state_store<H, E, S>::lookup(std::span<const token_id> input, const match_result& m) {
  tiered_hit h;
  h.hbm_tokens = h.reusable_tokens = m.reusable_tokens;
  h.kv_reach = m.common_prefix;
  h.salt = m.salt;
  if (kv_keys_.empty() && ckpt_keys_.empty()) return h;
  poll();  // write-backs that landed free their HBM copies: the hit reads below
  const auto n = static_cast<std::int64_t>(input.size());
  entry_id ckpt = no_entry;
  const std::int64_t best = scan(input, m, ckpt);
  h.kv_reach = kv_reach_;
  if (best == m.reusable_tokens) return h;
  outstanding_hit& slot = acquire_hit();  // may throw: nothing pinned yet
  slot.covered = std::min(m.common_prefix, n);
  slot.best = best;
  // Pins the copy it will read (the fastest valid one), in that tier; false if none is.
  auto pin = [&](entry_id id, std::int64_t reach) -> const detail::pinned_source* {
    const auto t = store_->pin(id);
    if (!t) return nullptr;
    slot.pinned.push_back({id, *t, reach});  // capacity reserved by acquire_hit
    meta_.at(id).holds += 1;
    return &slot.pinned.back();
  };
  if (ckpt != no_entry) {  // (a model without recurrent layers has none)
    const detail::pinned_source* cp = pin(ckpt, best);
    if (cp == nullptr) {
      hits_.release(slot);
      return h;
    }
    if (cp->tier != hbm_tier) {
      h.bytes_to_load += stored_of(*cp);
      h.source_tier = std::max(h.source_tier, cp->tier);
    }
  }
  auto pin_tier = [&](entry_id id, std::int64_t reach) -> std::optional<tier_id> {
    const detail::pinned_source* src = pin(id, reach);
    return src == nullptr ? std::nullopt : std::optional<tier_id>(src->tier);
  };
  const bool whole = for_each_chain_source(best, slot.covered, pin_tier,
                                           [&](entry_id id, tier_id t, std::int64_t covered, std::int64_t upto) {
                          if (t != hbm_tier) {
                            h.bytes_to_load += kv_read_bytes({id, t, upto}, covered, upto);
                            h.source_tier = std::max(h.source_tier, t);
                          }
                          h.kv_entries += 1;
                        });
  if (!whole) {  // a hole in the hit: give it up, pins and all (nothing was counted yet)
    h.bytes_to_load = 0;
    h.source_tier = hbm_tier;
    h.kv_entries = 0;
    release_holds(slot);
    return h;
  }
  h.reusable_tokens = best;
  h.host_tokens = best - m.reusable_tokens;
  h.host_checkpoint = ckpt != no_entry;
  h.ticket = slot.ticket;
  counters_.host_hits += 1;
  counters_.host_hit_tokens += h.host_tokens;
  counters_.loaded_bytes += h.bytes_to_load;
  return h;
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<void> tiered_state_store<H, E, S>::shorten_hit(tiered_hit& hit, std::int64_t tokens) {
  outstanding_hit* slot = find_hit(hit.ticket);
  if (slot == nullptr) return unexpected(errc::stale_handle);
  if (!slot->staged.empty() || tokens <= hit.hbm_tokens || tokens > hit.reusable_tokens ||
      (checkpoint_ != 0 && tokens != hit.reusable_tokens))
    return unexpected(errc::invalid_argument);
  if (tokens == hit.reusable_tokens) return {};
  // Recount what the shorter hit reads, in chain order (lookup's), from the HBM prefix on:
  // an entry that adds no token before `tokens` is let go.
  std::int64_t covered = slot->covered, bytes = 0, entries = 0;
  tier_id source = hbm_tier;
  std::size_t kept = 0;
  for (const detail::pinned_source& src : slot->pinned) {
    const meta& e = meta_.at(src.id);
    const std::int64_t upto = std::min(src.reach, tokens);
    if (e.k != kind::kv || e.end - e.tokens >= tokens || upto <= covered) {
      (void)store_->unpin_in(src.id, src.tier);
      meta& m = meta_.at(src.id);
      if (m.holds > 0) m.holds -= 1;
      settle_free(src.id);
      continue;
    }
    if (src.tier != hbm_tier) {
      bytes += kv_read_bytes(src, covered, upto);
      source = std::max(source, src.tier);
    }
    entries += 1;
    covered = upto;
    slot->pinned[kept++] = src;
  }
  slot->pinned.resize(kept);
  slot->best = tokens;
  counters_.host_hit_tokens -= hit.reusable_tokens - tokens;
  counters_.loaded_bytes -= hit.bytes_to_load - bytes;
  hit.reusable_tokens = tokens;
  hit.host_tokens = tokens - hit.hbm_tokens;
  hit.bytes_to_load = bytes;
  hit.kv_entries = entries;
  hit.host_checkpoint = false;
  hit.source_tier = source;
  return {};
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
expected<void> tiered_state_store<H, E, S>::load(const tiered_hit& hit) {
  outstanding_hit* slot = find_hit(hit.ticket);
  if (slot == nullptr) return unexpected(errc::stale_handle);
  if (!slot->staged.empty()) return {};
  poll();
  // Plan: per pinned entry, the pages of every layer segment this hit needs (for KV, the
  // tokens it adds beyond what HBM and the earlier entries cover), and whether a staged
  // entry already holds (or is loading) exactly those: one no hit holds is claimed, one
  // another hit holds is copied inside HBM once it landed (the link carries it once).
  plan_.clear();
  std::int64_t need = 0;
  std::int64_t cursor = slot->covered;  // KV entries come in chain order: each adds from here
  for (const detail::pinned_source& src : slot->pinned) {
    const meta& e = meta_.at(src.id);
    planned_load p{src, {0, -1}, e.end, e.end, no_entry};
    if (e.k == kind::kv) {
      const std::int64_t begin = e.end - e.tokens;
      p.begin = std::max(begin, cursor);
      p.end = std::min(src.reach, slot->best);
      if (p.end <= p.begin) continue;
      cursor = p.end;
      if (stored_of(src) == bytes_of(e))  // sparsified copies load whole
        p.range = {(p.begin - begin) * pages_per_layer_token_, (p.end - p.begin) * pages_per_layer_token_};
      else
        p.begin = begin, p.end = e.end;
    }
    const auto x = extracts_.find({src.id, p.range.first, p.range.pages});
    if (x != extracts_.end()) p.join = x->second;
    if (x == extracts_.end() || meta_.at(x->second).holds > 0)
      need += p.range.pages < 0 ? stored_of(src) : p.range.pages * segments(e.k) * page_;
    plan_.push_back(p);
  }
  // Loaded data no hit holds any more goes first when the room is short.
  while (need > staging_capacity_ - staged_used_ && drop_one_orphan()) {
  }
  if (need > staging_capacity_ - staged_used_) return unexpected(errc::out_of_capacity);  // nothing changed
  // A source whose bytes are on their way (its copy reads it: the table counts that reader;
  // or a join reads another staged entry) is no longer the hit's to pin. Letting it go at
  // once matters when it is a free entry whose HBM copy is clean below: that copy can go
  // as soon as the read lands, which is what a later step's wait for HBM pages waits for.
  auto let_go = [&](const detail::pinned_source& src) noexcept {
    for (detail::pinned_source& pin : slot->pinned) {
      if (pin.id != src.id || pin.tier != src.tier) continue;
      (void)store_->unpin_in(pin.id, pin.tier);
      meta& e = meta_.at(pin.id);
      if (e.holds > 0) e.holds -= 1;
      const entry_id id = std::exchange(pin.id, no_entry);  // release_holds skips it
      settle_free(id);
      return;
    }
  };
  slot->staged.reserve(plan_.size());  // may throw: nothing moved yet
  reserve_for(meta_, meta_.size() + plan_.size());
  reserve_for(extracts_, extracts_.size() + plan_.size());
  pending_.reserve(pending_.size() + plan_.size());
  group_.clear();
  group_.reserve(plan_.size());
  for (std::size_t k = 0; k < plan_.size(); ++k) {
    planned_load p = plan_[k];
    const meta& src = meta_.at(p.src.id);
    const bool ckpt = src.k == kind::checkpoint;
    const std::int64_t first = ckpt ? p.end : p.begin;
    // The earlier steps may have run copies to completion (waiting for HBM pages): the
    // extract planned as a join may have landed, failed or gone since. A failed or gone
    // one is no join: its joins were started (and failed) when it failed, so a join
    // registered now would wait for it forever; this hit loads the bytes itself.
    if (p.join != no_entry && !joinable(p.join)) {
      p.join = no_entry;
      const std::int64_t bytes =
          p.range.pages < 0 ? stored_of(p.src) : p.range.pages * segments(src.k) * page_;
      if (bytes > staging_capacity_ - staged_used_) {
        (void)submit_group_loads(*slot);  // what this hit staged so far goes as it did alone
        release_holds(*slot);
        return unexpected(errc::out_of_capacity);
      }
    }
    if (p.join != no_entry && meta_.at(p.join).holds == 0) {  // loaded for no one now: this hit's
      meta& j = meta_.at(p.join);
      j.holds = 1;
      j.claimable = false;
      slot->staged.push_back({p.join, first, p.end, ckpt, j.transferred});
      counters_.joined_loads += 1;
      let_go(p.src);
      continue;
    }
    const entry_id id = make_entry_id(++next_id_);
    meta m;
    m.k = src.k;
    m.r = role::staged;
    m.tokens = ckpt ? 0 : p.end - p.begin;
    m.end = p.end;
    m.holds = 1;
    if (p.join != no_entry) {  // another hit's copy brings these bytes: copy them in HBM after it
      m.pending_src = p.join;
      m.pending_bytes = store_->find(p.join)->copies.front().bytes;
      meta_.emplace(id, m);
      staged_used_ += m.pending_bytes;
      pending_.push_back(id);
      slot->staged.push_back({id, first, p.end, ckpt, 0});
      counters_.joined_loads += 1;
      if (const auto row = store_->find(p.join); row && row->valid_in_gpu()) start_join(id);
      let_go(p.src);
      continue;
    }
    const std::int64_t pages = p.range.pages < 0 ? store_->pages_for(stored_of(p.src)) : p.range.pages * segments(src.k);
    // Short of HBM pages: what this hit staged so far is submitted now, not with the rest,
    // because the wait below may need exactly those reads to land (a source that is a free
    // HBM entry, clean below, goes once its read lands).
    if (free_pages(hbm_tier) < pages && !submit_group_loads(*slot)) {
      release_holds(*slot);
      return unexpected(errc::busy);
    }
    if (!wait_for_hbm_pages(pages) && p.src.tier == hbm_tier) {
      // Read in HBM while its write-back is in flight, but HBM has no room for a copy: wait
      // for the write-back, read the copy below instead, and let the HBM one go.
      quiesce(p.src.id);
      const auto row = store_->find(p.src.id);
      const tier_copy* below = nullptr;  // points into `row`, which outlives its use below
      if (row)
        for (const auto& c : row->copies)
          if (c.tier != hbm_tier && c.state == copy_state::valid && below == nullptr) below = &c;
      if (below != nullptr && store_->pin_in(p.src.id, below->tier)) {
        const tier_id from = below->tier;
        (void)store_->unpin_in(p.src.id, hbm_tier);
        for (auto& pin : slot->pinned)
          if (pin.id == p.src.id && pin.tier == hbm_tier) pin.tier = from;
        p.src.tier = from;
        settle_free(p.src.id);
      }
    }
    if (free_pages(hbm_tier) < pages && !wait_for_hbm_pages(pages)) {
      (void)submit_group_loads(*slot);
      release_holds(*slot);
      return unexpected(errc::out_of_capacity);
    }
    const node_info info{first, p.end, ckpt};
    auto t = store_->prepare_extract(p.src.id, p.src.tier, p.range, id, hbm_tier, info);
    if (!t) {
      (void)submit_group_loads(*slot);
      release_holds(*slot);
      return unexpected(errc::busy);
    }
    const std::int64_t bytes = t->dst_bytes;
    m.src = p.src.id;
    m.range = p.range;
    m.transferred = p.src.tier != hbm_tier ? bytes : 0;
    meta_.emplace(id, m);
    extracts_.emplace(extract_key{p.src.id, p.range.first, p.range.pages}, id);
    staged_used_ += bytes;
    slot->staged.push_back({id, first, p.end, ckpt, m.transferred});
    group_.push_back(std::move(*t));  // room reserved: cannot throw. Submitted together below
    counters_.staged_entries += 1;
    counters_.staged_bytes += bytes;
    let_go(p.src);
  }
  if (!submit_group_loads(*slot)) {  // what the engine refused is unstaged: the hit is lost
    release_holds(*slot);
    return unexpected(errc::busy);
  }
  // Sources the plan did not read (none, with lookup's chain) go the same way.
  for (const detail::pinned_source& src : slot->pinned)
    if (src.id != no_entry) let_go(src);
  slot->pinned.clear();
  return {};
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

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
template <class Tree>
void tiered_state_store<H, E, S>::settle(const Tree& tree, std::span<const token_id> sequence,
                                         const tiered_hit& hit) {
  hash_prefixes(sequence, hit.salt);
  const auto w = tree.walk(sequence, path_, tree.namespace_of(hit.salt));
  if (outstanding_hit* slot = find_hit(hit.ticket); slot != nullptr) {
    for (const staged_entry& s : slot->staged) {  // landed before the tree takes them
      if (const auto it = meta_.find(s.id); it != meta_.end() && it->second.pending_src != no_entry)
        quiesce(it->second.pending_src);
      quiesce(s.id);
    }
    adopt_staged(tree, *slot);
    release_holds(*slot);
  }
  for (const node_id n : path_) {
    const auto& nd = tree.at(n);
    const std::uint64_t key = prefix_hash_[static_cast<std::size_t>(nd.end)];
    name(nd.kv.id, key, nd.end - nd.edge(), nd.end);
    if (nd.has_checkpoint) name(nd.checkpoint.id, key, nd.end - nd.edge(), nd.end);
  }
  // Free KV entries whose whole span HBM now holds (under other node boundaries) are
  // redundant: promoted. Free checkpoints stay unless HBM has the same one (`name`).
  if (!kv_keys_.empty())
    for (std::int64_t p = 1; p <= w.common_prefix; ++p)
      if (const auto it = kv_keys_.find(prefix_hash_[static_cast<std::size_t>(p)]); it != kv_keys_.end()) promote(it);
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::name(entry_id id, std::uint64_t key, std::int64_t begin, std::int64_t end) {
  if (id == no_entry) return;
  meta& e = meta_.at(id);
  e.key = key;
  e.named = true;
  e.end = end;
  e.visits += 1;
  if (e.k == kind::kv && end - e.tokens >= 0)  // the keys inside the span, for a partial match once demoted
    e.interior.assign(prefix_hash_.begin() + (end - e.tokens + 1), prefix_hash_.begin() + end);
  // The node's span, for a demotion scorer (FLOP-aware: the node's saved FLOPs per byte of
  // this entry: its KV, or its checkpoint with the KV), and recency.
  (void)store_->set_info(id, node_info{begin, end, e.k == kind::checkpoint});
  (void)store_->touch(id);  // the cleaner visits HBM entries coldest first
  auto& keys = keys_of(e.k);
  if (const auto it = keys.find(key); it != keys.end()) promote(it);
  if (write_ == write_policy::write_through ||
      (write_ == write_policy::write_through_selective && e.visits > static_cast<std::uint32_t>(write_through_hits_)))
    replicate(id);
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::promote(std::unordered_map<std::uint64_t, entry_id>::iterator it) noexcept {
  const entry_id old = it->second;
  meta& m = meta_.at(old);
  bool all_idle = true;
  if (const auto row = store_->find(old))
    for (const auto& c : row->copies) all_idle = all_idle && c.idle();
  if (m.holds > 0 || !all_idle) {  // a hit holds it, or a copy is in flight: erased when it lets go
    m.superseded = true;
    return;
  }
  counters_.promoted_entries += 1;
  counters_.promoted_bytes += bytes_of(m);
  forget(old);
}

// Gives each staged entry's pages to the path nodes covering the same tokens (the path of
// the committed sequence is in path_), per layer segment, by exchanging page ranges: a
// staged entry belongs to one hit, so nothing else reads those pages. Only fresh node
// entries (this commit's, not yet named) take pages: a node that was already in the tree
// (another request inserted the same tokens meanwhile) holds the right bytes, and other
// requests in flight may be reading its pages, so they never move. The staged entry
// then holds the nodes' old pages and goes. An entry the path does not cover entirely is
// left (it goes, or stays claimable, when its hit lets go); a sparsified one is never
// adopted.
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
template <class Tree>
void tiered_state_store<H, E, S>::adopt_staged(const Tree& tree, outstanding_hit& hit) noexcept {
  const std::int64_t q = pages_per_layer_token_;
  for (staged_entry& s : hit.staged) {
    const auto mit = meta_.find(s.id);
    if (mit == meta_.end() || mit->second.failed || mit->second.pending_src != no_entry) continue;
    const meta& m = mit->second;
    const auto row = store_->find(s.id);
    if (!row || !row->valid_in_gpu() || row->in(hbm_tier)->bytes != bytes_of(m)) continue;  // sparsified: not adopted
    const std::int64_t pages = row->in(hbm_tier)->pages.size();
    // false for a node that already holds its bytes (named): ok stays, nothing moves
    auto fresh = [&](entry_id node) { return node != no_entry && !meta_.at(node).named; };
    auto hand = [&](entry_id node, std::int64_t node_first, std::int64_t staged_first, std::int64_t n) {
      return store_->exchange_pages(node, node_first, s.id, staged_first, n).has_value();
    };
    bool ok = false, any = false;
    if (s.checkpoint) {
      for (const node_id n : path_) {
        const auto& nd = tree.at(n);
        if (nd.end != s.end) continue;
        ok = any = nd.has_checkpoint && fresh(nd.checkpoint.id) && hand(nd.checkpoint.id, 0, 0, pages);
        break;
      }
    } else if (!path_.empty() && tree.at(path_.back()).end >= s.end) {  // the path covers it
      ok = true;
      for (const node_id n : path_) {
        const auto& nd = tree.at(n);
        const std::int64_t nb = nd.end - nd.edge();
        const std::int64_t lo = std::max(nb, s.begin), hi = std::min(nd.end, s.end);
        if (lo >= hi || !ok) continue;
        if (nd.kv.id != no_entry && !fresh(nd.kv.id)) continue;  // holds these bytes already
        for (std::int32_t g = 0; g < kv_segments_ && ok; ++g) {
          ok = nd.kv.id != no_entry && hand(nd.kv.id, g * nd.edge() * q + (lo - nb) * q,
                                            g * (s.end - s.begin) * q + (lo - s.begin) * q, (hi - lo) * q);
          any = any || ok;
        }
      }
    }
    if (ok) {
      counters_.adopted_entries += 1;
      counters_.promoted_entries += 1;
      counters_.promoted_bytes += bytes_of(m);
    }
    if (any) {  // its pages now are the nodes' old ones (or a mix): it goes
      meta_.at(s.id).holds = 0;
      forget(s.id);
      s.id = no_entry;  // release_holds skips it
    }
  }
}

// A hit lets go of a staged entry: a join not started yet is cancelled, a failed one is
// forgotten, and loaded data goes (once it landed: after_copy), unless `keep` (a released
// prefetch): then an extract stays claimable by the next hit on the same bytes until the
// room is needed (`drop_one_orphan`).
template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::unhold_staged(entry_id id, bool keep) noexcept {
  const auto it = meta_.find(id);
  if (it == meta_.end()) return;
  meta& m = it->second;
  if (m.holds > 0) m.holds -= 1;
  if (m.holds > 0) return;
  if (m.pending_src != no_entry) {
    pending_.erase(std::remove(pending_.begin(), pending_.end(), id), pending_.end());
    staged_used_ -= m.pending_bytes;
    meta_.erase(it);
    return;
  }
  if (m.failed) {
    meta_.erase(it);
    return;
  }
  m.claimable = keep && m.src != no_entry;
  if (m.claimable) return;
  const auto row = store_->find(id);
  if (row && row->in(hbm_tier) != nullptr && row->in(hbm_tier)->state == copy_state::filling) return;  // after_copy
  forget(id);
}

template <demotion_scorer H, tier_copy_engine E, demotion_sizer S>
void tiered_state_store<H, E, S>::release_holds(outstanding_hit& hit, bool keep_loaded) noexcept {
  for (const staged_entry& s : hit.staged)
    if (s.id != no_entry) unhold_staged(s.id, keep_loaded);
  for (const detail::pinned_source& src : hit.pinned) {
    if (src.id == no_entry) continue;
    (void)store_->unpin_in(src.id, src.tier);
    const auto it = meta_.find(src.id);
    if (it == meta_.end()) continue;
    if (it->second.holds > 0) it->second.holds -= 1;
    settle_free(src.id);  // the deferred promotion, or a draining HBM copy no one reads now
  }
  hits_.release(hit);
}

}  // namespace hybridcache::stores
