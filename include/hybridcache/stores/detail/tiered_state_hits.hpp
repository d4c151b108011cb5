// hybridcache/stores/detail/tiered_state_hits.hpp
//
// The hit path of `tiered_state_store` (stores/tiered_state_store.hpp): lookup below HBM
// (the chain of entries a prompt reuses, pinned), settle (adopt, name, promote,
// write-through) and release. Loading a hit into the staging room is
// tiered_state_loads.hpp. Included at the end of the store's header; not for direct use.
#pragma once

#include <algorithm>
#include <array>
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
  h.kv_first = h.kv_reach = m.common_prefix;
  h.salt = m.salt;
  if (kv_keys_.empty() && ckpt_keys_.empty()) return h;
  poll();  // write-backs that landed free their HBM copies: the hit reads below
  const auto n = static_cast<std::int64_t>(input.size());
  entry_id ckpt = no_entry;
  const std::int64_t best = scan(input, m, ckpt);
  h.kv_reach = kv_reach_;
  if (best == m.reusable_tokens) return h;
  outstanding_hit& slot = acquire_hit();  // may throw: nothing pinned yet
  slot.covered = h.kv_first = std::min(m.common_prefix, n);
  slot.best = best;
  // Pins the copy it will read (the fastest valid one), in that tier; false if none is.
  auto pin = [&](entry_id id, std::int64_t reach) -> const detail::pinned_source* {
    const auto t = store_->pin(id);
    if (!t) return nullptr;
    slot.pinned.push_back({id, *t, reach});  // capacity reserved by acquire_hit
    meta_.at(id).holds += 1;
    return &slot.pinned.back();
  };
  tier_id ckpt_tier = hbm_tier;
  if (ckpt != no_entry) {  // (a model without recurrent layers has none)
    const detail::pinned_source* cp = pin(ckpt, best);
    if (cp == nullptr) {
      hits_.release(slot);
      return h;
    }
    ckpt_tier = cp->tier;
    if (cp->tier != hbm_tier) {
      h.bytes_to_load += stored_of(*cp);
      h.source_tier = std::max(h.source_tier, cp->tier);
    }
  }
  // The tokens before the KV entries (their KV in HBM) come with the checkpoint.
  if (const std::int64_t head = std::min(slot.covered, best) - m.reusable_tokens; head > 0) {
    h.tier_tokens[tiered_hit::slot_of(ckpt_tier)] += head;
    h.end_tier = ckpt_tier;
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
                          h.tier_tokens[tiered_hit::slot_of(t)] += upto - covered;
                          h.end_tier = t;
                        });
  if (!whole) {  // a hole in the hit: give it up, pins and all (nothing was counted yet)
    h.bytes_to_load = 0;
    h.source_tier = hbm_tier;
    h.kv_entries = 0;
    h.tier_tokens = {};
    h.end_tier = hbm_tier;
    release_holds(slot);
    return h;
  }
  h.reusable_tokens = best;
  h.host_tokens = best - m.reusable_tokens;
  HYBRIDCACHE_ASSERT(tier_token_sum(h) == h.host_tokens);
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
  // Per tier as lookup splits it (a shortened hit has no checkpoint: the tokens before the
  // KV entries are HBM's).
  std::array<std::int64_t, max_hit_tiers> by_tier{};
  tier_id end = hbm_tier;
  if (const std::int64_t head = std::min(covered, tokens) - hit.hbm_tokens; head > 0) by_tier[0] += head;
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
    by_tier[tiered_hit::slot_of(src.tier)] += upto - covered;
    end = src.tier;
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
  hit.tier_tokens = by_tier;
  hit.end_tier = end;
  HYBRIDCACHE_ASSERT(tier_token_sum(hit) == hit.host_tokens);
  return {};
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

#include "hybridcache/stores/detail/tiered_state_loads.hpp"  // IWYU pragma: keep
