// hybridcache/stores/pool_state_store.hpp
//
// `pool_state_store<Pool>`: the prefix cache's `state_store` (prefix/concepts.hpp) on a
// KV/SSM pool, so `prefix_cache<..., pool_state_store<asymmetric_pool<...>>>` keeps its KV
// in KV pages and its checkpoints in SSM blocks.
//
//   kv_extent          the KV of a run of tokens: blocks of `tokens_per_page` tokens, one
//                      page per attention layer per block (pages[block * L + layer]); the
//                      run may start `offset` tokens into its first block
//   checkpoint_handle  one SSM block per recurrent layer
//
// split_kv at a block boundary only splits the page list. Inside a block the boundary
// block is shared, so the tail gets fresh pages and the block's bytes are copied into
// them (copy-on-split; may fail with out_of_capacity, leaving `whole` unchanged).
// join_kv is the inverse: the back's partial first block is copied into the front's last
// block and its pages are freed; extents that do not meet at the same in-block offset are
// refused (errc::busy, both unchanged), which the cache handles by dropping only the
// checkpoint.
//
// Two sides (side_placing_store, concepts/state_store.hpp): KV pages and SSM blocks are
// placed on two sides of the pool that lend each other only whole free chunks. The cache
// asks `placement_fits` before it evicts, `prepare_placement` lets a short side borrow free
// chunks first (the pool's rebalancer), and `hold_split` keeps allocations from migrating
// while the cache places a request it has checked side by side.
//
// Host tier (a host_tier_config with kv_pages > 0; stores/detail/pool_host_tier.hpp): a
// leaf the cache evicts is demoted (`demote`: its pages and checkpoint copied to host
// memory through the copier, keyed by its path's content and the tenant's salt);
// `find_host_hit` finds a chain of demoted entries that continues a prompt's HBM match up
// to a checkpoint and pins it, `load_host_hit` copies it into a request's reserved pages
// and a reserved checkpoint slot (request_lifecycle::begin does both: `host_tier_store`).
// The pool stays the HBM; nothing is staged. Without a host tier these calls do nothing.
//
// Costs: allocate/free O(pages), split/join O(pages) plus at most one block copy.
// Handle lists are std::vector: an extent allocates its list once (the prefix cache keeps
// extents in tree nodes). With a backing that can throw (CUDA), a failed driver call
// during an allocation is reported as out_of_capacity, since these calls are noexcept.
// Host tier: demote O(path + pages + blocks) (+ a CRC of the entry's bytes), find_host_hit
// O(|prompt| + chain entries + chain bytes: the CRC check),
// load_host_hit O(tokens loaded · layers + blocks); its memory is allocated at construction.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/core/checked_math.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/memory/asymmetric_pool.hpp"
#include "hybridcache/memory/units.hpp"
#include "hybridcache/model/cost_model.hpp"
#include "hybridcache/memory/pool.hpp"
#include "hybridcache/concepts/state_store.hpp"
#include "hybridcache/concepts/tier_store.hpp"
#include "hybridcache/core/hash.hpp"
#include "hybridcache/prefix/radix_tree.hpp"
#include "hybridcache/prefix/types.hpp"
#include "hybridcache/stores/detail/pool_host_tier.hpp"

namespace hybridcache::stores {

/// Copies bytes of host-resident units (no-op for counting backings, whose addresses are
/// null). Device pools pass a copier that calls cudaMemcpy.
struct host_copier {
  void operator()(std::byte* dst, const std::byte* src, std::size_t n) const noexcept {
    if (dst != nullptr && src != nullptr) std::memcpy(dst, src, n);
  }
};

/// How a `pool_state_store` lays a model out in its pool (aggregate).
struct pool_store_options {
  /// Tokens one KV page holds: the pool's KV unit must be `kv_page_bytes(model, tokens_per_page)`.
  std::int64_t tokens_per_page = 16;
  /// The host tier below the pool (kv_pages 0: none).
  host_tier_config host_tier{};
};

/// `state_store` over a `kv_ssm_pool` (non-owning: the pool must outlive the store).
template <kv_ssm_pool Pool, class Copier = host_copier>
class pool_state_store {
 public:
  /// KV of `tokens` tokens starting `offset` tokens into the first block.
  struct kv_extent {
    std::int64_t tokens = 0;
    std::int64_t offset = 0;
    std::vector<packed_handle> pages;  ///< block-major: pages[block * attention_layers + layer]
  };
  /// One SSM block per recurrent layer (empty = no checkpoint).
  struct checkpoint_handle {
    std::vector<packed_handle> blocks;
  };
  /// Whether `h` holds a checkpoint (`state_store::holds`): it has its blocks. O(1).
  [[nodiscard]] static bool holds(const checkpoint_handle& h) noexcept { return !h.blocks.empty(); }

