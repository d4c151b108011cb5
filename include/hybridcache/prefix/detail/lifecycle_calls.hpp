// hybridcache/prefix/detail/lifecycle_calls.hpp
//
// The member functions of `request_lifecycle` (prefix/lifecycle.hpp) that are too long to
// read inside the class: begin, grow, finish, and the reservation and adoption they run.
// Their contracts and costs are documented at their declarations. Included at the end of
// the lifecycle's header; not for direct use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "hybridcache/prefix/lifecycle.hpp"

namespace hybridcache::prefix {

template <class Cache>
template <class AcceptHit>
expected<request_ticket>
request_lifecycle<Cache>::begin(std::span<const token_id> prompt, const begin_options& o, AcceptHit&& accept) {
  if (prompt.empty() || o.output_tokens < 0) return unexpected(errc::invalid_argument);
  // One critical section from the match to the reservation: the lookup below HBM and the
  // KV-only tail's pin use the match's common prefix, which another thread's eviction or
  // insert would make stale (tokens neither pinned, loaded nor computed: a node adopting
  // pages nobody wrote, or a finish refused because the tree's KV ends before kv_from).
  std::lock_guard<lock_type> guard(cache_->lock_);
  auto m = cache_->match_locked(prompt, o.salt);
  if (!m) return unexpected(m.error());
  auto refuse = [&](errc e) {
    if (!m->pin.is_null()) cache_->unpin(m->pin);
    return unexpected(e);
  };
  try {
    if (tickets_.free_count() == 0) grow_table();
  } catch (...) {
    (void)refuse(errc::out_of_capacity);
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
  match_result resume = *m;  // where prefill starts: after the HBM hit, or the host hit
  try {
    if (cache_->pins_.free_count() == 0) cache_->grow_pins();  // the slot pin_kv_tail takes
    if constexpr (lower_tier_store<store_type>) s.host_hit = cache_->store_.lookup(prompt, *m);
  } catch (...) {
    (void)tickets_.release(h);
    (void)refuse(errc::out_of_capacity);
    throw;
  }
  if constexpr (lower_tier_store<store_type>) {
    if (s.host_hit.host_tokens > 0) {
      if (take_hit(accept, s.host_hit) && cache_->store_.load(s.host_hit)) {
        s.loaded_at = s.host_hit.reusable_tokens;
        resume.reusable_tokens = s.loaded_at;
      } else {  // declined, no staging room, or a copy failed: go on from the HBM hit
        release_holds(s);
      }
    }
  }
  if constexpr (host_tier_store<store_type>) {
    cache_->store_.find_host_hit(prompt, *m, s.host_hit);  // pins the entries it found
    if (s.host_hit.host_tokens > 0 && accept(std::as_const(s.host_hit))) {
      s.loaded_at = s.host_hit.reusable_tokens;
      resume.reusable_tokens = s.loaded_at;
    } else {
      release_holds(s);
    }
  }
  pin_kv_tail(s, prompt);
  if constexpr (host_tier_store<store_type>) {
    // The host entries must bring every token between the tree's KV and the loaded state;
    // a chain that starts beyond the tree's KV is given up.
    if (s.loaded_at > 0 && s.host_hit.kv_start > s.kv_from) {
      release_holds(s);
      s.kv_from = m->reusable_tokens;
      resume.reusable_tokens = m->reusable_tokens;
      pin_kv_tail(s, prompt);
    }
  }
  // A cached sequence this prompt leaves at kv_reach, found below HBM, is the branch point
  // the tree would have split at had it stayed in HBM: the admission policy sees it
  // (insertion_view::lower_branch_point; judicious admission keeps a state there).
  std::int64_t lower_branch = 0;
  if constexpr (requires { s.host_hit.kv_reach; }) lower_branch = s.host_hit.kv_reach;
  if (const errc e = cache_->plan_into(prompt, resume, o.extra_checkpoints, s.plan, lower_branch); e != errc::ok) {
    release_holds(s);
    (void)tickets_.release(h);
    return refuse(e);
  }
  s.prompt_tokens = static_cast<std::int64_t>(prompt.size());
  s.prompt_hash = hash_tokens(prompt);
  s.reserved_tokens = s.prompt_tokens + o.output_tokens - s.kv_from;
  const auto sites = static_cast<std::int64_t>(s.plan.sites.size());
  const std::int64_t slots = sites + 1 + (s.loaded_at > 0 ? 1 : 0);
  const side_bytes need{kv_bytes_at(s.kv_from, s.reserved_tokens) + split_room_for(sites) * cache_->store_.kv_bytes(1),
                        slots * cache_->store_.checkpoint_bytes()};
  if (const errc e = reserve(s, need, sites); e != errc::ok) {
    release_holds(s);
    s.match.pin = packed_handle{};
    (void)tickets_.release(h);
    return refuse(e);
  }
  if constexpr (host_tier_store<store_type>) {
    if (s.loaded_at > 0) {  // the host entries' KV into the reservation, their state into its slot
      checkpoint_slot* slot = slot_for(s, s.loaded_at);
      HYBRIDCACHE_ASSERT(slot != nullptr && !s.kv.empty());
      cache_->store_.load_host_hit(s.host_hit, s.kv.front(), s.kv_from, s.kv_from, s.loaded_at, slot->handle);
    }
  }
  return request_ticket{h};
}

template <class Cache>
expected<void>
request_lifecycle<Cache>::grow(request_ticket t, std::int64_t tokens) {
  std::lock_guard<lock_type> guard(cache_->lock_);
  if (const errc e = tickets_.validate(t.handle); e != errc::ok) return unexpected(e);
  if (tokens <= 0) return unexpected(errc::invalid_argument);
  request_state& s = states_[t.handle.index()];
  const std::int64_t first = s.kv_from + s.reserved_tokens;
  const side_bytes need{kv_bytes_at(first, tokens), 0};
  cache_->prepare_placement(need);
  if (!cache_->fits_after_eviction(need, nullptr)) return unexpected(errc::out_of_capacity);
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
  std::lock_guard<lock_type> guard(cache_->lock_);
  if (const errc e = tickets_.validate(t.handle); e != errc::ok) return unexpected(e);
  request_state& s = states_[t.handle.index()];
  const auto len = static_cast<std::int64_t>(sequence.size());
  const std::int64_t from = s.match.reusable_tokens;
  if (len < s.prompt_tokens || len > s.kv_from + s.reserved_tokens) return unexpected(errc::invalid_argument);
  if (hash_tokens(sequence.first(static_cast<std::size_t>(s.prompt_tokens))) != s.prompt_hash)
    return unexpected(errc::invalid_argument);  // not this request's prompt
  for (std::size_t i = 0; i < captured.size(); ++i) {
    const std::int64_t p = captured[i];
    if (p <= from || p > len || (i > 0 && p <= captured[i - 1])) return unexpected(errc::invalid_argument);
    if (p != len && slot_for(s, p) == nullptr) return unexpected(errc::invalid_argument);
  }
  cache_->salt_ = s.match.salt;
  cache_->observe(sequence, s.prompt_tokens);  // before anything changes (may throw bad_alloc)
  finish_result out;
  const errc e = adopt(s, sequence, captured, out);
  if constexpr (requires { cache_->store_.settle(cache_->tree_, sequence, s.host_hit); }) {
    if (e == errc::ok) {  // names the new path (evicted nodes demote) and adopts the staged pages
      cache_->store_.settle(cache_->tree_, sequence, s.host_hit);
      s.host_hit = {};
      s.loaded_at = 0;
    }
  }
  out.checkpoints_returned = 0;
  for (auto& c : s.checkpoints) out.checkpoints_returned += holds(c.handle) ? 1 : 0;
  for (std::size_t i = 0; i < s.kv.size(); ++i) out.tokens_returned += s.kv_tokens[i];
  give_back(s, /*release_pin=*/e != errc::ok);
  (void)tickets_.release(t.handle);
  if (e != errc::ok) return unexpected(e);
  return out;
}

template <class Cache>
errc
request_lifecycle<Cache>::reserve(request_state& s, const side_bytes& need, std::int64_t sites) {
  cache_->prepare_placement(need);
  if (!cache_->fits_after_eviction(need, nullptr)) return errc::out_of_capacity;
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
