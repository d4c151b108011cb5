// hybridcache/tiered/sparse_kv.hpp
//
// A sparsified KV entry that is really stored and served (CaR §III-D): when an entry's
// attention KV leaves HBM, each layer keeps only its own share of the tokens (the
// profile's keep ratio, the tokens chosen by H2O's accumulated attention plus a recent
// window: sparsify.hpp), and only those tokens' rows are copied and occupy the lower tier.
// A runtime that loads the entry back reads the kept rows with their original positions.
//
// Layouts. One row is one token's K and V of one attention layer (`row_bytes`), and a page
// holds `tokens_per_page` rows. The dense entry is layer-major: layer l's rows are its
// logical pages [l · P, (l + 1) · P), P = ceil(tokens / tokens_per_page), token p at page
// l · P + p / tokens_per_page, slot p % tokens_per_page. The packed entry is layer-major
// too, each layer starting on a page boundary: layer l's k_l kept rows fill
// ceil(k_l / tokens_per_page) pages densely, in ascending position order. The position
// table (`sparse_kv_table`) says which position each packed row is; it is metadata kept by
// the runtime beside the entry id (4 bytes per kept row per layer: `table_bytes`), not in
// the tier's pages, like the store's page lists.
//
//   sparse_kv_table             the kept positions of every layer (validated: ascending,
//                               distinct, inside the entry); `select_sparse_kv` builds one
//                               from keep ratios (or a sparsity_profile) and H2O scores
//   plan_sparse_pack / _unpack  the copies gathering the kept rows of a dense entry into a
//                               packed one, or scattering them back to their positions
//   pack_sparse_kv / unpack_... the same over two byte buffers (one arena, no store)
//   move_sparsified             a demotion through tiered_store + a copy engine with
//                               `submit(src, dst, spans, stream)` (host_copy_engine): the
//                               destination holds packed_bytes (page-rounded); only the
//                               kept rows are copied
//   sparse_kv_view              the packed entry as attention reads it: per layer, row i
//                               through the entry's block table, and its position
//   attend_rows                 the host kernel: one query head over a list of K|V rows
//
// Loading back: the packed copy moves as it is (`move_entry`); it lands whole, not layer by
// layer (its layers have different page counts). Insert the dense entry with segments = 1,
// or the packed copy may not divide into the entry's segments (tiered_store refuses such a
// move back). Memory tiers only: a disk or Redis tier takes whole pages (gather into the
// host tier first, then move the packed entry down as it is).
//
// Scope: attention KV only; a recurrent checkpoint is never sparsified (sparsify.hpp).
// Positions are what a RoPE-free attention needs (the tiny runtime's); a RoPE model would
// store rotated keys, which stay valid when the rows are gathered.
//
// Costs (L layers, T tokens, k kept rows in all, r page runs of the page lists):
// sparse_kv_table O(k) to validate, find O(log k_l); select_sparse_kv O(L · T log T);
// plan_sparse_pack/unpack O(pages + k) time, one span per run of rows adjacent in both
// layouts (at most k); pack/unpack_sparse_kv O(k · row_bytes) bytes copied;
// move_sparsified as move_entry plus the plan; sparse_kv_view O(packed pages) to build,
// row O(1); attend_rows O(rows · head_dim), no allocation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/concepts/copy_engine.hpp"
#include "hybridcache/core/error.hpp"
#include "hybridcache/core/expected.hpp"
#include "hybridcache/core/page_runs.hpp"
#include "hybridcache/tiered/copy_plan.hpp"
#include "hybridcache/tiered/sparsify.hpp"

namespace hybridcache::tiered {

/// The attention KV of one entry, as a runtime lays it out in pages.
struct sparse_kv_shape {
  std::int64_t layers = 0;           ///< attention layers
  std::int64_t tokens = 0;           ///< tokens of the entry
  std::int64_t tokens_per_page = 0;  ///< rows per page
  std::int64_t row_bytes = 0;        ///< one token's K and V of one layer