  /// @param tokens_per_page   tokens one KV page holds (the pool's kv unit covers this many)
  /// @param attention_layers  pages per block (one per attention layer)
  /// @param recurrent_layers  SSM blocks per checkpoint
  /// @throws invalid_argument on non-positive counts.
  pool_state_store(Pool& pool, std::int64_t tokens_per_page, std::int64_t attention_layers,
                   std::int64_t recurrent_layers, Copier copier = {})
      : pool_state_store(pool, tokens_per_page, attention_layers, recurrent_layers, host_tier_config{}, copier) {}

  /// The same with a host tier (`host`: its size; see "Host tier" in the file comment).
  /// @throws invalid_argument on non-positive counts, a page that tokens_per_page does not
  ///         divide, a pool one of whose sides can never hold a page set or a checkpoint,
  ///         or a negative host size; bad_alloc.
  pool_state_store(Pool& pool, std::int64_t tokens_per_page, std::int64_t attention_layers,
                   std::int64_t recurrent_layers, const host_tier_config& host, Copier copier = {})
      : pool_(&pool), tpp_(tokens_per_page), layers_(attention_layers), rec_(recurrent_layers), copy_(copier) {
    HYBRIDCACHE_EXPECTS(tokens_per_page > 0, invalid_argument,
                        "pool_state_store: tokens_per_page must be > 0, got " + std::to_string(tokens_per_page));
    HYBRIDCACHE_EXPECTS(attention_layers > 0, invalid_argument,
                        "pool_state_store: attention_layers must be > 0, got " + std::to_string(attention_layers));
    HYBRIDCACHE_EXPECTS(recurrent_layers > 0, invalid_argument,
                        "pool_state_store: recurrent_layers must be > 0, got " + std::to_string(recurrent_layers));
    const byte_count page = pool.stats(pool_kind::kv).unit_bytes;
    HYBRIDCACHE_EXPECTS(page % tokens_per_page == 0, invalid_argument,
                        "pool_state_store: tokens_per_page " + std::to_string(tokens_per_page) +
                            " does not divide the pool's " + std::to_string(page) + "-byte KV page");
    const std::int64_t kv_units = max_units(pool_kind::kv), ssm_units = max_units(pool_kind::ssm);
    HYBRIDCACHE_EXPECTS(kv_units >= attention_layers, invalid_argument,
                        "pool_state_store: the pool's KV side holds at most " + std::to_string(kv_units) +
                            " pages, fewer than one block's " + std::to_string(attention_layers) + " (one per attention layer)");
    HYBRIDCACHE_EXPECTS(ssm_units >= recurrent_layers, invalid_argument,
                        "pool_state_store: the pool's SSM side holds at most " + std::to_string(ssm_units) +
                            " blocks, fewer than one checkpoint's " + std::to_string(recurrent_layers) +
                            " (one per recurrent layer)");
    HYBRIDCACHE_EXPECTS(host.kv_pages >= 0 && host.checkpoint_blocks >= 0, invalid_argument,
                        "pool_state_store: host tier sizes must be >= 0");
    HYBRIDCACHE_EXPECTS(host.kv_pages == 0 || host.checkpoint_blocks >= recurrent_layers, invalid_argument,
                        "pool_state_store: a host tier needs room for at least one checkpoint (" +
                            std::to_string(recurrent_layers) + " blocks), got " + std::to_string(host.checkpoint_blocks));
    host_ = detail::pool_host_tier(host, pool.stats(pool_kind::kv).unit_bytes, pool.stats(pool_kind::ssm).unit_bytes);
  }

  /// The store for `model`'s layers, checked against the model (`check_model`): the way to
  /// build one that cannot be laid out wrong.
  /// @throws invalid_argument as the other constructors and `check_model`; bad_alloc.
  pool_state_store(Pool& pool, const cost_model& model, const pool_store_options& options = {}, Copier copier = {})
      : pool_state_store(pool, options.tokens_per_page, model.attention_layers(), model.recurrent_layers(),
                         options.host_tier, copier) {
    check_model(model);
  }

