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
// Host tier (a host_tier_config with kv_pages > 0; stores/detail/pool_lower_tier.hpp): a
// leaf the cache evicts is demoted (`demote`: its pages and checkpoint copied to host
// memory through the copier, keyed by its path's content and the tenant's salt). With
// storage tiers below (host_tier_config::storage_tiers: disk, Redis), what the host tier
// evicts moves down and a lookup brings it back up; the tiers are one `tiered::tiered_store`
// over a `tiered::host_copy_engine`, the library's tiered implementation. The store
// is a `lower_tier_store`, driven by the request lifecycle like every store with tiers below
// HBM: `lookup` finds a chain of demoted entries that continues a prompt's HBM match up to a
// checkpoint and pins it, and, once the request's reservation is made, `land` copies it into
// the reserved pages and a reserved checkpoint slot. The pool stays the HBM; nothing is
// staged (`lands_in_reservation`). Without a host tier lookup finds nothing.
//
// Costs: allocate/free O(pages), split/join O(pages) plus at most one block copy.
// Handle lists are std::vector: an extent allocates its list once (the prefix cache keeps
// extents in tree nodes). With a backing that can throw (CUDA), a failed driver call
// during an allocation is reported as out_of_capacity, since these calls are noexcept.
// Host tier: demote O(path + pages + blocks) (+ a CRC of the entry's bytes, a table row, and
// a copy per entry it moves down), lookup O(|prompt| + chain entries + chain bytes: the CRC
// check, + a storage read per entry brought up), land O(tokens loaded · layers + blocks);
// its memory is allocated at construction.
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
#include "hybridcache/stores/detail/pool_lower_tier.hpp"

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
                   std::int64_t recurrent_layers, host_tier_config host, Copier copier = {})
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
    host_ = detail::pool_lower_tier(std::move(host), pool.stats(pool_kind::kv).unit_bytes, pool.stats(pool_kind::ssm).unit_bytes);
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
  // The `lower_tier_store` protocol (concepts/tier_store.hpp), as for every store with tiers
  // below HBM; stores/detail/pool_lower_tier.hpp does the work. Without a host tier, lookup
  // finds nothing and the rest has nothing to do.

  /// A hit below HBM (request_lifecycle keeps one per request).
  using hit_type = pool_host_hit;
  /// Where a loaded hit lands: in the request's own reservation (`land`), not in a staging
  /// room of the store's; the lifecycle's `resume_checkpoint` returns the loaded slot.
  static constexpr bool lands_in_reservation = true;

  /// Copies leaf `v` of `tree` (about to be evicted: its KV and its checkpoint, if any) into
  /// the host tier, keyed by the content of its path (salt-seeded). Called by the prefix
  /// cache's eviction before the units are freed. Dropped when the host tier is off or the
  /// leaf does not fit beside pinned entries. O(path + pages + blocks).
  template <class Tree>
  void demote(const Tree& tree, node_id v) noexcept {
    host_.demote(tree, v, *pool_, copy_);
  }

  /// The longest chain of host entries that continues `prompt`'s HBM match `m` (in m's
  /// namespace) and ends in a checkpoint after m.reusable_tokens and before |prompt|,
  /// pinned until `land`, `settle` or `release_hit` (`host_tokens` 0: none). The chain may
  /// start anywhere up to m.common_prefix (`kv_first`; the tree holds the KV before it). Its
  /// entries' bytes are checked against their CRC-32C first: a changed entry is dropped
  /// (counted in `host_counters().corrupt_dropped`) and never loaded. O(|prompt| + Σ chain
  /// lengths) hash probes and token compares + O(chain bytes) for the CRCs.
  /// @throws bad_alloc with nothing pinned.
  [[nodiscard]] pool_host_hit lookup(std::span<const token_id> prompt, const match_result& m) {
    return host_.lookup(prompt, m);
  }
  /// Keeps only what resumes at `tokens`: the chain up to its entry whose checkpoint is
  /// there. invalid_argument where the chain has none at `tokens`. O(chain entries).
  [[nodiscard]] expected<void> shorten_hit(pool_host_hit& hit, std::int64_t tokens) {
    return host_.shorten_hit(hit, tokens);
  }
  /// Nothing to stage (the pool is the HBM; `land` copies into the reservation):
  /// stale_handle for a hit not outstanding. O(1).
  [[nodiscard]] expected<void> load(const pool_host_hit& hit) { return host_.check(hit); }
  /// Always landed: `land` copies synchronously. O(1).
  [[nodiscard]] expected<bool> loaded(const pool_host_hit&) const { return true; }
  [[nodiscard]] expected<void> wait_loaded(const pool_host_hit&) const { return {}; }
  /// After the request's reservation: copies the hit's KV of [kv_first, reusable_tokens)
  /// into `kv` (the reservation's first extent, whose tokens start at kv_first) and its
  /// checkpoint into `slot` (reserved for the state at reusable_tokens), then lets the hit
  /// go. O(tokens copied · layers + blocks).
  void land(const pool_host_hit& hit, const kv_extent& kv, std::int64_t kv_first, const checkpoint_handle& slot) noexcept {
    host_.land(hit, kv, kv_first, slot, *pool_, copy_, tpp_, layers_);
  }
  /// After the commit: nothing to adopt (the tree took the reservation's pages); lets the
  /// hit go if it was not landed. O(chain entries).
  template <class Tree>
  void settle(const Tree&, std::span<const token_id>, const pool_host_hit& hit) noexcept {
    host_.release(hit);
  }
  /// Gives a hit up: unpins its chain (a stale or empty hit: no-op). O(chain entries).
  void release_hit(const pool_host_hit& hit) noexcept { host_.release(hit); }
  /// Hits looked up and not yet landed, settled or released. O(1).
  [[nodiscard]] std::size_t outstanding_hits() const noexcept { return host_.outstanding_hits(); }

  /// The host tier's memory (its entries' KV pages and SSM blocks, in pages of
  /// gcd(KV page, SSM block) bytes), for inspection and for tests that flip a stored byte
  /// (integrity: `host_counters().corrupt_dropped`). Empty without a host tier.
  [[nodiscard]] std::span<std::byte> host_memory() noexcept { return host_.storage().host_memory(); }

  /// What the lower tiers did.
  [[nodiscard]] const host_tier_counters& host_counters() const noexcept { return host_.storage().counters(); }
  /// Entries in the host tier.
  [[nodiscard]] std::int64_t host_entries() const { return host_.storage().host_entries(); }
  /// Entries in every lower tier (the host tier and the storage tiers below it).
  [[nodiscard]] std::int64_t lower_tier_entries() const noexcept { return host_.storage().live_entries(); }
  /// The lower tiers' table (tier 1: host, then the storage tiers; tier 0 is unused: the
  /// pool is the HBM), for inspection. Requires a host tier.
  [[nodiscard]] const tiered::tiered_store<>& lower_tier_table() const { return host_.storage().table(); }

  [[nodiscard]] const Pool& pool() const noexcept { return *pool_; }

 private:
  [[nodiscard]] std::int64_t blocks(std::int64_t tokens) const noexcept { return ceil_div(tokens, tpp_); }

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
  detail::pool_lower_tier host_;
};

static_assert(state_store<pool_state_store<memory::simulated_vmm_pool<memory::threshold_rebalancer>>>);
static_assert(state_store<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>>);
static_assert(side_placing_store<pool_state_store<memory::simulated_vmm_pool<memory::threshold_rebalancer>>>);
static_assert(side_placing_store<pool_state_store<memory::host_asymmetric_pool<memory::no_rebalancer>>>);
static_assert(paged_state_store<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>>);
static_assert(lower_tier_store<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>,
                               prefix::radix_tree<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>>>);
static_assert(demoting_store<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>,
                             prefix::radix_tree<pool_state_store<memory::host_asymmetric_pool<memory::threshold_rebalancer>>>>);

}  // namespace hybridcache::stores
