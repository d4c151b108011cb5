// hybridcache/prefix/detail/lifecycle_calls.hpp
//
// The member functions of `request_lifecycle` (prefix/lifecycle.hpp) that are too long to
// read inside the class: begin, grow, finish, and the reservation and adoption they run.
// Their contracts and costs are documented at their declarations. Included at the end of
// the lifecycle's header; not for direct use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "hybridcache/prefix/lifecycle.hpp"

namespace hybridcache::prefix {

template <class Cache>
error_info
request_lifecycle<Cache>::check_begin(std::span<const token_id> prompt, const begin_options& o) noexcept {
  const auto n = static_cast<std::int64_t>(prompt.size());
  if (n == 0) return {errc::invalid_argument, false, "begin: the prompt is empty"};
  if (o.output_tokens < 0) return {errc::invalid_argument, true, "begin: output_tokens must be >= 0", o.output_tokens};
  if (o.output_tokens > std::numeric_limits<std::int64_t>::max() - n)
    return {errc::invalid_argument, true, "begin: |prompt| + output_tokens overflows int64", o.output_tokens};
  for (const std::int64_t p : o.extra_checkpoints)
    if (p < 1 || p > n) return {errc::invalid_argument, true, "begin: an extra checkpoint lies outside [1, |prompt|]", p};
  return {};
}

template <class Cache>
std::int64_t
request_lifecycle<Cache>::max_reservable_tokens() const noexcept {
  // kv_bytes(1) is the store's smallest KV allocation: one token, or one page set of
  // tokens_per_page tokens for a paged store. More units than the capacity holds never fit.
  const std::int64_t unit = cache_->store_.kv_bytes(1);
  if (unit <= 0) return std::numeric_limits<std::int64_t>::max();  // no attention layers: KV costs nothing
  std::int64_t per_unit = 1;
  if constexpr (pages_by_position) per_unit = cache_->store_.tokens_per_page();
  const std::int64_t units = cache_->store_.capacity_bytes() / unit + 1;
  return units > std::numeric_limits<std::int64_t>::max() / per_unit ? std::numeric_limits<std::int64_t>::max()
                                                                      : units * per_unit;
}

template <class Cache>
template <class AcceptHit>
expected<request_ticket>
request_lifecycle<Cache>::begin(std::span<const token_id> prompt, const begin_options& o, AcceptHit&& accept) {
  if (const error_info e = check_begin(prompt, o); e.code != errc::ok) return unexpected(e);
  const std::unique_lock<memory_mutex> memory(memory_);
  // One critical section from the match to the reservation: the lookup below HBM and the
  // KV-only tail's pin use the match's common prefix, which another thread's eviction or
  // insert would make stale (tokens neither pinned, loaded nor computed: a node adopting
  // pages nobody wrote, or a finish refused because the tree's KV ends before kv_from).
  std::lock_guard<lock_type> guard(cache_->lock_);
  auto m = cache_->match_locked(prompt, o.salt);
  if (!m) return unexpected(m.info());
  auto refuse = [&](const error_info& e) {
    if (!m->pin.is_null()) cache_->unpin(m->pin);
    return unexpected(e);
  };
  try {
    if (tickets_.free_count() == 0) grow_table();
    if (cache_->pins_.free_count() == 0) cache_->grow_pins();  // the slot pin_kv_tail takes
    detail::reserve_geometric(candidates_, 16);
  } catch (...) {
    (void)refuse(error_info{errc::out_of_capacity});
    throw;
  }
  // The request's state is built in its slot, reusing the vectors of the request that
  // held the slot before: no allocation in steady state.
  const packed_handle h = *tickets_.acquire();
  request_state& s = states_[h.index()];
  s.match = *m;
  s.loaded_at = 0;
  s.kv_from = m->reusable_tokens;
  s.kv_pin = packed_handle{};
  s.extra_skipped = 0;
  if constexpr (lower_tier) {
    try {
      s.host_hit = cache_->store_.lookup(prompt, *m);
    } catch (...) {
      (void)tickets_.release(h);
      (void)refuse(error_info{errc::out_of_capacity});
      throw;
    }
  }
  error_info e = reserve_with_hits(s, prompt, o, accept);
  if (e.code == errc::out_of_capacity) {
    const bool had_holds = s.loaded_at > 0 || !s.kv_pin.is_null();
    release_holds(s);
    s.kv_from = s.match.reusable_tokens;
    e = reserve_reusing_less(s, prompt, o, had_holds);
  }
  if (e.code != errc::ok) {
    release_holds(s);
    if (!s.match.pin.is_null()) cache_->unpin(s.match.pin);
    s.match.pin = packed_handle{};
    (void)tickets_.release(h);
    return unexpected(e);
  }
  if constexpr (lower_tier) {
    if (s.loaded_at > 0) {  // a store whose hits land in the reservation copies them now
      checkpoint_slot* slot = slot_for(s, s.loaded_at);
      HYBRIDCACHE_ASSERT(slot != nullptr && !s.kv.empty());
      cache_->store_.land(s.host_hit, s.kv.front(), s.kv_from, slot->handle);
    }
  }
  overlapped_ = overlapped_ || tickets_.live_count() > 1;  // another request is in flight beside this one
  return request_ticket{h};
}

template <class Cache>
template <class AcceptHit>
error_info
request_lifecycle<Cache>::reserve_with_hits(request_state& s, std::span<const token_id> prompt, const begin_options& o,
                                            AcceptHit& accept) {
  const match_result& m = s.match;
  match_result resume = m;  // where prefill starts: after the HBM hit, or the host hit
  if constexpr (lower_tier) {
    if (s.host_hit.host_tokens > 0) {
      if (take_hit(accept, s.host_hit) && cache_->store_.load(s.host_hit)) {
        s.loaded_at = s.host_hit.reusable_tokens;
        resume.reusable_tokens = s.loaded_at;
      } else {  // declined, no staging room, or a copy failed: go on from the HBM hit
        release_holds(s);
      }
    }
  }
  pin_kv_tail(s, prompt);
  if constexpr (lower_tier) {
    // The hit must bring every token between the tree's KV and the loaded state: a hit
    // whose KV starts beyond the KV the tree holds for this request is given up.
    if (s.loaded_at > 0 && std::min(s.host_hit.kv_first, s.loaded_at) > s.kv_from) {
      release_holds(s);
      s.kv_from = m.reusable_tokens;
      resume.reusable_tokens = m.reusable_tokens;
      pin_kv_tail(s, prompt);
    }
  }
  // A cached sequence this prompt leaves at kv_reach, found below HBM, is the branch point
  // the tree would have split at had it stayed in HBM: the admission policy sees it
  // (insertion_view::lower_branch_point; judicious admission keeps a state there).
  std::int64_t lower_branch = 0;
  if constexpr (lower_tier) lower_branch = s.host_hit.kv_reach;
  side_bytes need;
  if (const error_info e = plan_request(s, prompt, o, resume, lower_branch, need); e.code != errc::ok) return e;
  if (const errc e = reserve(s, need, static_cast<std::int64_t>(s.plan.sites.size())); e != errc::ok) return {e};
  return {};
}

template <class Cache>
error_info
request_lifecycle<Cache>::reserve_reusing_less(request_state& s, std::span<const token_id> prompt,
                                               const begin_options& o, bool had_holds) {
  Cache& c = *cache_;
  side_bytes need;
  const auto sites = [&] { return static_cast<std::int64_t>(s.plan.sites.size()); };
  // The same state without what it held beyond it.
  if (had_holds && s.match.hit()) {
    if (const error_info e = plan_request(s, prompt, o, s.match, 0, need); e.code != errc::ok) return e;
    if (fits(need)) return {reserve(s, need, sites())};
  }
  // Shallower cached states on the path, deepest first, then none (no_node): the deepest
  // that fits, by bisection over the fit check (a shallower state pins less and reserves
  // more; where that is not monotone the bisection may settle for less than the best).
  candidates_.clear();
  if (s.match.node != no_node)
    for (node_id n = c.tree_.at(s.match.node).parent; n != Cache::tree_type::root(); n = c.tree_.at(n).parent)
      if (c.usable(n)) candidates_.push_back(n);  // capacity reserved at begin; grows only with depth
  candidates_.push_back(no_node);
  auto fits_at = [&](std::size_t i) -> error_info {
    c.repin_match(s.match, candidates_[i]);
    s.kv_from = s.match.reusable_tokens;
    if (const error_info e = plan_request(s, prompt, o, s.match, 0, need); e.code != errc::ok) return e;
    return fits(need) ? error_info{} : error_info{errc::out_of_capacity};
  };
  const std::size_t none = candidates_.size() - 1;
  if (error_info e = fits_at(none); e.code != errc::ok) {
    if (e.code != errc::out_of_capacity || e.what != nullptr) return e;
    // No reuse, and the plan an empty cache would make: sites the cache's branch points
    // add (and their split room) are dropped before the request is.
    e = plan_request(s, prompt, o, s.match, 0, need, /*as_empty=*/true);
    if (e.code != errc::ok) return e;
    if (fits(need)) return {reserve(s, need, sites())};
    // Nothing is pinned for this request now: what stands in the way is other requests'
    // pins and reservations, or the request itself.
    const bool alone = tickets_.live_count() == 1 && c.pins_.live_count() == 0;
    if (alone && evict_until_fits_alone(need)) return {reserve(s, need, sites())};
    if (alone) return {errc::out_of_capacity, true, "begin: the request does not fit in this cache even when empty (bytes needed)", need.total()};
    return {errc::out_of_capacity, true, "begin: no room beside the requests in flight; retry when one ends (bytes needed)", need.total()};
  }
  std::size_t lo = 0, hi = none;  // hi fits; find the smallest index that fits
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    const error_info e = fits_at(mid);
    if (e.code == errc::ok) hi = mid;
    else if (e.code == errc::out_of_capacity) lo = mid + 1;
    else return e;
  }
  if (const error_info e = fits_at(hi); e.code != errc::ok) return e;
  return {reserve(s, need, sites())};
}

