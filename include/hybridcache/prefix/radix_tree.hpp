// hybridcache/prefix/radix_tree.hpp
//
// `radix_tree<Store>`: the token radix tree under `prefix_cache`.
//
// Each node holds the tokens of the edge from its parent (stored contiguously in one
// vector, not one node per token), the KV extent of those tokens (a `Store::kv_extent`),
// an optional SSM checkpoint (the state after the edge's last token), its last-access
// time, a pin count and links to its parent, its first/last child and its siblings.
// Children keep insertion order (a node that replaces another keeps its position, like a
// Python dict key re-assignment), which is the DFS preorder eviction tie-breaks use.
// Child lookup by first token goes through one flat open-addressing table keyed by
// (parent, first token) shared by the whole tree, so nodes carry no per-node map.
//
// Namespaces (cache salts, types.hpp). Every node belongs to one namespace, inherited from
// its parent; the root's children are keyed by (namespace, first token) instead of (root,
// first token), so a walk in one namespace never enters another's subtree, while eviction,
// DFS order and every scorer see one tree. Namespace 0 is the shared one (no salt); a salted
// namespace gets a dense id when its first node is added and gives it up when its last
// top-level node goes.
//
// Costs (n = live nodes, e = edge length, d = depth):
//   child(parent, token)        O(1) average
//   namespace_of(salt)          O(1) average (a hash lookup for a salt; 0 for none)
//   walk(seq, path, ns)         O(|common prefix| + nodes on the path); allocation-free
//                               (the caller's path vector keeps its capacity)
//   add_leaf(parent, tokens)    O(e) (copies the tokens; reuses a freed slot's short buffer; the
//                               first node of a new salt allocates its namespace entry)
//   split(n, head)              O(e) (the head and the tail each get a buffer of their size)
//   merge_into_child(n)         O(e_n + e_child) (the joined edge gets a buffer of its size)
//   remove_leaf(n)              O(1)
//   touch / pin / unpin         O(1)
//   bytes()                     O(1): the byte measure of every node (kept by each edit)
//   dfs_before(a, b)            O(d)
//   preorder(f)                 O(n) (naive scorers and tests only)
//   memory_bytes()              O(id bound): every slot's token buffer is counted
//
// The tree does not own the store: it moves handles in and out and the cache frees them.
// Not thread-safe (the cache's lock policy serialises access).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hybridcache/core/config.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/concepts/ids.hpp"
#include "hybridcache/prefix/detail/memory_bytes.hpp"
#include "hybridcache/prefix/types.hpp"

namespace hybridcache::prefix {

namespace detail {

/// Flat open-addressing map (parent, first token) -> child, linear probing, backward-shift
/// erase, power-of-two capacity grown at 1/2 load. find/insert/erase O(1) average;
/// allocates only when it grows.
class child_table {
 public:
  // 16 slots: an empty tree's table is 256 B (the adaptive selector builds six metadata-only
  // caches per live one, and sampled, most stay small); it doubles as it fills.
  child_table() { rehash(16); }

  [[nodiscard]] static std::uint64_t key(node_id parent, token_id first) noexcept {
    return (static_cast<std::uint64_t>(parent) << 32) | static_cast<std::uint32_t>(first);
  }
  /// The key of a top-level node of salted namespace `ns` (> 0): node ids stay below 2^31
  /// (radix_tree::acquire checks), so setting bit 63 can never equal a (parent, token) key.
  [[nodiscard]] static std::uint64_t namespace_key(std::uint32_t ns, token_id first) noexcept {
    return ((static_cast<std::uint64_t>(ns) | 0x80000000ull) << 32) | static_cast<std::uint32_t>(first);
  }

  [[nodiscard]] node_id find(std::uint64_t k) const noexcept {
    std::size_t i = slot(k);
    while (true) {
      const entry& e = table_[i];
      if (e.k == k) return e.v;
      if (e.k == empty_key) return no_node;
      i = (i + 1) & mask_;
    }
  }

