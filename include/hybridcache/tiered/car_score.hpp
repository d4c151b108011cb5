// hybridcache/tiered/car_score.hpp
//
// CaR's score-based replacement (papers/003 §III-B3), driven by the scheduler's events.
//
// The paper keeps a Score per KV node in its cache table: +1 when a request that uses the
// node enters the shuffled window, +1 when the request is sent to the GPU, −2 when its
// generation completes; the HBM node with the smallest Score is evicted (offloaded) first.
// The three deltas sum to zero, so a node's score is
//     enter_window × (requests in the window, not yet sent, that use it)
//   + dispatch     × (requests sent to the GPU whose generation has not completed)
// and every idle node scores 0: the rule protects what the queue is about to reuse and what
// is being generated from, and falls back to a tie-break among the rest.
//
// Two pieces, both indexed by the prefix cache's `node_id`:
//   car_score_board  the Score column and its O(log n) min index, plus a per-request ledger
//                    of the credits each request gave (`enter_window`, `dispatch`, and
//                    `adopt` for the nodes its own KV makes while it generates: they get both
//                    credits, so every node a generating request holds scores alike), which
//                    `complete` withdraws. The paper's −2 is "withdraw both +1s": a node the
//                    request credited twice gets −2; one whose identity changed in between
//                    (evicted, or a node that did not exist yet at window entry) gets back
//                    exactly what it was given, so no residue outlives a request. A node that
//                    is erased forgets its score; its id's generation moves on, so a later
//                    withdrawal aimed at the old node never touches a node that reuses the id.
//   car_scorer       a `utility_scorer` model: a non-owning view of a board (the board is
//                    owned by whoever drives the events: a runtime's scheduler, or the replay).
//                    Candidates: unpinned leaves (as SGLang+). Victim: the smallest
//                    (score, last access, node id): smallest score first, then least recently
//                    used, then the lower node id, so equal inputs give equal victims.
//                    Refresh: a match stamps the whole matched path (LRU's rule, used only to
//                    break ties). Action: remove the leaf.
//
//   mirror_score     copies a node's board score onto its KV and checkpoint entries in a
//                    tiered store (`set_score`), whose `car_score_demotion` orders the tiers
//                    *below* HBM and the watermark cleaner: the board orders the prefix
//                    cache's HBM victims, the mirror the rest (docs/tiered.md, "CaR's score").
//
// Costs (n indexed nodes, p nodes on a request's path, c credits a request holds):
//   add / index / unindex / forget   O(log n), noexcept, no allocation
//   top, score                       O(1)
//   enter_window / dispatch          O(p log n); the ledger allocates when it grows (a slot
//                                    per request in flight, reused after `complete`)
//   adopt                            O(p · c + p log n) (each node looked up in the request's
//                                    credits), allocates as the ledger does
//   complete                         O(c log n), noexcept
//   reserve(ids)                     O(ids), allocates (the prefix cache calls it before it
//                                    creates nodes, so the scorer's noexcept hooks never do)
//   car_scorer: on_match O(p log n), on_update / on_erase O(log n), select_victim O(1).
//   mirror_score                     two store look-ups and re-sorts, O(log n), no allocation.
// Not thread-safe: call under the cache's lock (as every scorer is).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/concepts/utility_scorer.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/indexed_heap.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"

namespace hybridcache::tiered {

static_assert(car_score::enter_window + car_score::dispatch + car_score::complete == 0.0,
              "CaR's deltas cancel: a completed request leaves no score behind");

/// The weights of CaR's events. Defaults are the paper's (+1, +1; completion withdraws both).
struct car_score_config {
  double enter_window = car_score::enter_window;  ///< a request using the node enters the window
  double dispatch = car_score::dispatch;          ///< the request is sent to the GPU