template <class Cache>
bool
request_lifecycle<Cache>::evict_until_fits_alone(const side_bytes& need) {
  Cache& c = *cache_;
  if constexpr (side_placing_store<store_type>) {
    // Nothing else holds room: every node may go, and the pool may re-split its free chunks
    // as they empty. Evict one victim at a time (letting the store move free chunks to the
    // short side) until the request fits, which an empty cache of this size guarantees.
    if (need.total() > c.store_.capacity_bytes() || !c.store_.placement_fits_when_empty(need)) return false;
    commit_result scratch;
    bool round = false;
    while (!fits(need)) {
      if (!round) {
        round = true;
        c.begin_eviction_round();
      }
      if (c.evict_one(scratch) < 0) return false;
    }
    return true;
  } else {
    (void)need;  // one-sided store: the fit check already counted every evictable node
    return false;
  }
}

template <class Cache>
error_info
request_lifecycle<Cache>::plan_request(request_state& s, std::span<const token_id> prompt, const begin_options& o,
                                       const match_result& resume, std::int64_t lower_branch, side_bytes& need,
                                       bool as_empty) {
  if (const errc e = cache_->plan_into(prompt, resume, o.extra_checkpoints, s.plan, lower_branch, as_empty); e != errc::ok)
    return {e};
  s.extra_skipped = 0;
  for (const std::int64_t p : o.extra_checkpoints) s.extra_skipped += p <= s.plan.prefill_start ? 1 : 0;
  s.prompt_tokens = static_cast<std::int64_t>(prompt.size());
  s.prompt_hash = hash_tokens(prompt);
  s.reserved_tokens = s.prompt_tokens + o.output_tokens - s.kv_from;  // check_begin: no overflow
  if (s.reserved_tokens > max_reservable_tokens())
    return {errc::out_of_capacity, true, "begin: the request's KV alone is larger than the cache (tokens to reserve)",
            s.reserved_tokens};
  const auto sites = static_cast<std::int64_t>(s.plan.sites.size());
  const std::int64_t slots = sites + 1 + (s.loaded_at > 0 ? 1 : 0);
  need = side_bytes{kv_bytes_at(s.kv_from, s.reserved_tokens) + split_room_for(sites) * cache_->store_.kv_bytes(1),
                    slots * cache_->store_.checkpoint_bytes()};
  return {};
}