  /// Inserts or overwrites. Overwriting never allocates; inserting may grow the table.
  void put(std::uint64_t k, node_id v) {
    std::size_t i = slot(k);
    while (table_[i].k != empty_key) {
      if (table_[i].k == k) {
        table_[i].v = v;
        return;
      }
      i = (i + 1) & mask_;
    }
    if ((size_ + 1) * 2 > table_.size()) {
      rehash(table_.size() * 2);
      i = slot(k);
      while (table_[i].k != empty_key) i = (i + 1) & mask_;
    }
    table_[i] = entry{k, v};
    ++size_;
  }

  /// Grows now if `extra` insertions would grow the table, so that they cannot throw.
  void reserve_extra(std::size_t extra) {
    if ((size_ + extra) * 2 > table_.size()) {
      std::size_t cap = table_.size();
      while ((size_ + extra) * 2 > cap) cap *= 2;
      rehash(cap);
    }
  }

  void erase(std::uint64_t k) noexcept {
    std::size_t i = slot(k);
    while (table_[i].k != k) {
      if (table_[i].k == empty_key) return;
      i = (i + 1) & mask_;
    }
    // Backward-shift deletion keeps probe chains intact without tombstones.
    std::size_t j = i;
    while (true) {
      j = (j + 1) & mask_;
      if (table_[j].k == empty_key) break;
      const std::size_t home = slot(table_[j].k);
      // Move j into the hole at i when its home is not cyclically in (i, j].
      const bool between = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
      if (!between) {
        table_[i] = table_[j];
        i = j;
      }
    }
    table_[i] = entry{};
    --size_;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// The table's heap bytes (its slots). O(1).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept { return heap_bytes(table_); }

 private:
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};
  struct entry {
    std::uint64_t k = empty_key;
    node_id v = no_node;
  };

  [[nodiscard]] std::size_t slot(std::uint64_t k) const noexcept {
    std::uint64_t z = k + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<std::size_t>(z ^ (z >> 31)) & mask_;
  }

  void rehash(std::size_t cap) {
    std::vector<entry> old = std::move(table_);
    table_.assign(cap, entry{});
    mask_ = cap - 1;
    size_ = 0;
    for (const entry& e : old)
      if (e.k != empty_key) put(e.k, e.v);
  }

  std::vector<entry> table_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace detail

/// Result of `radix_tree::walk`: how far a sequence follows the cached tokens.
struct walk_result {
  std::int64_t common_prefix = 0;  ///< tokens matched, ignoring node boundaries
  node_id partial = no_node;       ///< child whose edge matched only in part (the split point), or no_node
  std::int64_t partial_len = 0;    ///< tokens of `partial`'s edge that matched (0 < . < edge)
};

/// A namespace of the tree (see radix_tree's file comment): 0 is the shared one.
using namespace_id = std::uint32_t;
/// The namespace of a salt that has no node: a walk in it matches nothing.
inline constexpr namespace_id absent_namespace = 0x7fffffffu;

/// Radix tree over token ids whose nodes own a KV extent and an optional SSM checkpoint
/// of `Store`. See the file comment for costs.
template <state_store Store>
class radix_tree {
 public:
  using kv_extent = typename Store::kv_extent;
  using checkpoint_handle = typename Store::checkpoint_handle;

  /// One node. Read through `at(id)`; mutate only through the tree's operations.
  struct node {
    std::vector<token_id> tokens;  ///< the edge's tokens (empty for the root)
    kv_extent kv{};                ///< KV of the edge's tokens
    checkpoint_handle checkpoint{};
    bool has_checkpoint = false;   ///< state after the edge's last token is cached
    bool live = false;
    std::uint32_t children = 0;
    std::uint32_t pins = 0;
    node_id parent = no_node;
    node_id first_child = no_node, last_child = no_node;
    node_id prev_sibling = no_node, next_sibling = no_node;
    std::int64_t end = 0;          ///< tokens from the root through this edge
    time_point last_access = 0;
    std::uint64_t order = 0;       ///< position among siblings (insertion order)
    namespace_id ns = 0;           ///< the namespace (cache salt) the node belongs to
    bool branched = false;         ///< has had two children or more: a shared prefix's branch point

    [[nodiscard]] std::int64_t edge() const noexcept { return static_cast<std::int64_t>(tokens.size()); }
    [[nodiscard]] std::int64_t begin() const noexcept { return end - edge(); }
  };