  /// Checks that this store lays `model` out right: its layer counts, a KV page of exactly
  /// tokens_per_page tokens of one attention layer (`kv_page_bytes(model, tokens_per_page)`),
  /// a state block that holds one recurrent layer's checkpoint (`checkpoint_block_bytes`).
  /// prefix_cache's constructor calls it. @throws invalid_argument naming what differs.
  void check_model(const cost_model& model) const {
    const std::string name = "'" + model.spec().name + "'";
    HYBRIDCACHE_EXPECTS(model.attention_layers() == layers_, invalid_argument,
                        "pool_state_store: attention_layers is " + std::to_string(layers_) + " but model " + name +
                            " has " + std::to_string(model.attention_layers()));
    HYBRIDCACHE_EXPECTS(model.recurrent_layers() == rec_, invalid_argument,
                        "pool_state_store: recurrent_layers is " + std::to_string(rec_) + " but model " + name + " has " +
                            std::to_string(model.recurrent_layers()));
    const byte_count page = pool_->stats(pool_kind::kv).unit_bytes;
    const byte_count want = memory::kv_page_bytes(model, tpp_);
    HYBRIDCACHE_EXPECTS(page == want, invalid_argument,
                        "pool_state_store: the pool's KV page is " + std::to_string(page) + " B but " +
                            std::to_string(tpp_) + " tokens per page of model " + name + " need " + std::to_string(want) +
                            " B (memory::kv_page_bytes(model, tokens_per_page))");
    const byte_count block = pool_->stats(pool_kind::ssm).unit_bytes;
    const byte_count state = model.ssm_checkpoint_bytes_per_layer();
    HYBRIDCACHE_EXPECTS(block >= state, invalid_argument,
                        "pool_state_store: the pool's state block is " + std::to_string(block) + " B, smaller than one " +
                            "recurrent layer's checkpoint of model " + name + " (" + std::to_string(state) +
                            " B; memory::checkpoint_block_bytes(model))");
  }

  [[nodiscard]] expected<kv_extent> allocate_kv(std::int64_t tokens) noexcept {
    if (tokens <= 0) return unexpected(errc::invalid_argument, "allocate_kv: tokens must be > 0", tokens);
    if (!could_hold(0, tokens)) return unexpected(errc::out_of_capacity, "allocate_kv: more pages than the pool holds (tokens)", tokens);
    kv_extent e{tokens, 0, {}};
    e.pages.resize(static_cast<std::size_t>(blocks(tokens) * layers_));
    if (auto r = take(pool_kind::kv, e.pages); !r) return unexpected(r.error());
    return e;
  }

  /// KV for the tokens [first_token, first_token + tokens) of a sequence, laid out at their
  /// absolute positions: token t sits in slot t % tokens_per_page of its block. Extents made
  /// this way meet at the same in-block offset (join_kv never refuses them), and the pages of
  /// a sequence's extents, block by block, are a kernel's block table. The first block's
  /// slots before `first_token` are left to the caller (the request lifecycle copies the
  /// cached tokens of a shared partial block there: copy-on-write). O(pages).
  [[nodiscard]] expected<kv_extent> allocate_kv_at(std::int64_t first_token, std::int64_t tokens) noexcept {
    if (tokens <= 0) return unexpected(errc::invalid_argument, "allocate_kv_at: tokens must be > 0", tokens);
    if (first_token < 0) return unexpected(errc::invalid_argument, "allocate_kv_at: first_token must be >= 0", first_token);
    const std::int64_t offset = first_token % tpp_;
    if (!could_hold(offset, tokens))
      return unexpected(errc::out_of_capacity, "allocate_kv_at: more pages than the pool holds (tokens)", tokens);
    kv_extent e{tokens, offset, {}};
    e.pages.resize(static_cast<std::size_t>(blocks(offset + tokens) * layers_));
    if (auto r = take(pool_kind::kv, e.pages); !r) return unexpected(r.error());
    return e;
  }

  /// Copies the KV of the absolute token positions [from, to) from `src` (which holds the
  /// tokens starting at absolute position `src_first`) into `dst` (whose tokens start at
  /// `dst_first`), slot by slot, every layer. Both extents must be laid out at absolute
  /// positions (allocate_kv_at, or split off one), and [from, to) must lie in `src` and in
  /// `dst`'s blocks (it may precede `dst_first` within its first block). O(to - from).
  void copy_tokens(const kv_extent& src, std::int64_t src_first, const kv_extent& dst, std::int64_t dst_first,
                   std::int64_t from, std::int64_t to) noexcept {
    const auto L = static_cast<std::size_t>(layers_);
    for (std::int64_t p = from; p < to;) {
      const std::int64_t sb = (src.offset + p - src_first) / tpp_, db = (dst.offset + p - dst_first) / tpp_;
      const std::int64_t end = std::min(to, (p / tpp_ + 1) * tpp_);  // to the end of p's block
      for (std::size_t l = 0; l < L; ++l)
        copy_page(dst.pages[static_cast<std::size_t>(db) * L + l], src.pages[static_cast<std::size_t>(sb) * L + l],
                  p % tpp_, (end - 1) % tpp_ + 1);
      p = end;
    }
  }