template <class Cache>
expected<void>
request_lifecycle<Cache>::grow(request_ticket t, std::int64_t tokens) {
  const std::unique_lock<memory_mutex> memory(memory_);
  std::lock_guard<lock_type> guard(cache_->lock_);
  if (const errc e = tickets_.validate(t.handle); e != errc::ok) return ticket_error(e);
  if (tokens <= 0) return unexpected(errc::invalid_argument, "grow: tokens must be > 0", tokens);
  request_state& s = states_[t.handle.index()];
  const std::int64_t first = s.kv_from + s.reserved_tokens;
  if (tokens > std::numeric_limits<std::int64_t>::max() - first)
    return unexpected(errc::invalid_argument, "grow: the reservation's end overflows int64", tokens);
  if (tokens > max_reservable_tokens())
    return unexpected(errc::out_of_capacity, "grow: more KV than the whole cache holds (tokens)", tokens);
  const side_bytes need{kv_bytes_at(first, tokens), 0};
  if (!fits(need))
    return unexpected(errc::out_of_capacity, "grow: no room beside the pinned paths and the reservations (bytes needed)",
                      need.total());
  commit_result scratch;
  bool round = false;
  cache_->evict_until_placeable(need, round, scratch);
  const typename Cache::split_hold hold(*cache_, true);
  auto kv = allocate_evicting([&] { return allocate_kv_at(first, tokens); });
  if (!kv) return unexpected(kv.error());
  s.kv.push_back(std::move(*kv));
  s.kv_tokens.push_back(tokens);
  s.reserved_tokens += tokens;
  // The runtime has written every token before `first` (it grows when it runs out), so
  // the block the new segment shares with the previous one can be copied now: the whole
  // block up to `first`, not only the previous segment's tokens. The block table names
  // the previous segment's page for that block, and that page already holds the block's
  // earlier tokens (cached ones copied at begin, earlier segments' at their grow), which
  // a short segment (or a reservation that starts inside the block) does not own.
  if constexpr (pages_by_position) {
    if (s.kv.size() >= 2 && first % cache_->store_.tokens_per_page() != 0) {
      const std::size_t k = s.kv.size() - 1;
      const std::int64_t prev_first = first - s.kv_tokens[k - 1];
      const std::int64_t lo = first - first % cache_->store_.tokens_per_page();
      cache_->store_.copy_tokens(s.kv[k - 1], prev_first, s.kv[k], first, lo, first);
    }
  }
  return {};
}