  [[nodiscard]] std::int64_t page_bytes() const noexcept { return tokens_per_page * row_bytes; }
  /// Pages of one layer in the dense layout.
  [[nodiscard]] std::int64_t dense_layer_pages() const noexcept { return (tokens + tokens_per_page - 1) / tokens_per_page; }
};

/// @throws invalid_argument naming the field when a value is not positive or the dense
///         entry's bytes would not fit in int64 (positions are int32).
inline void validate_shape(const sparse_kv_shape& s) {
  HYBRIDCACHE_EXPECTS(s.layers > 0 && s.tokens > 0 && s.tokens_per_page > 0 && s.row_bytes > 0, invalid_argument,
                      "sparse_kv_shape: layers, tokens, tokens_per_page and row_bytes must be > 0");
  HYBRIDCACHE_EXPECTS(s.tokens <= std::numeric_limits<std::int32_t>::max(), invalid_argument,
                      "sparse_kv_shape: tokens must fit an int32 position");
  constexpr std::int64_t two31 = std::int64_t{1} << 31;
  HYBRIDCACHE_EXPECTS(s.tokens_per_page < two31 && s.row_bytes < two31 && s.layers < two31, invalid_argument,
                      "sparse_kv_shape: tokens_per_page, row_bytes and layers must be below 2^31");
  const std::int64_t pages = s.dense_layer_pages() * s.layers;  // < 2^62: no overflow
  HYBRIDCACHE_EXPECTS(pages < (std::int64_t{1} << 32) && s.page_bytes() <= std::numeric_limits<std::int64_t>::max() / pages,
                      invalid_argument, "sparse_kv_shape: the dense entry's pages or bytes do not fit");
}

/// Which tokens every layer of one entry keeps: the position table of a packed entry.
class sparse_kv_table {
 public:
  /// `kept[l]`: the positions layer l keeps, ascending, distinct, in [0, tokens) (a layer may
  /// keep none). @throws invalid_argument naming the layer and position (a bad shape, one
  /// list per layer, a position out of range or out of order).
  sparse_kv_table(sparse_kv_shape shape, std::vector<std::vector<std::int32_t>> kept) : shape_(shape) {
    validate_shape(shape_);
    HYBRIDCACHE_EXPECTS(static_cast<std::int64_t>(kept.size()) == shape_.layers, invalid_argument,
                        "sparse_kv_table: " + std::to_string(kept.size()) + " position lists for " +
                            std::to_string(shape_.layers) + " layers");
    first_page_.assign(1, 0);
    for (std::size_t l = 0; l < kept.size(); ++l) {
      const auto& k = kept[l];
      for (std::size_t i = 0; i < k.size(); ++i)
        HYBRIDCACHE_EXPECTS(k[i] >= 0 && k[i] < shape_.tokens && (i == 0 || k[i] > k[i - 1]), invalid_argument,
                            "sparse_kv_table: layer " + std::to_string(l) + ", position " + std::to_string(k[i]) +
                                " is outside [0, " + std::to_string(shape_.tokens) + ") or not above the previous one");
      first_page_.push_back(first_page_.back() + pages_for(static_cast<std::int64_t>(k.size())));
    }
    kept_ = std::move(kept);
  }

  /// Every position of every layer (the dense entry, packed: bit for bit the dense layout).
  [[nodiscard]] static sparse_kv_table dense(sparse_kv_shape shape) {
    validate_shape(shape);
    std::vector<std::int32_t> all(static_cast<std::size_t>(shape.tokens));
    for (std::size_t p = 0; p < all.size(); ++p) all[p] = static_cast<std::int32_t>(p);
    return {shape, std::vector<std::vector<std::int32_t>>(static_cast<std::size_t>(shape.layers), all)};
  }

