// hybridcache/prefix/detail/prefix_cache_commit.hpp
//
// The member functions of `prefix_cache` (prefix/prefix_cache.hpp) that are too long to
// read inside the class: match, commit and its checks, the checkpoint plan, and the
// up-front fit check. Their contracts and costs are documented at their declarations.
// Included at the end of the cache's header; not for direct use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "hybridcache/prefix/prefix_cache.hpp"

namespace hybridcache::prefix {

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
expected<match_result>
prefix_cache<Model, Admission, Scorer, Store, Lock>::match(std::span<const token_id> input, const cache_salt& salt) {
  std::lock_guard<Lock> guard(lock_);
  return match_locked(input, salt);
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
expected<match_result>
prefix_cache<Model, Admission, Scorer, Store, Lock>::match_locked(std::span<const token_id> input,
    const cache_salt& salt) {
  if (input.empty()) return unexpected(errc::invalid_argument);
  if (pins_.free_count() == 0) grow_pins();  // before any change (may throw bad_alloc)
  salt_ = salt;
  const time_point now = clock_.tick();
  const walk_result w = walk(input);
  match_result r;
  r.salt = salt;
  r.input_tokens = static_cast<std::int64_t>(input.size());
  r.common_prefix = w.common_prefix;
  r.at = now;
  const node_id use = deepest_usable(path_, r.input_tokens);
  scorer_.on_match(tree_, std::span<const node_id>(path_), w.partial, now);
  if (use != no_node) {
    r.node = use;
    r.reusable_tokens = tree_.at(use).end;
    r.flops_saved = saturating_flops(r.reusable_tokens);
    const packed_handle h = *pins_.acquire();
    pin_node_[h.index()] = use;
    r.pin = h;
    tree_.pin(use);
    scorer_.on_update(tree_, use);
  }
  ++counters_.matches;
  counters_.tokens_matched += r.input_tokens;
  count_hit(r, +1);
  last_match_ = r;
  return r;
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
expected<commit_result>
prefix_cache<Model, Admission, Scorer, Store, Lock>::commit(std::span<const token_id> sequence,
    std::int64_t input_tokens, const match_result* m, std::span<const std::int64_t> extra, const cache_salt& salt) {
  std::lock_guard<Lock> guard(lock_);
  const walk_memo_scope memo(walk_memo_);
  const auto len = static_cast<std::int64_t>(sequence.size());
  if (const errc e = select_salt(m, salt); e != errc::ok) return unexpected(e);
  std::int64_t reusable = -1;
  const errc checked = validate_commit(sequence, input_tokens, m, extra, reusable, placement_step::prepare);
  // A well-formed request reaches a stream observer even when this cache cannot fit it
  // (the shadows of other rules may); before anything changes (it may throw bad_alloc). Its
  // hit compares with a shadow's only if no other request was matched or inserted since its
  // match (the clock has not moved): a shadow replays each request whole.
  if (checked == errc::ok || checked == errc::out_of_capacity) {
    const std::int64_t live = m == nullptr              ? 0
                              : m->at != clock_.now() ? live_hit_not_comparable
                                                      : m->reusable_tokens;
    observe(sequence, input_tokens, live);
  }
  if (checked != errc::ok) return unexpected(checked);
  const std::int64_t floor = computed_from(reusable);
  reserve_indexes(tree_.id_bound() + positions_.size() + 4);  // may throw: nothing changed yet
  // The reference's order (admit_oversized): the match is released before evicting.
  const bool release_first = cfg_.admit_oversized && m != nullptr && !m->pin.is_null();
  if (release_first) unpin(m->pin);
  // Otherwise the match's pin is held until the insert succeeded: on any failure the caller still
  // holds it (and releases it once). The tokens this commit extends are protected from
  // its own evictions (`guard_path`): their KV is an earlier request's bytes, and
  // re-inserting them into fresh pages would hand the next hit pages nobody filled.

  commit_result res;
  // A store with two sides: evict until each side can place its part (validate_commit
  // checked that evicting every evictable node makes it), then allocate with the split
  // held, so that no allocation (nor a split in build) fails after evicting.
  const split_hold hold(*this, !cfg_.admit_oversized);
  // The admission's positions, then the room (one eviction round of the deficit, then one
  // victim per failed allocation), then every new handle from the store.
  auto place = [&](walk_result& w) -> errc {
    if (reusable < 0) reusable = reusable_in(path_, input_tokens);
    select_positions(make_view(w, input_tokens, len, reusable), extra, floor);
    const std::int64_t need = needed_bytes(w, len);
    const std::int64_t deficit = store_.used_bytes() + need - store_.capacity_bytes();
    guard_path(w);
    bool evict_round = false;
    if (deficit > 0) {
      evict_round = true;
      evict_bytes(deficit, res);
    }
    if (side_placing_store<Store> && !cfg_.admit_oversized) {
      w = walk(sequence);
      select_positions(make_view(w, input_tokens, len, std::min(reusable, w.common_prefix)), extra, floor);
      evict_until_placeable(needed_sides(w, len), evict_round, res);
    }
    while (true) {
      w = walk(sequence);
      select_positions(make_view(w, input_tokens, len, std::min(reusable, w.common_prefix)), extra, floor);
      const errc e = allocate_all(w, len);
      if (e == errc::ok) return errc::ok;
      if (!evict_round) {
        evict_round = true;
        begin_eviction_round();
      }
      if (evict_one(res) < 0) return e;
    }
  };
  errc e = errc::ok;
  try {
    e = insert_sequence(sequence, res, place);
  } catch (...) {
    unguard_path();
    throw;
  }
  unguard_path();
  if (e != errc::ok) return unexpected(e);
  if (!release_first && m != nullptr && !m->pin.is_null()) unpin(m->pin);
  res.over_capacity = store_.used_bytes() > store_.capacity_bytes();
  res.alpha = scorer_.alpha();
  return res;
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
errc
prefix_cache<Model, Admission, Scorer, Store, Lock>::validate_commit(std::span<const token_id> sequence,
    std::int64_t input_tokens, const match_result* m, std::span<const std::int64_t> extra, std::int64_t& reusable,
    placement_step step) {
  const auto len = static_cast<std::int64_t>(sequence.size());
  if (len == 0 || input_tokens < 0 || input_tokens > len) return errc::invalid_argument;
  for (std::int64_t p : extra)
    if (p < 1 || p > len) return errc::invalid_argument;
  reusable = -1;
  if (m != nullptr && !m->pin.is_null()) {
    const errc e = pins_.validate(m->pin);
    if (e != errc::ok) return e;
    const node_id pinned = pin_node_[m->pin.index()];
    if (m->reusable_tokens > len || !on_path(sequence, pinned)) return errc::invalid_argument;
    reusable = m->reusable_tokens;
  }
  // Oversized check before anything changes: the new state alone must fit.
  const walk_result w0 = walk(sequence);
  const std::int64_t r0 = reusable >= 0 ? reusable : reusable_in(path_, input_tokens);
  // An explicit position inside the reused prefix names a state this request never
  // computed (unless the tree already holds it): refused, not silently dropped.
  const std::int64_t floor = computed_from(reusable);
  for (std::int64_t p : extra)
    if (p <= floor && !has_checkpoint_at(p)) return errc::invalid_argument;
  select_positions(make_view(w0, input_tokens, len, r0), extra, floor);
  const std::int64_t need0 = needed_bytes(w0, len);
  if (cfg_.admit_oversized) return errc::ok;
  if (need0 > store_.capacity_bytes()) return errc::out_of_capacity;
  // Refused up front, before anything is evicted, when the new state cannot fit beside
  // what eviction may never take: every pinned node's root path (matches in flight) and
  // the path this commit extends.
  if constexpr (side_placing_store<Store>) {
    const side_bytes sides = needed_sides(w0, len);
    if (step == placement_step::prepare) prepare_placement(sides);
    if (!fits_after_eviction(sides, &w0)) return errc::out_of_capacity;
  } else {
    (void)step;
    if (!fits_after_eviction(side_bytes{need0, 0}, &w0)) return errc::out_of_capacity;
  }
  return errc::ok;
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
errc
prefix_cache<Model, Admission, Scorer, Store, Lock>::plan_into(std::span<const token_id> input, const match_result& m,
    std::span<const std::int64_t> extra, checkpoint_plan& out, std::int64_t lower_branch, bool as_empty) {
  if (input.empty()) return errc::invalid_argument;
  const auto n = static_cast<std::int64_t>(input.size());
  for (std::int64_t p : extra)
    if (p < 1 || p > n) return errc::invalid_argument;
  walk_result w = walk(input);
  if (as_empty) {
    w = walk_result{};
    path_.clear();
  }
  insertion_view v = make_view(w, n, n, std::min(m.reusable_tokens, n));
  if (lower_branch > w.common_prefix && lower_branch < n) v.lower_branch_point = lower_branch;
  select_positions(v, extra);
  out.sites.clear();
  out.prefill_start = v.reusable_tokens;
  out.chunk = static_cast<std::int64_t>(model_.spec().scan_chunk);
  const std::int64_t c = out.chunk > 0 ? out.chunk : 1;
  for (std::int64_t p : positions_) {
    if (p <= v.reusable_tokens) continue;
    if (p <= w.common_prefix && has_checkpoint_at(p)) continue;  // already cached
    checkpoint_site s;
    s.position = p;
    s.chunk_boundary = std::max(v.reusable_tokens, (p / c) * c);
    s.roll_forward = p - s.chunk_boundary;
    out.sites.push_back(s);
  }
  return errc::ok;
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
side_bytes
prefix_cache<Model, Admission, Scorer, Store, Lock>::needed_sides(const walk_result& w,
    std::int64_t len) const noexcept {
  side_bytes out;
  if constexpr (side_placing_store<Store>) {
    const std::int64_t cp = w.common_prefix;
    std::int64_t splits = w.partial != no_node ? 1 : 0, ckpts = 0, prev = cp;
    for (std::int64_t p : positions_) {
      if (p <= cp) {
        if (!has_checkpoint_at(p)) {
          ++ckpts;
          if (node_ending_at(p) == no_node) ++splits;
        }
        continue;
      }
      ++ckpts;
      out.kv += store_.kv_bytes_at(prev, p - prev);
      prev = p;
    }
    if (prev < len) out.kv += store_.kv_bytes_at(prev, len - prev);
    out.kv += splits * store_.kv_bytes(1);
    out.checkpoint = ckpts * store_.checkpoint_bytes();
  } else {
    out.kv = needed_bytes(w, len);  // one side: only the total counts
  }
  return out;
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
bool
prefix_cache<Model, Admission, Scorer, Store, Lock>::fits_after_eviction(const side_bytes& need, const walk_result* w) {
  const std::int64_t bytes = need.total();
  bool fits_now = store_.used_bytes() + bytes <= store_.capacity_bytes();
  if constexpr (side_placing_store<Store>) fits_now = fits_now && store_.placement_fits(need, side_bytes{});
  if (fits_now) return true;
  bool inner = inner_node_evicting_scorer<Scorer>;
  if constexpr (inner_node_reporting_scorer<Scorer>) inner = scorer_.takes_inner_nodes();  // switching scorers
  const node_id end = w != nullptr && !path_.empty() ? path_.back() : no_node;
  const node_id partial = w != nullptr ? w->partial : no_node;
  pinned_scratch_.clear();
  for (std::uint32_t i = 0; i < pin_node_.size(); ++i)
    if (pins_.is_live(i)) pinned_scratch_.push_back(pin_node_[i]);  // capacity: grow_pins
  bool branches = false;
  if constexpr (branch_protecting_scorer<Scorer>) branches = scorer_.protects_branches();
  std::int64_t kept_checkpoints = 0;
  const std::int64_t kept =
      inner ? detail::protected_bytes<true>(tree_, store_, end, partial, pinned_scratch_, protect_, branches,
                                            &kept_checkpoints)
            : detail::protected_bytes<false>(tree_, store_, end, partial, pinned_scratch_, protect_, branches,
                                             &kept_checkpoints);
#if defined(HYBRIDCACHE_ENABLE_ASSERTIONS)
  const auto scan = inner ? detail::count_tree_bytes<true>(tree_, store_, end, partial, marked_, branches)
                          : detail::count_tree_bytes<false>(tree_, store_, end, partial, marked_, branches);
  HYBRIDCACHE_ASSERT(scan.total == tree_.bytes());
  HYBRIDCACHE_ASSERT(scan.protected_ == kept);
#endif
  if (bytes > store_.capacity_bytes() - (store_.used_bytes() - (tree_.bytes() - kept))) return false;
  if constexpr (side_placing_store<Store>) {
    const std::int64_t freeable_checkpoints = tree_.checkpoint_bytes() - kept_checkpoints;
    const std::int64_t freeable_kv = (tree_.bytes() - kept) - freeable_checkpoints;
    return store_.placement_fits(need, side_bytes{freeable_kv, freeable_checkpoints});
  }
  return true;
}

}  // namespace hybridcache::prefix