  radix_tree() {
    nodes_.emplace_back();
    nodes_[0].live = true;
  }

  [[nodiscard]] static constexpr node_id root() noexcept { return 0; }
  [[nodiscard]] const node& at(node_id n) const noexcept { return nodes_[n]; }
  /// Live nodes, root excluded. O(1).
  [[nodiscard]] std::size_t size() const noexcept { return live_ - 1; }
  /// One past the largest node id ever issued (scorers size their per-node arrays by it).
  [[nodiscard]] std::size_t id_bound() const noexcept { return nodes_.size(); }
  [[nodiscard]] bool live(node_id n) const noexcept { return n < nodes_.size() && nodes_[n].live; }

  /// The child of `parent` whose edge starts with `first`, or no_node; under the root, the
  /// one of namespace `ns` (absent_namespace is never issued, so its keys find nothing).
  /// O(1) average.
  [[nodiscard]] node_id child(node_id parent, token_id first, namespace_id ns = 0) const noexcept {
    return map_.find(child_key(parent, ns, first));
  }

  /// The namespace of `salt`: 0 for none, its id when it has nodes, else absent_namespace.
  /// O(1) average.
  [[nodiscard]] namespace_id namespace_of(const cache_salt& salt) const noexcept {
    if (!salt) return 0;
    const auto it = salts_.find(*salt);
    return it == salts_.end() ? absent_namespace : it->second.ns;
  }
  /// The salt of namespace `ns` (none for the shared namespace 0). O(1).
  [[nodiscard]] cache_salt salt_of(namespace_id ns) const noexcept {
    if (ns == 0 || ns >= ns_salt_.size()) return std::nullopt;
    return ns_salt_[ns];
  }
  /// Salted namespaces that hold nodes. O(1).
  [[nodiscard]] std::size_t salted_namespaces() const noexcept { return salts_.size(); }

  /// How the tree weighs its nodes in `bytes()`: `kv(context, tokens)` is the bytes of an
  /// edge's KV (a store's `kv_bytes`), `checkpoint` those of one checkpoint. Set once,
  /// while the tree is empty (the cache does it in its constructor). `kv` must not throw.
  void set_byte_measure(const void* context, std::int64_t (*kv)(const void*, std::int64_t),
                        std::int64_t checkpoint) noexcept {
    HYBRIDCACHE_ASSERT(size() == 0);
    measure_ = {context, kv, checkpoint};
  }
  /// The sum over live nodes of their edge's KV bytes and, if held, one checkpoint's bytes,
  /// under the measure set above (0 without one). Kept exactly by every edit. O(1).
  [[nodiscard]] std::int64_t bytes() const noexcept { return bytes_; }
  /// The checkpoints' share of `bytes()`. O(1).
  [[nodiscard]] std::int64_t checkpoint_bytes() const noexcept { return checkpoint_bytes_; }
  /// Counts the edits that can change what `walk` returns (add_leaf, split, remove_leaf,
  /// merge_into_child): equal counts mean equal walks of the same tokens, so a caller may
  /// reuse a walk it made (prefix_cache does, within one commit). O(1).
  [[nodiscard]] std::uint64_t edits() const noexcept { return edits_; }

  /// Follows `seq` from the root, in namespace `ns`. `path` receives the fully matched
  /// nodes (root excluded), in order. O(|common prefix| + |path|); no allocation once `path`
  /// has grown.
  walk_result walk(std::span<const token_id> seq, std::vector<node_id>& path, namespace_id ns = 0) const noexcept {
    path.clear();
    walk_result r;
    node_id cur = root();
    std::size_t pos = 0;
    while (pos < seq.size()) {
      const node_id c = child(cur, seq[pos], ns);
      if (c == no_node) break;
      const node& cn = nodes_[c];
      const std::size_t e = cn.tokens.size();
      const std::size_t avail = seq.size() - pos;
      const std::size_t n = std::min(e, avail);
      const std::size_t m = common_length(cn.tokens.data(), seq.data() + pos, n);
      if (m == e) {
        path.push_back(c);
        pos += e;
        cur = c;
        continue;
      }
      r.partial = c;
      r.partial_len = static_cast<std::int64_t>(m);
      pos += m;
      break;
    }
    r.common_prefix = static_cast<std::int64_t>(pos);
    return r;
  }