  [[nodiscard]] const sparse_kv_shape& shape() const noexcept { return shape_; }
  /// Rows layer l keeps.
  [[nodiscard]] std::int64_t kept(std::size_t l) const { return static_cast<std::int64_t>(kept_.at(l).size()); }
  /// Their positions, ascending: packed row i of layer l is token positions(l)[i].
  [[nodiscard]] std::span<const std::int32_t> positions(std::size_t l) const { return kept_.at(l); }
  /// Packed row of `position` in layer l, or -1 when the layer dropped it. O(log kept).
  [[nodiscard]] std::int64_t find(std::size_t l, std::int64_t position) const {
    const auto& k = kept_.at(l);
    const auto it = std::lower_bound(k.begin(), k.end(), position);
    return it != k.end() && *it == position ? it - k.begin() : -1;
  }
  /// The packed entry's first page of layer l, and its page count.
  [[nodiscard]] std::int64_t first_page(std::size_t l) const { return first_page_.at(l); }
  [[nodiscard]] std::int64_t layer_pages(std::size_t l) const { return first_page_.at(l + 1) - first_page_.at(l); }
  [[nodiscard]] std::int64_t packed_pages() const noexcept { return first_page_.back(); }
  /// Bytes the packed entry occupies in a tier (whole pages).
  [[nodiscard]] std::int64_t packed_bytes() const noexcept { return packed_pages() * shape_.page_bytes(); }
  [[nodiscard]] std::int64_t dense_pages() const noexcept { return shape_.dense_layer_pages() * shape_.layers; }
  [[nodiscard]] std::int64_t dense_bytes() const noexcept { return dense_pages() * shape_.page_bytes(); }
  /// Bytes of the position table (held beside the entry, not in its pages).
  [[nodiscard]] std::int64_t table_bytes() const noexcept {
    std::int64_t k = 0;
    for (const auto& v : kept_) k += static_cast<std::int64_t>(v.size());
    return k * static_cast<std::int64_t>(sizeof(std::int32_t));
  }

