// hybridcache/prefix/detail/prefix_cache_insert.hpp
//
// The member functions of `prefix_cache` (prefix/prefix_cache.hpp) that evict and insert:
// eviction until a two-sided store can place a request, one eviction, the one insert path
// of commit and finish, building the nodes, and splitting an edge. Contracts and costs are
// documented at their declarations. Included at the end of the cache's header; not for
// direct use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "hybridcache/prefix/prefix_cache.hpp"

namespace hybridcache::prefix {

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
void
prefix_cache<Model, Admission, Scorer, Store, Lock>::evict_until_placeable(const side_bytes& need, bool& round,
    commit_result& res) noexcept {
  if constexpr (side_placing_store<Store>) {
    while (!store_.placement_fits(need, side_bytes{})) {
      if (!round) {
        round = true;
        begin_eviction_round();
      }
      if (evict_one(res) < 0) return;
    }
  } else {
    (void)need;
    (void)round;
    (void)res;
  }
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
std::int64_t
prefix_cache<Model, Admission, Scorer, Store, Lock>::evict_one(commit_result& res) noexcept {
  const time_point now = clock_.now();
  const node_id v = scorer_.select_victim(tree_, now);
  if (v == no_node) return -1;
  const evict_action act = scorer_.action(tree_, v);
  const std::int64_t actual = apply(v, act, res);
  std::int64_t accounted = actual;
  if constexpr (byte_accounting_scorer<Scorer, radix_tree<Store>>)
    accounted = scorer_.accounted_bytes(tree_, v, act, actual);
  ++res.evictions;
  res.bytes_evicted += actual;
  ++counters_.evictions;
  counters_.bytes_evicted += actual;
  return accounted;
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
template <class Place>
errc
prefix_cache<Model, Admission, Scorer, Store, Lock>::insert_sequence(std::span<const token_id> seq, commit_result& res,
    Place&& place) {
  const auto len = static_cast<std::int64_t>(seq.size());
  res.sequence_tokens = len;
  clock_.tick();                             // the reference's insert()
  const time_point t_match = clock_.tick();  // its inner match_prefix()
  walk_result w = walk(seq);
  scorer_.on_match(tree_, std::span<const node_id>(path_), w.partial, t_match);
  if (const errc e = place(w); e != errc::ok) return e;
  try {
    reserve_indexes(tree_.id_bound() + positions_.size() + 4);
  } catch (...) {
    free_pending();
    throw;
  }
  const time_point now = clock_.now();
  scorer_.on_insert_path(tree_, std::span<const node_id>(path_), now);
  if (const errc e = build(seq, w, len, now, res); e != errc::ok) return e;
  committed_.assign(positions_.begin(), positions_.end());  // within capacity reserved above
  ++counters_.commits;
  counters_.checkpoints_admitted += res.checkpoints_admitted;
  counters_.kv_bytes_admitted += res.kv_bytes_admitted;
  return errc::ok;
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
errc
prefix_cache<Model, Admission, Scorer, Store, Lock>::build(std::span<const token_id> seq, walk_result w,
    std::int64_t len, time_point now, commit_result& res) {
  std::size_t ck = 0, kvi = 0;
  const std::int64_t cp = w.common_prefix;
  // 1. Checkpoints at or before the common prefix (splitting edges where needed).
  for (std::int64_t p : positions_) {
    if (p > cp) break;
    node_id at = node_ending_at(p);
    if (at != no_node && tree_.at(at).has_checkpoint) continue;
    if (at == no_node) {
      at = split_at(seq, p, now);
      if (at == no_node) return abort_build(ck, kvi);
      w = walk(seq);
    }
    tree_.set_checkpoint(at, std::move(pending_ckpt_[ck++]));
    res.checkpoints_admitted += 1;
    res.checkpoint_bytes_admitted += store_.checkpoint_bytes();
    scorer_.on_update(tree_, at);
  }
  if (cp == len) return finish_build(ck, kvi);
  // 2. The attach point: a node ending exactly at cp (split the partial edge if needed).
  node_id parent = cp == 0 ? tree_type::root() : node_ending_at(cp);
  if (parent == no_node) {
    parent = split_at(seq, cp, now);
    if (parent == no_node) return abort_build(ck, kvi);
  }
  // 3. The new chain.
  auto it = std::upper_bound(positions_.begin(), positions_.end(), cp);
  std::int64_t prev = cp;
  while (prev < len) {
    const std::int64_t end = it != positions_.end() ? *it : len;
    const node_id prev_parent = parent;
    parent = tree_.add_leaf(parent, seq.subspan(static_cast<std::size_t>(prev), static_cast<std::size_t>(end - prev)),
                            std::move(pending_kv_[kvi++]), now, salt_);
    res.new_tokens += end - prev;
    res.kv_bytes_admitted += store_.kv_bytes(end - prev);
    if (it != positions_.end()) {
      tree_.set_checkpoint(parent, std::move(pending_ckpt_[ck++]));
      res.checkpoints_admitted += 1;
      res.checkpoint_bytes_admitted += store_.checkpoint_bytes();
      ++it;
    }
    scorer_.on_update(tree_, prev_parent);
    scorer_.on_update(tree_, parent);
    prev = end;
  }
  return finish_build(ck, kvi);
}

template <prefix_cost_model Model, admission_policy Admission, class Scorer, state_store Store, lock_policy Lock>
  requires utility_scorer<Scorer, radix_tree<Store>>
node_id
prefix_cache<Model, Admission, Scorer, Store, Lock>::split_at(std::span<const token_id> seq, std::int64_t p,
    time_point now) {
  const walk_result w = walk(seq.first(static_cast<std::size_t>(p)));
  HYBRIDCACHE_ASSERT(w.partial != no_node);
  const node_id n = w.partial;
  const std::int64_t head = p - tree_.at(n).begin();
  auto head_kv = store_.split_kv(tree_.kv(n), head);
  if (!head_kv) return no_node;
  const node_id parent = tree_.at(n).parent;
  const node_id h = tree_.split(n, head, std::move(*head_kv), now);
  scorer_.on_update(tree_, h);
  scorer_.on_update(tree_, n);
  scorer_.on_update(tree_, parent);
  walk(seq);
  return h;
}

}  // namespace hybridcache::prefix