  /// Adds a leaf under `parent` with edge `tokens` (non-empty, first token not already a
  /// child key). Under the root the leaf goes into `salt`'s namespace (created if it has
  /// none); deeper, into its parent's. O(e). @throws std::bad_alloc only (nothing changed).
  node_id add_leaf(node_id parent, std::span<const token_id> tokens, kv_extent&& kv, time_point now,
                   const cache_salt& salt = std::nullopt) {
    ++edits_;
    HYBRIDCACHE_ASSERT(!tokens.empty());
    namespace_id ns = nodes_[parent].ns;
    bool created = false;
    if (parent == root() && salt) {
      ns = namespace_of(salt);
      if (ns == absent_namespace) {
        ns = open_namespace(*salt);  // may throw: before anything changes
        created = true;
      }
    }
    HYBRIDCACHE_ASSERT(child(parent, tokens[0], ns) == no_node);
    node_id id = no_node;
    try {
      map_.reserve_extra(1);  // may throw: before anything changes
      id = acquire();
    } catch (...) {
      if (created) close_namespace(ns);
      throw;
    }
    node& n = nodes_[id];
    n.tokens.assign(tokens.begin(), tokens.end());
    n.kv = std::move(kv);
    n.parent = parent;
    n.ns = ns;
    n.end = nodes_[parent].end + static_cast<std::int64_t>(tokens.size());
    n.last_access = now;
    n.order = ++order_counter_;
    link_last(parent, id);
    map_.put(child_key(parent, ns, tokens[0]), id);
    bytes_ += kv_measure(n.edge());
    if (parent == root() && ns != 0) ++salts_.find(ns_salt_[ns])->second.top_level;
    return id;
  }

  /// Splits `n`'s edge after `head` tokens (0 < head < edge): a new node takes the first
  /// `head` tokens and `head_kv`, replaces `n` among its parent's children (same position)
  /// and gets `n` as its only child. `n` keeps its checkpoint, time and the tail. O(e).
  node_id split(node_id n, std::int64_t head, kv_extent&& head_kv, time_point now) {
    ++edits_;
    HYBRIDCACHE_ASSERT(head > 0 && head < nodes_[n].edge());
    // Reserve before mutating so that a bad_alloc leaves the tree intact. The tail gets a
    // buffer of its own size: erasing the head in place would leave n holding the whole
    // edge's room (a shared prefix's split would keep it twice).
    map_.reserve_extra(1);
    std::vector<token_id> tail(nodes_[n].tokens.begin() + head, nodes_[n].tokens.end());
    const node_id h = acquire();
    node& hn = nodes_[h];
    node& nn = nodes_[n];
    const node_id p = nn.parent;
    hn.tokens.assign(nn.tokens.begin(), nn.tokens.begin() + head);
    nn.tokens.swap(tail);
    hn.kv = std::move(head_kv);
    hn.parent = p;
    hn.end = nn.end - nn.edge();
    hn.last_access = now;
    replace_in_siblings(n, h);
    hn.order = nn.order;
    nn.parent = h;
    nn.prev_sibling = nn.next_sibling = no_node;
    nn.order = ++order_counter_;
    hn.first_child = hn.last_child = n;
    hn.children = 1;
    hn.ns = nn.ns;
    bytes_ += kv_measure(hn.edge()) + kv_measure(nn.edge()) - kv_measure(hn.edge() + nn.edge());
    map_.put(child_key(p, hn.ns, hn.tokens[0]), h);
    map_.put(child_key(h, hn.ns, nn.tokens[0]), n);
    return h;
  }

  /// Removes leaf `n` (no children, not the root) and returns its KV extent; its
  /// checkpoint must have been taken first. O(1).
  kv_extent remove_leaf(node_id n) noexcept {
    ++edits_;
    node& nn = nodes_[n];
    HYBRIDCACHE_ASSERT(n != root() && nn.children == 0 && !nn.has_checkpoint);
    map_.erase(child_key(nn.parent, nn.ns, nn.tokens[0]));
    if (nn.parent == root() && nn.ns != 0) leave_namespace(nn.ns);
    bytes_ -= kv_measure(nn.edge());
    unlink(n);
    kv_extent kv = std::move(nn.kv);
    release(n);
    return kv;
  }