 private:
  [[nodiscard]] std::int64_t pages_for(std::int64_t rows) const noexcept {
    return (rows + shape_.tokens_per_page - 1) / shape_.tokens_per_page;
  }
  sparse_kv_shape shape_;
  std::vector<std::vector<std::int32_t>> kept_;
  std::vector<std::int64_t> first_page_;  // layers + 1 prefix sums of layer_pages
};

/// Rows out of `tokens` a layer keeps at `keep_ratio`: ceil(ratio · tokens), at least the
/// recent window, at most all (sparsify.hpp's kept_tokens for one ratio).
[[nodiscard]] inline std::int64_t kept_for_ratio(double keep_ratio, std::int64_t tokens, const sparsify_options& o = {}) {
  const auto k = static_cast<std::int64_t>(std::ceil(keep_ratio * static_cast<double>(tokens) - 1e-9));
  return std::min(tokens, std::max(k, std::min(tokens, std::max<std::int64_t>(o.recent_window, 0))));
}

/// The table keeping, in layer l, kept_for_ratio(keep_ratios[l]) tokens chosen by
/// `select_tokens` over `accumulated[l]` (H2O: attention each position received, summed
/// over the queries and heads seen). @throws invalid_argument for a ratio outside [0, 1]
/// (or NaN), a ratio or score list per layer missing, or a score list not `tokens` long.
[[nodiscard]] inline sparse_kv_table select_sparse_kv(const sparse_kv_shape& shape, std::span<const double> keep_ratios,
                                                      std::span<const std::vector<double>> accumulated,
                                                      const sparsify_options& o = {}) {
  validate_shape(shape);
  HYBRIDCACHE_EXPECTS(static_cast<std::int64_t>(keep_ratios.size()) == shape.layers &&
                          static_cast<std::int64_t>(accumulated.size()) == shape.layers,
                      invalid_argument, "select_sparse_kv: one keep ratio and one score list per layer needed");
  std::vector<std::vector<std::int32_t>> kept;
  for (std::size_t l = 0; l < keep_ratios.size(); ++l) {
    HYBRIDCACHE_EXPECTS(keep_ratios[l] >= 0.0 && keep_ratios[l] <= 1.0, invalid_argument,
                        "select_sparse_kv: layer " + std::to_string(l) + "'s keep ratio " + std::to_string(keep_ratios[l]) +
                            " is outside [0, 1]");
    HYBRIDCACHE_EXPECTS(static_cast<std::int64_t>(accumulated[l].size()) == shape.tokens, invalid_argument,
                        "select_sparse_kv: layer " + std::to_string(l) + " has " + std::to_string(accumulated[l].size()) +
                            " scores for " + std::to_string(shape.tokens) + " tokens");
  }
  for (std::size_t l = 0; l < keep_ratios.size(); ++l)
    kept.push_back(select_tokens(accumulated[l], kept_for_ratio(keep_ratios[l], shape.tokens, o), o.recent_window));
  return {shape, std::move(kept)};
}

/// The same with a profile's keep ratios (1 − sparsity per attention layer).
[[nodiscard]] inline sparse_kv_table select_sparse_kv(const sparse_kv_shape& shape, const sparsity_profile& p,
                                                      std::span<const std::vector<double>> accumulated,
                                                      const sparsify_options& o = {}) {
  std::vector<double> keep;
  for (std::size_t l = 0; l < p.sparsity.size(); ++l) keep.push_back(p.keep_ratio(l));
  return select_sparse_kv(shape, keep, accumulated, o);
}

namespace detail {

// A page list as one page index per logical page (O(1) lookups while planning).
[[nodiscard]] inline std::vector<std::uint32_t> expand_pages(const page_list& l) {
  std::vector<std::uint32_t> out;
  out.reserve(static_cast<std::size_t>(l.size()));
  l.for_each_page([&](std::uint32_t p) { out.push_back(p); });
  return out;
}

// Copies between the dense and the packed layout: every kept row once, in packed order,
// rows adjacent in both layouts merged (a kept run inside one page on both sides).
// to_packed: dense -> packed (src = dense); else packed -> dense.
[[nodiscard]] inline std::vector<copy_span> plan_rows(const sparse_kv_table& t, const page_list& dense, const page_list& packed,
                                                      bool to_packed) {
  HYBRIDCACHE_EXPECTS(dense.size() == t.dense_pages() && packed.size() == t.packed_pages(), invalid_argument,
                      "plan_sparse_kv: " + std::to_string(dense.size()) + " dense / " + std::to_string(packed.size()) +
                          " packed pages given, the table needs " + std::to_string(t.dense_pages()) + " / " +
                          std::to_string(t.packed_pages()));
  const auto dp = expand_pages(dense), pp = expand_pages(packed);
  const sparse_kv_shape& s = t.shape();
  const std::int64_t tpp = s.tokens_per_page, pb = s.page_bytes(), rb = s.row_bytes, per = s.dense_layer_pages();
  std::vector<copy_span> out;
  for (std::size_t l = 0; l < static_cast<std::size_t>(s.layers); ++l) {
    const auto pos = t.positions(l);
    for (std::size_t i = 0; i < pos.size(); ++i) {
      const auto ii = static_cast<std::int64_t>(i);
      const std::int64_t d = dp[static_cast<std::size_t>(static_cast<std::int64_t>(l) * per + pos[i] / tpp)] * pb + (pos[i] % tpp) * rb;
      const std::int64_t k = pp[static_cast<std::size_t>(t.first_page(l) + ii / tpp)] * pb + (ii % tpp) * rb;
      const std::int64_t src = to_packed ? d : k, dst = to_packed ? k : d;
      if (!out.empty() && out.back().src_offset + out.back().bytes == src && out.back().dst_offset + out.back().bytes == dst)
        out.back().bytes += rb;
      else
        out.push_back({src, dst, rb});
    }
  }
  return out;
}

}  // namespace detail

/// The copies gathering the table's kept rows from a dense entry's pages (`dense`, logical
/// order, t.dense_pages()) into a packed entry's pages (`packed`, t.packed_pages()); byte
/// offsets are page · page_bytes + slot · row_bytes. @throws invalid_argument on page
/// counts that do not match the table.
[[nodiscard]] inline std::vector<copy_span> plan_sparse_pack(const sparse_kv_table& t, const page_list& dense,
                                                             const page_list& packed) {
  return detail::plan_rows(t, dense, packed, true);
}
/// The reverse: each packed row back to its position in a dense entry's pages (the rows a
/// layer dropped are not written).
[[nodiscard]] inline std::vector<copy_span> plan_sparse_unpack(const sparse_kv_table& t, const page_list& packed,
                                                               const page_list& dense) {
  return detail::plan_rows(t, dense, packed, false);
}

/// Runs copies between two buffers. @throws invalid_argument, writing nothing, when a copy
/// reaches outside either buffer.
inline void run_copies(std::span<const copy_span> spans, std::span<const std::byte> src, std::span<std::byte> dst) {
  for (const copy_span& c : spans)
    HYBRIDCACHE_EXPECTS(c.bytes >= 0 && c.src_offset >= 0 && c.dst_offset >= 0 &&
                            c.src_offset <= static_cast<std::int64_t>(src.size()) - c.bytes &&
                            c.dst_offset <= static_cast<std::int64_t>(dst.size()) - c.bytes,
                        invalid_argument, "run_copies: a copy reaches outside its buffers");
  for (const copy_span& c : spans)
    if (c.bytes > 0) std::memcpy(dst.data() + c.dst_offset, src.data() + c.src_offset, static_cast<std::size_t>(c.bytes));
}

/// The packed entry of a dense one held in one buffer (pages 0, 1, ... in order).
/// @throws invalid_argument unless dense.size() == t.dense_bytes().
[[nodiscard]] inline std::vector<std::byte> pack_sparse_kv(const sparse_kv_table& t, std::span<const std::byte> dense) {
  HYBRIDCACHE_EXPECTS(static_cast<std::int64_t>(dense.size()) == t.dense_bytes(), invalid_argument,
                      "pack_sparse_kv: " + std::to_string(dense.size()) + " dense bytes, the table needs " +
                          std::to_string(t.dense_bytes()));
  std::vector<std::byte> packed(static_cast<std::size_t>(t.packed_bytes()));
  const auto spans = plan_sparse_pack(t, page_list::contiguous(0, static_cast<std::uint32_t>(t.dense_pages())),
                                      page_list::contiguous(0, static_cast<std::uint32_t>(t.packed_pages())));
  run_copies(spans, dense, packed);
  return packed;
}

/// Writes a packed entry's rows to their positions in a dense buffer (other rows untouched).
/// @throws invalid_argument, writing nothing, unless the sizes are the table's.
inline void unpack_sparse_kv(const sparse_kv_table& t, std::span<const std::byte> packed, std::span<std::byte> dense) {
  HYBRIDCACHE_EXPECTS(static_cast<std::int64_t>(packed.size()) == t.packed_bytes() &&
                          static_cast<std::int64_t>(dense.size()) == t.dense_bytes(),
                      invalid_argument,
                      "unpack_sparse_kv: " + std::to_string(packed.size()) + " packed / " + std::to_string(dense.size()) +
                          " dense bytes, the table needs " + std::to_string(t.packed_bytes()) + " / " +
                          std::to_string(t.dense_bytes()));
  const auto spans = plan_sparse_unpack(t, page_list::contiguous(0, static_cast<std::uint32_t>(t.packed_pages())),
                                        page_list::contiguous(0, static_cast<std::uint32_t>(t.dense_pages())));
  run_copies(spans, packed, dense);
}

/// Demotes (or promotes) entry `id`'s home copy to tier `dst` sparsified: the destination
/// holds t.packed_bytes() (whole pages), and the engine copies only the kept rows
/// (`plan_sparse_pack`), on the stream of the move's direction. The source goes when the
/// copy lands, as with `move_entry`; on any failure the entry stays as it was and the
/// reservation is released. Errors: invalid_argument when the home copy is not the
/// table's dense entry (its bytes, the store's page size) or the table keeps no row at
/// all (drop the entry instead); then the store's prepare_move errors and the engine's.
template <class Store, class Engine>
[[nodiscard]] expected<void> move_sparsified(Store& store, Engine& engine, entry_id id, tier_id dst, const sparse_kv_table& t) {
  const auto e = store.find(id);
  if (!e) return unexpected(errc::not_found);
  if (e->bytes() != t.dense_bytes() || store.page_bytes() != t.shape().page_bytes() || t.packed_pages() == 0)
    return unexpected(errc::invalid_argument);
  auto ticket = store.prepare_move(id, dst, t.packed_bytes());
  if (!ticket) return unexpected(ticket.error());
  try {
    auto ev = engine.submit(ticket->src, ticket->dst, plan_sparse_pack(t, ticket->src_pages, ticket->dst_pages),
                            stream_for(*ticket));
    if (!ev) {
      (void)store.complete_move(*ticket, false);
      return unexpected(ev.error());
    }
    const auto done = engine.wait(*ev);
    const auto fin = store.complete_move(*ticket, done.has_value());
    if (!done) return done;
    return fin;
  } catch (...) {
    (void)store.complete_move(*ticket, false);  // no-op if already completed
    throw;
  }
}

/// A packed entry as attention reads it: the address of each of its pages (its block
/// table, logical order) and the table. Row i of layer l is token positions(l)[i]. Holds
/// the table by reference: it must outlive the view.
class sparse_kv_view {
 public:
  /// @throws invalid_argument unless there is one non-null address per packed page.
  sparse_kv_view(const sparse_kv_table& table, std::vector<const std::byte*> pages) : table_(&table), pages_(std::move(pages)) {
    HYBRIDCACHE_EXPECTS(static_cast<std::int64_t>(pages_.size()) == table.packed_pages(), invalid_argument,
                        "sparse_kv_view: " + std::to_string(pages_.size()) + " page addresses for " +
                            std::to_string(table.packed_pages()) + " packed pages");
    for (const std::byte* p : pages_) HYBRIDCACHE_EXPECTS(p != nullptr, invalid_argument, "sparse_kv_view: a null page address");
  }
  [[nodiscard]] const sparse_kv_table& table() const noexcept { return *table_; }
  [[nodiscard]] std::int64_t kept(std::size_t l) const { return table_->kept(l); }
  [[nodiscard]] std::int32_t position(std::size_t l, std::int64_t i) const { return table_->positions(l)[static_cast<std::size_t>(i)]; }
  /// Packed row i of layer l (i < kept(l)).
  [[nodiscard]] const std::byte* row(std::size_t l, std::int64_t i) const {
    const std::int64_t tpp = table_->shape().tokens_per_page;
    return pages_[static_cast<std::size_t>(table_->first_page(l) + i / tpp)] + (i % tpp) * table_->shape().row_bytes;
  }