  /// Appends to `out` the page of attention layer `layer` of every block of `e` (whose
  /// tokens start at absolute position `first`) from absolute block `from_block` on. With
  /// extents laid out at absolute positions, `out[b]` then holds token positions
  /// [b * tokens_per_page, (b + 1) * tokens_per_page). O(blocks).
  void append_pages(const kv_extent& e, std::int64_t first, std::int64_t layer, std::int64_t from_block,
                    std::vector<packed_handle>& out) const {
    const std::int64_t first_block = first / tpp_;
    const auto n = static_cast<std::int64_t>(e.pages.size()) / layers_;
    for (std::int64_t b = std::max(from_block, first_block); b < first_block + n; ++b)
      out.push_back(e.pages[static_cast<std::size_t>((b - first_block) * layers_ + layer)]);
  }

  /// Tokens one page holds.
  [[nodiscard]] std::int64_t tokens_per_page() const noexcept { return tpp_; }
  /// Attention layers (pages per block).
  [[nodiscard]] std::int64_t attention_layers() const noexcept { return layers_; }
  /// Recurrent layers (state blocks per checkpoint).
  [[nodiscard]] std::int64_t recurrent_layers() const noexcept { return rec_; }

  void free_kv(kv_extent&& e) noexcept {
    for (packed_handle h : e.pages) (void)pool_->free(h);
    e = kv_extent{};
  }

  [[nodiscard]] expected<kv_extent> split_kv(kv_extent& whole, std::int64_t head) noexcept {
    if (head <= 0 || head >= whole.tokens) return unexpected(errc::invalid_argument);
    const std::int64_t cut = whole.offset + head;
    const auto b = static_cast<std::size_t>(cut / tpp_);
    const std::int64_t r = cut % tpp_;
    const auto L = static_cast<std::size_t>(layers_);
    kv_extent front{head, whole.offset, {}};
    if (r == 0) {
      front.pages.assign(whole.pages.begin(), whole.pages.begin() + static_cast<std::ptrdiff_t>(b * L));
      whole.pages.erase(whole.pages.begin(), whole.pages.begin() + static_cast<std::ptrdiff_t>(b * L));
      whole.offset = 0;
    } else {
      std::vector<packed_handle> fresh(L);
      if (auto t = take(pool_kind::kv, fresh); !t) return unexpected(t.error());
      for (std::size_t l = 0; l < L; ++l) copy_page(fresh[l], whole.pages[b * L + l], 0, tpp_);
      front.pages.assign(whole.pages.begin(), whole.pages.begin() + static_cast<std::ptrdiff_t>((b + 1) * L));
      std::vector<packed_handle> back = std::move(fresh);
      back.insert(back.end(), whole.pages.begin() + static_cast<std::ptrdiff_t>((b + 1) * L), whole.pages.end());
      whole.pages = std::move(back);
      whole.offset = r;
    }
    whole.tokens -= head;
    return front;
  }

  [[nodiscard]] expected<void> join_kv(kv_extent& front, kv_extent&& back) noexcept {
    const std::int64_t e = (front.offset + front.tokens) % tpp_;
    if (back.offset != e) return unexpected(errc::busy);
    const auto L = static_cast<std::size_t>(layers_);
    if (e == 0) {
      front.pages.insert(front.pages.end(), back.pages.begin(), back.pages.end());
    } else {
      // The back's first block continues the front's last one: copy its tokens over.
      const std::size_t last = front.pages.size() - L;
      const std::int64_t end = std::min<std::int64_t>(tpp_, e + back.tokens);
      for (std::size_t l = 0; l < L; ++l) {
        copy_page(front.pages[last + l], back.pages[l], e, end);
        (void)pool_->free(back.pages[l]);
      }
      front.pages.insert(front.pages.end(), back.pages.begin() + static_cast<std::ptrdiff_t>(L), back.pages.end());
    }
    front.tokens += back.tokens;
    back = kv_extent{};
    return {};
  }