  /// @throws invalid_argument unless both weights are finite and >= 0.
  void validate() const {
    HYBRIDCACHE_EXPECTS(std::isfinite(enter_window) && enter_window >= 0.0, invalid_argument,
                        "car_score_config: enter_window must be finite and >= 0");
    HYBRIDCACHE_EXPECTS(std::isfinite(dispatch) && dispatch >= 0.0, invalid_argument,
                        "car_score_config: dispatch must be finite and >= 0");
  }
};

/// CaR's Score per HBM node, its min index over the eviction candidates, and the ledger of
/// the credits each request in flight gave. See the file comment for the rules and costs.
class car_score_board {
  // The candidate heap's steps (core/indexed_heap.hpp) over heap_ and the slots' positions;
  // first in the class so that its deduced type is known where the members below use it.
  [[nodiscard]] auto heap() noexcept {
    return ::hybridcache::detail::indexed_heap_ops{heap_, [this](node_id n) -> std::uint32_t& { return node_[n].pos; },
                                                   [this](node_id a, node_id b) { return less(a, b); }};
  }

 public:
  using request_id = std::uint64_t;

  /// @throws invalid_argument for a bad config.
  explicit car_score_board(car_score_config cfg = {}) : cfg_(cfg) { cfg_.validate(); }

  /// Grows the per-node arrays to cover node ids < `ids`. Allocates.
  void reserve(std::size_t ids) {
    if (node_.size() < ids) {
      node_.reserve(std::max(ids, 2 * node_.size()));
      node_.resize(ids);
    }
    if (heap_.capacity() < ids) heap_.reserve(std::max(ids, 2 * heap_.capacity()));
  }

  // --- The Score column --------------------------------------------------------------

  /// Node `n`'s score (0 for a node never credited). O(1).
  [[nodiscard]] double score(node_id n) const noexcept { return n < node_.size() ? node_[n].score : 0.0; }
  /// Adds `delta` to `n`'s score and re-sorts it if it is a candidate. O(log n).
  /// Precondition: reserve() covered n.
  void add(node_id n, double delta) noexcept {
    node_[n].score += delta;
    if (node_[n].pos != absent) resift(node_[n].pos);
  }
  /// Makes `n` an eviction candidate with last access `last_access`, or re-sorts it. O(log n).
  void index(node_id n, std::uint64_t last_access) noexcept {
    slot& s = node_[n];
    s.access = last_access;
    if (s.pos == absent) {
      s.pos = static_cast<std::uint32_t>(heap_.size());
      heap_.push_back(n);  // capacity reserved
    }
    resift(s.pos);
  }
  /// `n` is no longer a candidate (it keeps its score). O(log n).
  void unindex(node_id n) noexcept {
    if (n >= node_.size() || node_[n].pos == absent) return;
    heap().erase(n, absent);
  }
  /// `n` is being freed: unindexed, score 0, and credits aimed at it are void. O(log n).
  void forget(node_id n) noexcept {
    if (n >= node_.size()) return;
    unindex(n);
    node_[n].score = 0.0;
    ++node_[n].generation;
  }
  /// The candidate with the smallest (score, last access, node id), or no_node. O(1).
  [[nodiscard]] node_id top() const noexcept { return heap_.empty() ? no_node : heap_.front(); }
  /// Candidates indexed. O(1).
  [[nodiscard]] std::size_t candidates() const noexcept { return heap_.size(); }

  // --- The scheduler's events ----------------------------------------------------------