  /// Merges single-child `n` into its child: the child's edge becomes n's tokens followed
  /// by its own, its KV becomes `joined` (n's KV ++ child's KV, from the store), its time
  /// max(n, child); the child takes n's place among n's parent's children. `n`'s
  /// checkpoint must have been taken first. Returns the child. O(e_n + e_child).
  node_id merge_into_child(node_id n, kv_extent&& joined) {
    ++edits_;
    node& nn = nodes_[n];
    HYBRIDCACHE_ASSERT(n != root() && nn.children == 1 && !nn.has_checkpoint);
    const node_id c = nn.first_child;
    node& cn = nodes_[c];
    const node_id p = nn.parent;
    std::vector<token_id> both;  // exactly the joined edge (inserting in front may double the room)
    both.reserve(nn.tokens.size() + cn.tokens.size());
    both.insert(both.end(), nn.tokens.begin(), nn.tokens.end());
    both.insert(both.end(), cn.tokens.begin(), cn.tokens.end());
    bytes_ += kv_measure(nn.edge() + cn.edge()) - kv_measure(nn.edge()) - kv_measure(cn.edge());
    cn.tokens.swap(both);
    map_.erase(detail::child_table::key(n, cn.tokens[static_cast<std::size_t>(nn.edge())]));
    cn.kv = std::move(joined);
    cn.last_access = std::max(cn.last_access, nn.last_access);
    cn.parent = p;
    replace_in_siblings(n, c);
    cn.order = nn.order;
    map_.put(child_key(p, cn.ns, cn.tokens[0]), c);  // overwrite: never grows
    nn.children = 0;
    nn.first_child = nn.last_child = no_node;
    release(n);
    return c;
  }

  void set_checkpoint(node_id n, checkpoint_handle&& h) noexcept {
    if (!nodes_[n].has_checkpoint) {
      bytes_ += measure_.checkpoint;
      checkpoint_bytes_ += measure_.checkpoint;
    }
    nodes_[n].checkpoint = std::move(h);
    nodes_[n].has_checkpoint = true;
  }
  [[nodiscard]] checkpoint_handle take_checkpoint(node_id n) noexcept {
    if (nodes_[n].has_checkpoint) {
      bytes_ -= measure_.checkpoint;
      checkpoint_bytes_ -= measure_.checkpoint;
    }
    nodes_[n].has_checkpoint = false;
    return std::move(nodes_[n].checkpoint);
  }
  /// Moves KV out of a node (used by the cache around merges). O(1).
  [[nodiscard]] kv_extent& kv(node_id n) noexcept { return nodes_[n].kv; }

  void touch(node_id n, time_point now) noexcept { nodes_[n].last_access = now; }
  /// The node's last-access time. Scorers read it through this call, not through `at(n)`,
  /// so that a composite scorer can hand each of its parts its own times
  /// (detail::stamp_view). O(1).
  [[nodiscard]] time_point last_access(node_id n) const noexcept { return nodes_[n].last_access; }
  void pin(node_id n) noexcept { ++nodes_[n].pins; }
  void unpin(node_id n) noexcept {
    HYBRIDCACHE_ASSERT(nodes_[n].pins > 0);
    --nodes_[n].pins;
  }

  /// True when `a` comes before `b` in DFS preorder over children in insertion order.
  /// O(depth).
  [[nodiscard]] bool dfs_before(node_id a, node_id b) const noexcept {
    if (a == b) return false;
    // Bring both to the same depth (depth in nodes), remembering the child on the way.
    const std::size_t da = depth(a), db = depth(b);
    node_id x = a, y = b;
    node_id xc = no_node, yc = no_node;
    std::size_t dx = da, dy = db;
    while (dx > dy) { xc = x; x = nodes_[x].parent; --dx; }
    while (dy > dx) { yc = y; y = nodes_[y].parent; --dy; }
    if (x == y) return da < db;  // ancestor comes first
    while (nodes_[x].parent != nodes_[y].parent) {
      x = nodes_[x].parent;
      y = nodes_[y].parent;
    }
    (void)xc;
    (void)yc;
    return nodes_[x].order < nodes_[y].order;
  }