  [[nodiscard]] expected<checkpoint_handle> allocate_checkpoint() noexcept {
    checkpoint_handle c;
    c.blocks.resize(static_cast<std::size_t>(rec_));
    if (auto r = take(pool_kind::ssm, c.blocks); !r) return unexpected(r.error());
    return c;
  }

  void free_checkpoint(checkpoint_handle&& c) noexcept {
    for (packed_handle h : c.blocks) (void)pool_->free(h);
    c.blocks.clear();
  }

  /// Bytes a new extent of `tokens` tokens takes (whole pages; saturates at int64 max).
  [[nodiscard]] std::int64_t kv_bytes(std::int64_t tokens) const noexcept {
    return saturating_mul(saturating_mul(blocks(tokens), layers_), pool_->stats(pool_kind::kv).unit_bytes);
  }
  [[nodiscard]] byte_count checkpoint_bytes() const noexcept { return rec_ * pool_->stats(pool_kind::ssm).unit_bytes; }
  [[nodiscard]] byte_count used_bytes() const noexcept {
    return pool_->stats(pool_kind::kv).used_bytes() + pool_->stats(pool_kind::ssm).used_bytes();
  }
  [[nodiscard]] byte_count capacity_bytes() const noexcept { return pool_->reserved_bytes(); }

  /// Bytes `allocate_kv_at(first_token, tokens)` takes: whole blocks from the block of
  /// `first_token` on (one page set more than `kv_bytes(tokens)` when the run straddles a
  /// block it does not fill).
  [[nodiscard]] std::int64_t kv_bytes_at(std::int64_t first_token, std::int64_t tokens) const noexcept {
    return kv_bytes(saturating_add(first_token % tpp_, tokens));
  }

  /// True when `need` can be placed with the pool's current split between the KV and SSM
  /// sides once `freed` has been given back: each side's free units plus its freed units
  /// cover that side's need (prefix/concepts: side_placing_store). O(1).
  [[nodiscard]] bool placement_fits(side_bytes need, side_bytes freed) const noexcept {
    return side_fits(pool_kind::kv, need.kv, freed.kv) && side_fits(pool_kind::ssm, need.checkpoint, freed.checkpoint);
  }

  /// Whether `need` could be placed once every unit of the pool is free, with the split
  /// its rebalancer can make (each side within what it can ever map): what an empty cache
  /// of this size could hold. O(1).
  [[nodiscard]] bool placement_fits_when_empty(side_bytes need) const noexcept {
    const std::int64_t kv = units_for(pool_kind::kv, need.kv), ssm = units_for(pool_kind::ssm, need.checkpoint);
    if constexpr (rebalancing_pool<Pool>) return pool_->could_place_when_empty(kv, ssm);
    else return kv <= max_units(pool_kind::kv) && ssm <= max_units(pool_kind::ssm);
  }

  /// For a side whose free units do not cover `need` now, asks the pool's rebalancer for
  /// that side's shortfall (free chunks of the other side move over; no live unit moves),
  /// as a failed allocation would. Nothing else changes. O(chunks moved).
  void prepare_placement(side_bytes need) noexcept {
    if constexpr (rebalancing_pool<Pool>) {
      for (const pool_kind k : {pool_kind::kv, pool_kind::ssm}) {
        const std::int64_t want = units_for(k, k == pool_kind::kv ? need.kv : need.checkpoint);
        const std::int64_t have = pool_->stats(k).free_units;
        if (want > have) {
          if constexpr (noexcept(pool_->rebalance_on_failure(k, want - have))) {
            (void)pool_->rebalance_on_failure(k, want - have);
          } else {
            try {
              (void)pool_->rebalance_on_failure(k, want - have);
            } catch (...) {  // a failed mapping rolls back; the fit check then refuses
            }
          }
        }
      }
    }
  }

  /// While held, an allocation that finds its side full fails instead of asking the
  /// rebalancer: the cache holds the split while it allocates a request it has checked
  /// side by side, so that a migration cannot take the free units the other side was
  /// counted on. O(1).
  void hold_split(bool held) noexcept { split_held_ = held; }

  // --- host tier (enabled by a host_tier_config with kv_pages > 0) ------------------------

  /// The lower tier's hit type (request_lifecycle keeps one per request).
  using host_hit = pool_host_hit;