template <class Cache>
expected<finish_result>
request_lifecycle<Cache>::finish(request_ticket t, std::span<const token_id> sequence,
    std::span<const std::int64_t> captured) {
  const std::unique_lock<memory_mutex> memory(memory_);
  std::lock_guard<lock_type> guard(cache_->lock_);
  if (const errc e = tickets_.validate(t.handle); e != errc::ok) return ticket_error(e);
  request_state& s = states_[t.handle.index()];
  const auto len = static_cast<std::int64_t>(sequence.size());
  const std::int64_t from = s.match.reusable_tokens;
  if (len < s.prompt_tokens)
    return unexpected(errc::invalid_argument, "finish: the sequence is shorter than the prompt (tokens)", len);
  if (len > s.kv_from + s.reserved_tokens)
    return unexpected(errc::invalid_argument, "finish: the sequence is longer than the reservation; grow first (tokens)", len);
  if (hash_tokens(sequence.first(static_cast<std::size_t>(s.prompt_tokens))) != s.prompt_hash)
    return unexpected(errc::invalid_argument, "finish: the sequence does not start with this request's prompt");
  for (std::size_t i = 0; i < captured.size(); ++i) {
    const std::int64_t p = captured[i];
    if (p <= from || p > len)
      return unexpected(errc::invalid_argument, "finish: a captured position lies outside (reused prefix, |sequence|]", p);
    if (i > 0 && p <= captured[i - 1])
      return unexpected(errc::invalid_argument, "finish: captured positions must ascend", p);
    if (p != len && slot_for(s, p) == nullptr)
      return unexpected(errc::invalid_argument, "finish: a captured position has no reserved slot (not a planned site)", p);
  }
  cache_->salt_ = s.match.salt;
  // Before anything changes (may throw bad_alloc); this request's prefill resumed at
  // prefill_start, a hit a shadow's compares with only while requests have run one at a time.
  cache_->observe(sequence, s.prompt_tokens, overlapped_ ? live_hit_not_comparable : s.plan.prefill_start);
  finish_result out;
  const errc e = adopt(s, sequence, captured, out);
  if constexpr (lower_tier) {
    if (e == errc::ok) {  // names the new path (evicted nodes demote) and adopts the staged pages
      cache_->store_.settle(cache_->tree_, sequence, s.host_hit);
      s.host_hit = {};
      s.loaded_at = 0;
    }
  }
  out.checkpoints_returned = 0;
  for (auto& c : s.checkpoints) out.checkpoints_returned += store_type::holds(c.handle) ? 1 : 0;
  for (std::size_t i = 0; i < s.kv.size(); ++i) out.tokens_returned += s.kv_tokens[i];
  give_back(s, /*release_pin=*/e != errc::ok);
  (void)tickets_.release(t.handle);
  if (e != errc::ok) return unexpected(e, "finish: the store refused a split or a join of the reservation; the request was aborted");
  return out;
}