  /// Number of edges from the root. O(depth).
  [[nodiscard]] std::size_t depth(node_id n) const noexcept {
    std::size_t d = 0;
    while (n != root()) {
      n = nodes_[n].parent;
      ++d;
    }
    return d;
  }

  /// Calls f(node_id) for every live non-root node in DFS preorder (children in
  /// insertion order). O(n).
  template <class F>
  void preorder(F&& f) const {
    std::vector<node_id> stack;
    for (node_id c = nodes_[root()].last_child; c != no_node; c = nodes_[c].prev_sibling) stack.push_back(c);
    while (!stack.empty()) {
      const node_id n = stack.back();
      stack.pop_back();
      f(n);
      for (node_id c = nodes_[n].last_child; c != no_node; c = nodes_[c].prev_sibling) stack.push_back(c);
    }
  }

  /// The tree's heap bytes: the node slots (live or free, each with the token buffer it
  /// keeps), the free list, the child table and the namespace tables; the store's handles
  /// hold nothing on the heap here (their bytes, if any, are the store's). O(id_bound()).
  [[nodiscard]] std::int64_t memory_bytes() const noexcept {
    std::int64_t b = detail::heap_bytes(nodes_) + detail::heap_bytes(free_) + map_.memory_bytes() +
                     detail::heap_bytes(salts_) + detail::heap_bytes(ns_salt_) + detail::heap_bytes(free_ns_);
    for (const node& n : nodes_) b += detail::heap_bytes(n.tokens);
    return b;
  }

  /// Reserve room for `n` nodes (benchmarks; avoids growth on the hot path).
  void reserve(std::size_t n) {
    detail::reserve_geometric(nodes_, n + 1);
    detail::reserve_geometric(free_, n + 1);
  }

 private:
  static std::size_t common_length(const token_id* a, const token_id* b, std::size_t n) noexcept {
    // Whole-edge compare first: the common case on a hit is a full match.
    if (std::memcmp(a, b, n * sizeof(token_id)) == 0) return n;
    std::size_t i = 0;
    constexpr std::size_t block = 16;
    while (i + block <= n && std::memcmp(a + i, b + i, block * sizeof(token_id)) == 0) i += block;
    while (i < n && a[i] == b[i]) ++i;
    return i;
  }

  static constexpr std::size_t kept_token_buffer = 32;  // ids; see release()

  node_id acquire() {
    node_id id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      // Ids stay below 2^31 so that a namespace key (bit 63 set) never equals a node's.
      HYBRIDCACHE_EXPECTS(nodes_.size() < 0x7fffffffu, capacity_error, "radix_tree: node ids exhausted");
      id = static_cast<node_id>(nodes_.size());
      nodes_.emplace_back();
      // Keep room to free every slot, so release() (noexcept) never allocates.
      if (free_.capacity() < nodes_.size()) free_.reserve(nodes_.capacity());
    }
    node& n = nodes_[id];
    n.live = true;
    ++live_;
    return id;
  }

  void release(node_id id) noexcept {
    node& n = nodes_[id];
    // A short buffer stays for the next node in this slot; a long one is freed (a free slot
    // would otherwise hold the longest edge it ever had).
    if (n.tokens.capacity() > kept_token_buffer) std::vector<token_id>().swap(n.tokens);
    else n.tokens.clear();
    n.kv = kv_extent{};
    n.checkpoint = checkpoint_handle{};
    n.has_checkpoint = false;
    n.live = false;
    n.children = n.pins = 0;
    n.parent = n.first_child = n.last_child = n.prev_sibling = n.next_sibling = no_node;
    n.end = 0;
    n.last_access = 0;
    n.order = 0;
    n.ns = 0;
    n.branched = false;
    --live_;
    free_.push_back(id);  // never allocates: acquire() reserved a free slot per node
  }