  /// Copies leaf `v` of `tree` (about to be evicted: its KV and its checkpoint, if any) into
  /// the host tier, keyed by the content of its path (salt-seeded). Called by the prefix
  /// cache's eviction before the units are freed. Dropped when the host tier is off or the
  /// leaf does not fit beside pinned entries. O(path + pages + blocks).
  template <class Tree>
  void demote(const Tree& tree, node_id v) noexcept {
    if (!host_.enabled()) return;
    const auto& nd = tree.at(v);
    if (nd.tokens.empty() || nd.kv.pages.empty()) return;
    // The content key of the path through the leaf's first token, hashed from the root.
    host_path_.clear();
    try {  // grows with the deepest path once
      for (node_id n = nd.parent; n != Tree::root(); n = tree.at(n).parent) host_path_.push_back(n);
    } catch (...) {
      return;  // no memory for the walk: the leaf is dropped, not demoted
    }
    std::uint64_t h = content_key::seed(0, tree.salt_of(nd.ns));
    for (auto it = host_path_.rbegin(); it != host_path_.rend(); ++it)
      for (const auto t : tree.at(*it).tokens) h = content_key::next(h, t);
    const std::uint64_t key = content_key::next(h, nd.tokens.front());
    const std::size_t blocks = nd.has_checkpoint ? nd.checkpoint.blocks.size() : 0;
    const std::uint32_t id =
        host_.make_entry(key, nd.begin(), nd.kv.offset, std::span<const token_id>(nd.tokens), nd.kv.pages.size(), blocks);
    if (id == detail::pool_host_tier::none) return;
    const auto& e = host_.at(id);
    const std::size_t page_bytes = pool_->stats(pool_kind::kv).unit_bytes, block_bytes = pool_->stats(pool_kind::ssm).unit_bytes;
    for (std::size_t i = 0; i < e.pages.size(); ++i)
      if (auto src = pool_->resolve(nd.kv.pages[i]); src && *src != nullptr) copy_(host_.page(e.pages[i]), *src, page_bytes);
    for (std::size_t i = 0; i < e.blocks.size(); ++i)
      if (auto src = pool_->resolve(nd.checkpoint.blocks[i]); src && *src != nullptr)
        copy_(host_.block(e.blocks[i]), *src, block_bytes);
    host_.publish(id);
  }

  /// The longest chain of host entries that continues `prompt`'s HBM match `m` (in m's
  /// namespace) and ends in a checkpoint after m.reusable_tokens and before |prompt| (a
  /// request computes at least its last prompt token). Its entries are pinned until
  /// `load_host_hit` or `release_host_hit`. `out.host_tokens` 0: none. The chain may start
  /// anywhere up to m.common_prefix (the tree holds the KV before it). Its entries' bytes are
  /// checked against their CRC-32C first: a changed entry is dropped (counted in
  /// `host_counters().corrupt_dropped`) and never loaded, and the search runs again without
  /// it. O(|prompt| + Σ chain lengths) hash probes and token compares + O(chain bytes) for
  /// the CRCs (per dropped entry, once more).
  void find_host_hit(std::span<const token_id> prompt, const match_result& m, pool_host_hit& out) noexcept {
    release_host_hit(out);
    if (!host_.enabled()) return;
    // The winning chain's entries are checked against their CRCs before they are pinned: an
    // entry whose bytes changed at rest is dropped and the search runs again without it
    // (each retry drops one entry, so this ends).
    for (;;) {
      const host_chain c = longest_host_chain(prompt, m);
      if (c.entries == 0) return;
      bool intact = true;
      std::uint64_t h = content_key::seed(0, m.salt);
      for (std::int64_t s = 0; s < c.start; ++s) h = content_key::next(h, prompt[static_cast<std::size_t>(s)]);
      std::int64_t cur = c.start;
      for (std::int64_t i = 0; i < c.entries && intact; ++i) {
        const std::uint32_t id = host_.find(content_key::next(h, prompt[static_cast<std::size_t>(cur)]));
        for (const auto t : host_.at(id).tokens) h = content_key::next(h, t);
        cur = host_.at(id).end();
        intact = host_.verify_or_drop(id);
      }
      if (!intact) continue;
      // Walk the chain again, pinning its entries.
      h = content_key::seed(0, m.salt);
      for (std::int64_t s = 0; s < c.start; ++s) h = content_key::next(h, prompt[static_cast<std::size_t>(s)]);
      cur = c.start;
      try {
        out.entries.reserve(static_cast<std::size_t>(c.entries));
      } catch (...) {
        return;  // no hit: the request goes on from its HBM match
      }
      for (std::int64_t i = 0; i < c.entries; ++i) {
        const std::uint32_t id = host_.find(content_key::next(h, prompt[static_cast<std::size_t>(cur)]));
        const auto& e = host_.at(id);
        for (const auto t : e.tokens) h = content_key::next(h, t);
        cur = e.end();
        host_.pin(id);
        out.entries.push_back(id);
      }
      out.kv_start = c.start;
      out.reusable_tokens = c.reusable;
      out.host_tokens = c.reusable - m.reusable_tokens;
      return;
    }
  }