  /// Request `r` entered the shuffled window; `path` holds the nodes it will reuse. Each
  /// gets `enter_window`. O(|path| log n). Allocates when the ledger grows.
  void enter_window(request_id r, std::span<const node_id> path) { credit(r, path, cfg_.enter_window); }
  /// Request `r` was sent to the GPU; `path` holds the nodes it reuses now. Each gets
  /// `dispatch`. O(|path| log n). Allocates when the ledger grows.
  void dispatch(request_id r, std::span<const node_id> path) { credit(r, path, cfg_.dispatch); }
  /// Request `r`'s own KV entered the cache while it generates (its prefill's insert):
  /// the nodes of `path` it has given nothing yet get `enter_window + dispatch`, as if they
  /// had been there at both events, so its completion returns them to where they were.
  /// O(|path| · credits + |path| log n). Allocates when the ledger grows.
  void adopt(request_id r, std::span<const node_id> path) {
    fresh_.clear();
    const auto it = ledger_.find(r);
    for (const node_id n : path) {
      bool given = false;
      if (it != ledger_.end())
        for (const credit_entry& c : slots_[it->second])
          if (c.node == n && c.generation == node_[n].generation) {
            given = true;
            break;
          }
      if (!given) fresh_.push_back(n);
    }
    credit(r, fresh_, cfg_.enter_window + cfg_.dispatch);
  }
  /// Request `r`'s generation completed: every credit it gave is withdrawn from the nodes
  /// still alive (the paper's −2 for a node credited at both events). No-op for a request
  /// with no credits. O(credits · log n), no allocation.
  void complete(request_id r) noexcept {
    complete(r, [](node_id, double) noexcept {});
  }
  /// `complete`, calling `changed(node, new score)` after each withdrawal (what a mirror of
  /// the scores copies: `mirror_score`). `changed` must not throw. Same costs, plus its calls.
  template <class F>
    requires std::is_nothrow_invocable_v<F&, node_id, double>
  void complete(request_id r, F&& changed) noexcept {
    const auto it = ledger_.find(r);
    if (it == ledger_.end()) return;
    auto& credits = slots_[it->second];
    for (const credit_entry& c : credits)
      if (c.node < node_.size() && node_[c.node].generation == c.generation) {
        add(c.node, -c.amount);
        changed(c.node, node_[c.node].score);
      }
    credits.clear();  // keeps its capacity for the next request
    free_slots_.push_back(it->second);  // capacity reserved when the slot was made
    ledger_.erase(it);
  }
  /// Requests holding credits (entered the window, not yet completed). O(1).
  [[nodiscard]] std::size_t requests_in_flight() const noexcept { return ledger_.size(); }
  [[nodiscard]] const car_score_config& config() const noexcept { return cfg_; }

 private:
  static constexpr std::uint32_t absent = std::numeric_limits<std::uint32_t>::max();
  struct slot {
    double score = 0.0;
    std::uint64_t access = 0;
    std::uint32_t generation = 0;
    std::uint32_t pos = absent;
  };
  struct credit_entry {
    node_id node;
    std::uint32_t generation;
    double amount;
  };

  void credit(request_id r, std::span<const node_id> path, double amount) {
    if (path.empty()) return;
    auto it = ledger_.find(r);
    if (it == ledger_.end()) {
      std::uint32_t s;
      if (!free_slots_.empty()) {
        s = free_slots_.back();
        free_slots_.pop_back();
      } else {
        s = static_cast<std::uint32_t>(slots_.size());
        slots_.emplace_back();
        free_slots_.reserve(slots_.size());  // complete() never allocates
      }
      it = ledger_.emplace(r, s).first;
    }
    auto& credits = slots_[it->second];
    credits.reserve(credits.size() + path.size());  // strong guarantee: nothing changes on bad_alloc
    for (const node_id n : path) {
      credits.push_back({n, node_[n].generation, amount});
      add(n, amount);
    }
  }

  [[nodiscard]] bool less(node_id a, node_id b) const noexcept {
    const slot &x = node_[a], &y = node_[b];
    if (x.score != y.score) return x.score < y.score;
    if (x.access != y.access) return x.access < y.access;
    return a < b;
  }
  void resift(std::uint32_t i) noexcept { heap().resift(i); }

  car_score_config cfg_;
  std::vector<slot> node_;
  std::vector<node_id> heap_;
  std::unordered_map<request_id, std::uint32_t> ledger_;  // request -> its slot of credits
  std::vector<std::vector<credit_entry>> slots_;
  std::vector<std::uint32_t> free_slots_;
  std::vector<node_id> fresh_;  // adopt's scratch
};

/// CaR's HBM eviction as a `utility_scorer`: a view of a `car_score_board` (not owned; it
/// must outlive the scorer and every copy of it). See the file comment.
class car_scorer {
 public:
  explicit car_scorer(car_score_board& board) noexcept : board_(&board) {}