 private:
  const sparse_kv_table* table_;
  std::vector<const std::byte*> pages_;
};

/// The addresses of a copy's pages in an arena: base + page · page_bytes, logical order.
[[nodiscard]] inline std::vector<const std::byte*> page_addresses(const std::byte* base, std::int64_t page_bytes,
                                                                  const page_list& pages) {
  std::vector<const std::byte*> out;
  out.reserve(static_cast<std::size_t>(pages.size()));
  pages.for_each_page([&](std::uint32_t p) { out.push_back(base + static_cast<std::int64_t>(p) * page_bytes); });
  return out;
}

/// One row of fp32 KV: K of every KV head, then V of every KV head.
struct kv_row_format {
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 0;
};

/// Softmax attention of one query head over `rows` (K|V rows, `f`), in the order given:
/// out = Σ_i w_i V_i with w = softmax(scale · q·K_i); `weights` (rows.size()) receives w.
/// The float operations and their order are a plain loop's over positions (dot products in
/// index order, max, exp, sum in row order, then w_i = e_i / sum), so over the same rows it
/// equals such a loop bit for bit. An empty list leaves out zero. @throws invalid_argument
/// on sizes that do not match `f` (out: head_dim, q: head_dim, weights: rows).
inline void attend_rows(std::span<const float> q, std::span<const float* const> rows, kv_row_format f, std::int32_t kv_head,
                        float scale, std::span<float> out, std::span<float> weights) {
  const auto hd = static_cast<std::size_t>(f.head_dim);
  HYBRIDCACHE_EXPECTS(f.head_dim > 0 && f.kv_heads > 0 && kv_head >= 0 && kv_head < f.kv_heads && q.size() == hd &&
                          out.size() == hd && weights.size() == rows.size(),
                      invalid_argument, "attend_rows: sizes do not match the row format");
  const std::size_t k_off = static_cast<std::size_t>(kv_head) * hd, v_off = static_cast<std::size_t>(f.kv_heads) * hd + k_off;
  float mx = -INFINITY;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const float* k = rows[i] + k_off;
    float d = 0.0f;
    for (std::size_t j = 0; j < hd; ++j) d += q[j] * k[j];
    weights[i] = d * scale;
    mx = std::max(mx, d * scale);
  }
  float sum = 0.0f;
  for (std::size_t i = 0; i < rows.size(); ++i) sum += weights[i] = std::exp(weights[i] - mx);
  std::fill(out.begin(), out.end(), 0.0f);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const float* v = rows[i] + v_off;
    const float w = weights[i] / sum;
    for (std::size_t j = 0; j < hd; ++j) out[j] += w * v[j];
    weights[i] = w;
  }
}

}  // namespace hybridcache::tiered