  /// Copies the KV of positions [from, to) of `hit` into `dst` (an extent laid out at
  /// absolute positions whose tokens start at `dst_first`; [from, to) must lie in the chain
  /// and in dst's blocks) and the chain's checkpoint into `slot`, then releases the hit.
  /// O((to - from) · layers + blocks).
  void load_host_hit(pool_host_hit& hit, const kv_extent& dst, std::int64_t dst_first, std::int64_t from,
                     std::int64_t to, const checkpoint_handle& slot) noexcept {
    if (hit.entries.empty()) return;
    const auto L = static_cast<std::size_t>(layers_);
    const byte_count per_token = pool_->stats(pool_kind::kv).unit_bytes / tpp_;
    for (const std::uint32_t id : hit.entries) {
      const auto& e = host_.at(id);
      for (std::int64_t p = std::max(from, e.begin); p < std::min(to, e.end());) {
        const std::int64_t stop = std::min({to, e.end(), (p / tpp_ + 1) * tpp_});  // to the end of p's block
        const auto sb = static_cast<std::size_t>((e.offset + p - e.begin) / tpp_);
        const auto db = static_cast<std::size_t>((dst.offset + p - dst_first) / tpp_);
        for (std::size_t l = 0; l < L; ++l) {
          auto d = pool_->resolve(dst.pages[db * L + l]);
          if (!d || *d == nullptr) continue;
          const byte_count at = p % tpp_ * per_token;
          copy_(*d + at, host_.page(e.pages[sb * L + l]) + at, static_cast<std::size_t>((stop - p) * per_token));
        }
        p = stop;
      }
      host_.touch(id);
    }
    const auto& last = host_.at(hit.entries.back());
    const std::size_t block_bytes = pool_->stats(pool_kind::ssm).unit_bytes;
    for (std::size_t i = 0; i < last.blocks.size() && i < slot.blocks.size(); ++i)
      if (auto d = pool_->resolve(slot.blocks[i]); d && *d != nullptr) copy_(*d, host_.block(last.blocks[i]), block_bytes);
    auto& c = host_.counters_mut();
    ++c.loads;
    c.tokens_loaded += std::max<std::int64_t>(0, to - from);
    ++c.checkpoints_loaded;
    release_host_hit(hit);
  }

  /// Gives a hit up: unpins its entries. O(entries).
  void release_host_hit(pool_host_hit& hit) noexcept {
    for (const std::uint32_t id : hit.entries) host_.unpin(id);
    hit.entries.clear();
    hit.host_tokens = 0;
    hit.reusable_tokens = 0;
    hit.kv_start = 0;
  }

  /// The host tier's memory (KV pages, then SSM blocks), for inspection and for tests that
  /// flip a stored byte (integrity: `host_counters().corrupt_dropped`). Empty without a host tier.
  [[nodiscard]] std::span<std::byte> host_kv_memory() noexcept { return host_.kv_memory(); }
  [[nodiscard]] std::span<std::byte> host_ssm_memory() noexcept { return host_.ssm_memory(); }

  /// What the host tier did.
  [[nodiscard]] const host_tier_counters& host_counters() const noexcept { return host_.counters(); }
  /// Entries in the host tier.
  [[nodiscard]] std::int64_t host_entries() const noexcept { return host_.live_entries(); }

  [[nodiscard]] const Pool& pool() const noexcept { return *pool_; }

 private:
  [[nodiscard]] std::int64_t blocks(std::int64_t tokens) const noexcept { return ceil_div(tokens, tpp_); }