  /// The board the scheduler's events go to (a view: the board is not part of the scorer's
  /// constness, as a span's elements are not).
  [[nodiscard]] car_score_board& board() const noexcept { return *board_; }

  void reserve(std::size_t ids) { board_->reserve(ids); }

  template <class Tree>
  void on_match(Tree& tree, std::span<const node_id> path, node_id partial, time_point now) noexcept {
    for (const node_id n : path) stamp(tree, n, now);
    if (partial != no_node) stamp(tree, partial, now);
  }
  template <class Tree>
  void on_insert_path(Tree& tree, std::span<const node_id> path, time_point now) noexcept {
    for (const node_id n : path) stamp(tree, n, now);
  }
  template <class Tree>
  void on_update(const Tree& tree, node_id n) noexcept {
    if (n == Tree::root()) return;
    const auto& nd = tree.at(n);
    if (nd.live && nd.children == 0 && nd.pins == 0) board_->index(n, tree.last_access(n));
    else board_->unindex(n);
  }
  template <class Tree>
  void on_erase(const Tree&, node_id n) noexcept {
    board_->forget(n);
  }
  template <class Tree>
  [[nodiscard]] node_id select_victim(const Tree&, time_point) const noexcept {
    return board_->top();
  }
  template <class Tree>
  [[nodiscard]] evict_action action(const Tree&, node_id) const noexcept {
    return evict_action::remove_leaf;
  }
  [[nodiscard]] double alpha() const noexcept { return 0.0; }

 private:
  template <class Tree>
  void stamp(Tree& tree, node_id n, time_point now) noexcept {
    tree.touch(n, now);
    on_update(tree, n);
  }

  car_score_board* board_;
};

/// Copies the board's score of node `n` onto its entries in a tiered store: its KV extent's
/// and, when it holds one, its checkpoint's (`store.set_score(entry_id, double)`, as
/// `stores::tiered_state_store` offers), so that the store's `car_score_demotion` order (the
/// tiers below HBM and the watermark cleaner's walk of HBM) follows the scores that pick the
/// HBM victims. Call it for every node an event changed: the path given to `enter_window`,
/// `dispatch` and `adopt` (the whole path for adopt: a checkpoint the insert just added to an
/// older node gets its score too), and each node `complete(r, changed)` reports. The store
/// keeps the mirror right across the tree's own edits (an evicted node's entries go back to
/// 0, a split's head starts at 0, a join keeps the staying node's), so these calls are all a
/// runtime makes. A node without an entry (zero-byte KV) is skipped; an entry the store
/// refuses is left as it is. O(log n) per entry, no allocation.
template <class Tree, class Store>
void mirror_score(const car_score_board& board, const Tree& tree, Store& store, node_id n) noexcept {
  const auto& nd = tree.at(n);
  const double s = board.score(n);
  if (nd.kv.id != no_entry) (void)store.set_score(nd.kv.id, s);
  if (nd.has_checkpoint && nd.checkpoint.id != no_entry) (void)store.set_score(nd.checkpoint.id, s);
}
/// `mirror_score` for each node of `path`.
template <class Tree, class Store>
void mirror_scores(const car_score_board& board, const Tree& tree, Store& store, std::span<const node_id> path) noexcept {
  for (const node_id n : path) mirror_score(board, tree, store, n);
}

namespace detail {
/// The least a tree offers a scorer (the real one is prefix::radix_tree, which tiered/ does
/// not include): enough to check the concept here.
struct scorer_tree_archetype {
  struct node {
    bool live = false;
    std::uint32_t children = 0, pins = 0;
  };
  static constexpr node_id root() noexcept { return 0; }
  const node& at(node_id) const noexcept;
  void touch(node_id, time_point) noexcept;
  time_point last_access(node_id) const noexcept;
};
}  // namespace detail

static_assert(utility_scorer<car_scorer, detail::scorer_tree_archetype>);
static_assert(reservable_scorer<car_scorer> && !inner_node_evicting_scorer<car_scorer> &&
              !alpha_settable_scorer<car_scorer> && !replicable_scorer<car_scorer>);

}  // namespace hybridcache::tiered