  void link_last(node_id parent, node_id id) noexcept {
    node& p = nodes_[parent];
    node& n = nodes_[id];
    n.prev_sibling = p.last_child;
    n.next_sibling = no_node;
    if (p.last_child != no_node) nodes_[p.last_child].next_sibling = id;
    else p.first_child = id;
    p.last_child = id;
    ++p.children;
    if (p.children >= 2) p.branched = true;
  }

  void unlink(node_id id) noexcept {
    node& n = nodes_[id];
    node& p = nodes_[n.parent];
    if (n.prev_sibling != no_node) nodes_[n.prev_sibling].next_sibling = n.next_sibling;
    else p.first_child = n.next_sibling;
    if (n.next_sibling != no_node) nodes_[n.next_sibling].prev_sibling = n.prev_sibling;
    else p.last_child = n.prev_sibling;
    --p.children;
  }

  /// `to` takes `from`'s place among from's parent's children.
  void replace_in_siblings(node_id from, node_id to) noexcept {
    node& f = nodes_[from];
    node& t = nodes_[to];
    node& p = nodes_[f.parent];
    t.prev_sibling = f.prev_sibling;
    t.next_sibling = f.next_sibling;
    if (f.prev_sibling != no_node) nodes_[f.prev_sibling].next_sibling = to;
    else p.first_child = to;
    if (f.next_sibling != no_node) nodes_[f.next_sibling].prev_sibling = to;
    else p.last_child = to;
    f.prev_sibling = f.next_sibling = no_node;
  }

  [[nodiscard]] std::int64_t kv_measure(std::int64_t tokens) const noexcept {
    return measure_.kv != nullptr ? measure_.kv(measure_.context, tokens) : 0;
  }

  [[nodiscard]] static std::uint64_t child_key(node_id parent, namespace_id ns, token_id first) noexcept {
    return parent == root() && ns != 0 ? detail::child_table::namespace_key(ns, first)
                                       : detail::child_table::key(parent, first);
  }

  /// A namespace for `salt` with no node yet (ids of closed namespaces are reused, so the
  /// tables stay as large as the most namespaces ever live at once). @throws bad_alloc,
  /// capacity_error with nothing changed.
  namespace_id open_namespace(std::uint64_t salt) {
    namespace_id ns;
    const bool reuse = !free_ns_.empty();
    if (reuse) {
      ns = free_ns_.back();
    } else {
      HYBRIDCACHE_EXPECTS(next_ns_ < absent_namespace, capacity_error, "radix_tree: namespace ids exhausted");
      ns = next_ns_;
      ns_salt_.resize(std::size_t{ns} + 1);
      free_ns_.reserve(ns_salt_.size());  // close_namespace (noexcept) never allocates
    }
    salts_.emplace(salt, salt_entry{ns, 0});
    if (reuse) free_ns_.pop_back();
    else ++next_ns_;
    ns_salt_[ns] = salt;
    return ns;
  }

  void close_namespace(namespace_id ns) noexcept {
    salts_.erase(ns_salt_[ns]);
    free_ns_.push_back(ns);
  }

  /// A top-level node of salted namespace `ns` left; the last one closes it. O(1) average.
  void leave_namespace(namespace_id ns) noexcept {
    auto it = salts_.find(ns_salt_[ns]);
    if (--it->second.top_level == 0) close_namespace(ns);
  }

  struct salt_entry {
    namespace_id ns = 0;
    std::uint64_t top_level = 0;  // root children in the namespace
  };

  std::vector<node> nodes_;
  std::vector<node_id> free_;
  detail::child_table map_;
  std::unordered_map<std::uint64_t, salt_entry> salts_;  // live salted namespaces
  std::vector<std::uint64_t> ns_salt_;                    // namespace id -> its salt
  std::vector<namespace_id> free_ns_;                     // closed ids, reused first
  namespace_id next_ns_ = 1;
  struct byte_measure {
    const void* context = nullptr;
    std::int64_t (*kv)(const void*, std::int64_t) = nullptr;
    std::int64_t checkpoint = 0;
  } measure_;
  std::int64_t bytes_ = 0;
  std::int64_t checkpoint_bytes_ = 0;  // of bytes_
  std::size_t live_ = 1;
  std::uint64_t order_counter_ = 0;
  std::uint64_t edits_ = 0;  // edits()
};

}  // namespace hybridcache::prefix