  /// The longest chain of host entries continuing `m` that ends in a checkpoint before the
  /// prompt's last token: where it starts, how many entries, the state it reaches.
  struct host_chain {
    std::int64_t start = 0, entries = 0, reusable = 0;
  };
  host_chain longest_host_chain(std::span<const token_id> prompt, const match_result& m) const noexcept {
    const auto n = static_cast<std::int64_t>(prompt.size());
    const std::int64_t reach = std::min<std::int64_t>(m.common_prefix, n - 1);
    std::uint64_t h = content_key::seed(0, m.salt);
    host_chain best{0, 0, m.reusable_tokens};
    for (std::int64_t s = 0; s <= reach; ++s) {
      const std::uint64_t through = content_key::next(h, prompt[static_cast<std::size_t>(s)]);
      if (host_.find(through) != detail::pool_host_tier::none) {
        // Follow the chain from s, remembering its deepest usable checkpoint.
        std::int64_t cur = s, len = 0;
        std::uint64_t hc = h;
        while (cur < n) {
          const std::uint32_t id = host_.find(content_key::next(hc, prompt[static_cast<std::size_t>(cur)]));
          if (id == detail::pool_host_tier::none) break;
          const auto& e = host_.at(id);
          if (e.begin != cur || e.end() > n ||
              !std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin() + static_cast<std::ptrdiff_t>(cur)))
            break;
          for (const auto t : e.tokens) hc = content_key::next(hc, t);
          cur = e.end();
          ++len;
          if (!e.blocks.empty() && cur > best.reusable && cur < n) best = {s, len, cur};
        }
      }
      h = through;
    }
    return best;
  }

  /// The most units of `k` the pool could ever map (its whole budget on that side).
  [[nodiscard]] std::int64_t max_units(pool_kind k) const noexcept {
    if constexpr (rebalancing_pool<Pool>) return pool_->max_units(k);
    else return pool_->stats(k).total_units;
  }
  /// Whether an extent of `tokens` tokens from in-block `offset` could ever be placed: its
  /// page list is sized before allocation, so a size past the pool is refused first.
  [[nodiscard]] bool could_hold(std::int64_t offset, std::int64_t tokens) const noexcept {
    const std::int64_t pages = saturating_mul(blocks(saturating_add(offset, tokens)), layers_);
    return pages <= max_units(pool_kind::kv);
  }

  [[nodiscard]] std::int64_t units_for(pool_kind k, byte_count bytes) const noexcept {
    const byte_count unit = pool_->stats(k).unit_bytes;
    return bytes <= 0 || unit <= 0 ? 0 : ceil_div(bytes, unit);
  }
  [[nodiscard]] bool side_fits(pool_kind k, byte_count need, byte_count freed) const noexcept {
    // Freed bytes are counted down (whole units only), needed bytes up.
    const byte_count unit = pool_->stats(k).unit_bytes;
    const std::int64_t back = freed <= 0 || unit <= 0 ? 0 : freed / unit;
    return units_for(k, need) <= pool_->stats(k).free_units + back;
  }

  expected<void> take(pool_kind k, std::span<packed_handle> out) noexcept {
    if constexpr (noexcept(std::declval<Pool&>().allocate_n(k, out, true))) {
      return pool_->allocate_n(k, out, !split_held_);
    } else {
      try {
        return pool_->allocate_n(k, out, !split_held_);
      } catch (...) {
        return unexpected(errc::out_of_capacity);
      }
    }
  }

  // Copies tokens [from, to) of one page (per-token bytes = page / tokens_per_page).
  void copy_page(packed_handle dst, packed_handle src, std::int64_t from, std::int64_t to) noexcept {
    const byte_count per_token = pool_->stats(pool_kind::kv).unit_bytes / tpp_;
    auto d = pool_->resolve(dst), s = pool_->resolve(src);
    if (!d || !s || *d == nullptr || *s == nullptr) return;
    copy_(*d + from * per_token, *s + from * per_token, static_cast<std::size_t>((to - from) * per_token));
  }

  Pool* pool_;
  std::int64_t tpp_;
  std::int64_t layers_;
  std::int64_t rec_;
  Copier copy_;
  bool split_held_ = false;  // hold_split
  detail::pool_host_tier host_;
  std::vector<node_id> host_path_;  // demote's root-ward walk
};

static_assert(state_store<pool_state_store<memory::simulated_vmm_pool<memory::threshold_rebalancer>>>);
static_assert(state_store<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>>);
static_assert(side_placing_store<pool_state_store<memory::simulated_vmm_pool<memory::threshold_rebalancer>>>);
static_assert(side_placing_store<pool_state_store<memory::host_asymmetric_pool<memory::no_rebalancer>>>);
static_assert(paged_state_store<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>>);
static_assert(host_tier_store<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>,
                              prefix::radix_tree<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>>>);

}  // namespace hybridcache::stores