template <class Cache>
errc
request_lifecycle<Cache>::reserve(request_state& s, const side_bytes& need, std::int64_t sites) {
  if (!fits(need)) return errc::out_of_capacity;
  // Make the room in one eviction round (the reference's rule), then allocate.
  const std::int64_t deficit = cache_->store_.used_bytes() + need.total() - cache_->store_.capacity_bytes();
  commit_result scratch;
  bool round = false;
  if (deficit > 0) {
    round = true;
    cache_->evict_bytes(deficit, scratch);
  }
  cache_->evict_until_placeable(need, round, scratch);
  const typename Cache::split_hold hold(*cache_, true);
  if (s.reserved_tokens > 0) {
    const std::int64_t first = s.kv_from;
    auto kv = allocate_evicting([&] { return allocate_kv_at(first, s.reserved_tokens); });
    if (!kv) return kv.error();
    s.kv.push_back(std::move(*kv));
    s.kv_tokens.push_back(s.reserved_tokens);
    copy_shared_block_from_path(s, first);
  }
  for (std::int64_t i = 0; i <= sites; ++i) {
    auto h = allocate_evicting([&] { return cache_->store_.allocate_checkpoint(); });
    if (!h) {
      give_back(s, /*release_pin=*/false);
      return h.error();
    }
    const std::int64_t p = i < sites ? s.plan.sites[static_cast<std::size_t>(i)].position : 0;
    s.checkpoints.push_back({p, std::move(*h)});
  }
  if (s.loaded_at > 0) {  // the slot `settle` gives the loaded state's pages to
    auto h = allocate_evicting([&] { return cache_->store_.allocate_checkpoint(); });
    if (!h) {
      give_back(s, /*release_pin=*/false);
      return h.error();
    }
    s.checkpoints.push_back({s.loaded_at, std::move(*h)});
  }
  for (std::int64_t i = 0; i < split_room_for(sites); ++i) {
    auto r = allocate_evicting([&] { return cache_->store_.allocate_kv(1); });
    if (!r) {
      give_back(s, /*release_pin=*/false);
      return r.error();
    }
    s.split_room.push_back(std::move(*r));
  }
  return errc::ok;
}

template <class Cache>
errc
request_lifecycle<Cache>::adopt(request_state& s, std::span<const token_id> seq, std::span<const std::int64_t> captured,
    finish_result& out) {
  Cache& c = *cache_;
  const auto len = static_cast<std::int64_t>(seq.size());
  c.salt_ = s.match.salt;
  if (!s.match.pin.is_null()) {
    if (const errc e = c.pins_.validate(s.match.pin); e != errc::ok) return e;
    if (!c.on_path(seq, c.pin_node_[s.match.pin.index()])) return errc::invalid_argument;
  }
  c.reserve_indexes(c.tree_.id_bound() + captured.size() + 4);
  // The cache's one insert path, with exactly the captured positions (and the loaded
  // state) and the reservation as the source of every handle.
  auto place = [&](walk_result& w) -> errc {
    c.positions_.assign(captured.begin(), captured.end());
    if (s.loaded_at > s.match.reusable_tokens && s.loaded_at <= len &&
        !std::binary_search(c.positions_.begin(), c.positions_.end(), s.loaded_at))
      c.positions_.insert(std::upper_bound(c.positions_.begin(), c.positions_.end(), s.loaded_at), s.loaded_at);
    free_split_room(s);  // the splits in the build may take fresh blocks: the room is theirs
    reservation_source src{this, &s, s.kv_from, len};
    return c.allocate_all_from(w, len, src);
  };
  if (const errc e = c.insert_sequence(seq, out.commit, place); e != errc::ok) return e;
  if (!s.match.pin.is_null()) c.unpin(s.match.pin);
  s.match.pin = packed_handle{};
  release_kv_pin(s);
  out.checkpoints_kept = out.commit.checkpoints_admitted;
  return errc::ok;
}

}  // namespace hybridcache::prefix
