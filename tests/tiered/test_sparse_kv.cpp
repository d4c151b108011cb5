// Sparsified KV entries stored and served for real (tiered/sparse_kv.hpp): pack / unpack
// against a naive reference, a demotion through tiered_store + host_copy_engine that
// stores and copies only the kept rows, keep 1.0 = the dense path bit for bit, bad input
// refused with nothing changed, attention over the kept rows against an fp64 reference on
// only those positions, and the calibration's per-layer means.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "hybridcache/tiered/host_copy_engine.hpp"
#include "hybridcache/tiered/sparse_kv.hpp"
#include "hybridcache/tiered/sparsify.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

/// Random non-zero bytes (a zero-filled buffer could hide a copy that never happened).
std::vector<std::byte> random_bytes(std::mt19937_64& rng, std::int64_t n) {
  std::vector<std::byte> b(static_cast<std::size_t>(n));
  for (auto& x : b) x = static_cast<std::byte>(1 + rng() % 255);
  return b;
}

/// Random fp32 values (never zero, never NaN) as bytes: KV rows attention can read.
std::vector<std::byte> random_floats(std::mt19937_64& rng, std::int64_t bytes) {
  std::normal_distribution<float> nd;
  std::vector<float> f(static_cast<std::size_t>(bytes / 4));
  for (auto& x : f) {
    do x = nd(rng);
    while (x == 0.0f);
  }
  std::vector<std::byte> b(static_cast<std::size_t>(bytes));
  std::memcpy(b.data(), f.data(), b.size());
  return b;
}

/// Random kept positions: per layer a random count in [0, tokens] (sometimes all, sometimes none).
std::vector<std::vector<std::int32_t>> random_kept(std::mt19937_64& rng, std::int64_t layers, std::int64_t tokens) {
  std::vector<std::vector<std::int32_t>> kept;
  for (std::int64_t l = 0; l < layers; ++l) {
    const auto mode = rng() % 6;
    const std::int64_t k = mode == 0 ? tokens : mode == 1 ? 0 : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(tokens + 1));
    std::vector<std::int32_t> all(static_cast<std::size_t>(tokens));
    for (std::size_t p = 0; p < all.size(); ++p) all[p] = static_cast<std::int32_t>(p);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(static_cast<std::size_t>(k));
    std::sort(all.begin(), all.end());
    kept.push_back(all);
  }
  return kept;
}

sparse_kv_shape random_shape(std::mt19937_64& rng) {
  return {.layers = 1 + static_cast<std::int64_t>(rng() % 4), .tokens = 1 + static_cast<std::int64_t>(rng() % 90),
          .tokens_per_page = std::int64_t{1} << (rng() % 5), .row_bytes = 4 * (1 + static_cast<std::int64_t>(rng() % 12))};
}

/// The naive packed layout, written out independently of the table: layer l's rows start
/// at page Σ_{l' < l} ceil(k_l' / tpp); row i of a layer at page + i / tpp, slot i % tpp.
std::vector<std::byte> naive_pack(const sparse_kv_shape& s, const std::vector<std::vector<std::int32_t>>& kept,
                                  const std::vector<std::byte>& dense) {
  const std::int64_t pb = s.tokens_per_page * s.row_bytes, per = (s.tokens + s.tokens_per_page - 1) / s.tokens_per_page;
  std::int64_t pages = 0;
  for (const auto& k : kept) pages += (static_cast<std::int64_t>(k.size()) + s.tokens_per_page - 1) / s.tokens_per_page;
  std::vector<std::byte> out(static_cast<std::size_t>(pages * pb), std::byte{0});
  std::int64_t at = 0;
  for (std::size_t l = 0; l < kept.size(); ++l) {
    for (std::size_t i = 0; i < kept[l].size(); ++i) {
      const std::int64_t p = kept[l][i];
      const std::int64_t src = (static_cast<std::int64_t>(l) * per + p / s.tokens_per_page) * pb + (p % s.tokens_per_page) * s.row_bytes;
      const std::int64_t dst = (at + static_cast<std::int64_t>(i) / s.tokens_per_page) * pb +
                               (static_cast<std::int64_t>(i) % s.tokens_per_page) * s.row_bytes;
      std::memcpy(out.data() + dst, dense.data() + src, static_cast<std::size_t>(s.row_bytes));
    }
    at += (static_cast<std::int64_t>(kept[l].size()) + s.tokens_per_page - 1) / s.tokens_per_page;
  }
  return out;
}

/// Offset of token p of layer l in a contiguous dense buffer.
std::int64_t dense_offset(const sparse_kv_shape& s, std::int64_t l, std::int64_t p) {
  return (l * s.dense_layer_pages() + p / s.tokens_per_page) * s.page_bytes() + (p % s.tokens_per_page) * s.row_bytes;
}

/// A page list of `n` distinct pages drawn at random from [0, pool): fragmented runs.
page_list random_pages(std::mt19937_64& rng, std::int64_t n, std::int64_t pool) {
  std::vector<std::uint32_t> all(static_cast<std::size_t>(pool));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint32_t>(i);
  std::shuffle(all.begin(), all.end(), rng);
  page_list out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back({all[static_cast<std::size_t>(i)], 1});
  return out;
}

std::vector<tier_config> two_tiers(std::int64_t page, std::int64_t hbm_pages, std::int64_t host_pages) {
  return {{.kind = tier_kind::hbm, .capacity_bytes = hbm_pages * page}, {.kind = tier_kind::host, .capacity_bytes = host_pages * page}};
}

/// Bytes of a copy of an entry, in logical order.
std::vector<std::byte> copy_bytes(host_copy_engine& e, const tier_copy& c, std::int64_t page) {
  std::vector<std::byte> out;
  c.pages.for_each_page([&](std::uint32_t p) {
    const std::byte* b = e.base(c.tier) + static_cast<std::int64_t>(p) * page;
    out.insert(out.end(), b, b + page);
  });
  return out;
}

/// Writes `bytes` into the entry's home copy (logical order).
void write_entry(host_copy_engine& e, const tiered_store<>& s, entry_id id, const std::vector<std::byte>& bytes) {
  const auto row = s.find(id);
  REQUIRE(row);
  const tier_copy& c = row->copies.front();
  std::int64_t i = 0;
  c.pages.for_each_page([&](std::uint32_t p) {
    std::memcpy(e.base(c.tier) + static_cast<std::int64_t>(p) * s.page_bytes(), bytes.data() + i, static_cast<std::size_t>(s.page_bytes()));
    i += s.page_bytes();
  });
}

/// fp64 softmax attention of q over the given K|V rows (fp32 storage), one KV head.
std::vector<double> reference_attention(const std::vector<float>& q, const std::vector<const float*>& rows, kv_row_format f,
                                        int kv_head, double scale) {
  const auto hd = static_cast<std::size_t>(f.head_dim);
  std::vector<double> s(rows.size()), out(hd, 0.0);
  double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double d = 0.0;
    for (std::size_t j = 0; j < hd; ++j) d += static_cast<double>(q[j]) * rows[i][static_cast<std::size_t>(kv_head) * hd + j];
    s[i] = d * scale;
    mx = std::max(mx, s[i]);
  }
  for (auto& x : s) sum += x = std::exp(x - mx);
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t j = 0; j < hd; ++j) out[j] += s[i] / sum * rows[i][(static_cast<std::size_t>(f.kv_heads) + static_cast<std::size_t>(kv_head)) * hd + j];
  return out;
}

}  // namespace

TEST_CASE("sparse kv: pack and unpack against a naive reference, random shapes and per-layer keep counts") {
  std::mt19937_64 rng(38);
  for (int trial = 0; trial < 200; ++trial) {
    CAPTURE(trial);
    const sparse_kv_shape s = random_shape(rng);
    const auto kept = random_kept(rng, s.layers, s.tokens);
    const sparse_kv_table t(s, kept);
    const auto dense = random_bytes(rng, t.dense_bytes());
    const auto packed = pack_sparse_kv(t, dense);
    const auto ref = naive_pack(s, kept, dense);
    REQUIRE(packed.size() == ref.size());
    CHECK(packed == ref);
    std::int64_t rows = 0;
    for (const auto& k : kept) rows += static_cast<std::int64_t>(k.size());
    CHECK(t.table_bytes() == rows * 4);
    // Unpacked into zeros: kept rows are the dense ones, dropped rows stay zero.
    std::vector<std::byte> back(dense.size(), std::byte{0});
    unpack_sparse_kv(t, packed, back);
    for (std::int64_t l = 0; l < s.layers; ++l) {
      const std::set<std::int32_t> keep(kept[static_cast<std::size_t>(l)].begin(), kept[static_cast<std::size_t>(l)].end());
      for (std::int64_t p = 0; p < s.tokens; ++p) {
        const auto off = static_cast<std::size_t>(dense_offset(s, l, p));
        const bool same = std::memcmp(back.data() + off, dense.data() + off, static_cast<std::size_t>(s.row_bytes)) == 0;
        const bool zero = std::all_of(back.begin() + static_cast<std::ptrdiff_t>(off),
                                      back.begin() + static_cast<std::ptrdiff_t>(off) + s.row_bytes, [](std::byte b) { return b == std::byte{0}; });
        CHECK((keep.count(static_cast<std::int32_t>(p)) ? same : zero));
      }
      for (std::int64_t i = 0; i < t.kept(static_cast<std::size_t>(l)); ++i)
        CHECK(t.find(static_cast<std::size_t>(l), t.positions(static_cast<std::size_t>(l))[static_cast<std::size_t>(i)]) == i);
    }
    // The same copies over fragmented page lists in one arena: the bytes land where the
    // reference puts them.
    const std::int64_t pool = t.dense_pages() + t.packed_pages() + 3;
    const page_list all = random_pages(rng, t.dense_pages() + t.packed_pages(), pool);
    const page_list dp = all.slice(0, t.dense_pages()), pp = all.slice(t.dense_pages(), t.packed_pages());
    std::vector<std::byte> arena(static_cast<std::size_t>(pool * s.page_bytes()), std::byte{0});
    for (std::int64_t i = 0; i < t.dense_pages(); ++i)
      std::memcpy(arena.data() + static_cast<std::int64_t>(dp.page(i)) * s.page_bytes(), dense.data() + i * s.page_bytes(),
                  static_cast<std::size_t>(s.page_bytes()));
    const auto spans = plan_sparse_pack(t, dp, pp);
    CHECK(static_cast<std::int64_t>(spans.size()) <= rows);
    std::int64_t copied = 0;
    for (const auto& c : spans) copied += c.bytes;
    CHECK(copied == rows * s.row_bytes);  // only the kept rows move
    std::vector<std::byte> src = arena;
    run_copies(spans, src, arena);
    for (std::int64_t i = 0; i < t.packed_pages(); ++i)
      CHECK(std::memcmp(arena.data() + static_cast<std::int64_t>(pp.page(i)) * s.page_bytes(), ref.data() + i * s.page_bytes(),
                        static_cast<std::size_t>(s.page_bytes())) == 0);
  }
}

TEST_CASE("sparse kv: a demotion through tiered_store and the host copy engine stores and copies only the kept rows") {
  const sparse_kv_shape s{.layers = 3, .tokens = 150, .tokens_per_page = 16, .row_bytes = 256};
  const std::int64_t page = s.page_bytes();
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    CAPTURE(trial);
    tiered_store<> store(two_tiers(page, 80, 80), page);
    host_copy_engine engine(two_tiers(page, 80, 80), page, {.measure_bandwidth = false});
    // Fragment both tiers' free pages first: filler entries, every other one erased.
    for (std::uint64_t f = 100; f < 110; ++f) {
      REQUIRE(store.insert(make_entry_id(f), page * static_cast<std::int64_t>(1 + f % 3), hbm_tier));
      REQUIRE(store.insert(make_entry_id(f + 100), page * static_cast<std::int64_t>(1 + f % 2), tier_id{1}));
    }
    for (std::uint64_t f = 100; f < 110; f += 2) REQUIRE(store.erase(make_entry_id(f)));
    for (std::uint64_t f = 200; f < 210; f += 2) REQUIRE(store.erase(make_entry_id(f)));
    const tier_usage host_before = store.usage(tier_id{1}), hbm_before = store.usage(hbm_tier);
    const sparse_kv_table t(s, random_kept(rng, s.layers, s.tokens));
    if (t.packed_pages() == 0) continue;  // nothing kept: move_sparsified refuses it (tested below)
    const entry_id id = make_entry_id(1);
    REQUIRE(store.insert(id, t.dense_bytes(), hbm_tier));
    const auto dense = random_bytes(rng, t.dense_bytes());
    write_entry(engine, store, id, dense);
    (void)engine.take_stats();
    REQUIRE(move_sparsified(store, engine, id, tier_id{1}, t));
    // The lower tier holds exactly the packed pages; HBM gave the dense ones back.
    CHECK(store.usage(tier_id{1}).used_bytes - host_before.used_bytes == t.packed_bytes());
    std::int64_t pages = 0;
    for (std::size_t l = 0; l < 3; ++l) pages += (t.kept(l) + 15) / 16;
    CHECK(t.packed_bytes() == pages * page);
    CHECK(store.usage(hbm_tier).used_bytes == hbm_before.used_bytes);
    const auto row = store.find(id);
    REQUIRE(row);
    REQUIRE(row->copies.size() == 1);
    CHECK(row->copies.front().tier == tier_id{1});
    CHECK(row->copies.front().bytes == t.packed_bytes());
    std::vector<std::vector<std::int32_t>> kept;
    for (std::size_t l = 0; l < 3; ++l) kept.emplace_back(t.positions(l).begin(), t.positions(l).end());
    CHECK(copy_bytes(engine, row->copies.front(), page) == naive_pack(s, kept, dense));
    std::int64_t rows = 0;
    for (const auto& k : kept) rows += static_cast<std::int64_t>(k.size());
    CHECK(engine.take_stats().bytes == rows * s.row_bytes);  // only the kept rows moved
    // Back to HBM as it is; the view reads each kept row at its position through the pages.
    REQUIRE(move_entry(store, engine, id, hbm_tier));
    const auto home = store.find(id);
    REQUIRE(home);
    CHECK(store.usage(hbm_tier).used_bytes - hbm_before.used_bytes == t.packed_bytes());
    const sparse_kv_view view(t, page_addresses(engine.base(hbm_tier), page, home->copies.front().pages));
    for (std::size_t l = 0; l < 3; ++l)
      for (std::int64_t i = 0; i < view.kept(l); ++i)
        CHECK(std::memcmp(view.row(l, i), dense.data() + dense_offset(s, static_cast<std::int64_t>(l), view.position(l, i)),
                          static_cast<std::size_t>(s.row_bytes)) == 0);
  }
}

TEST_CASE("sparse kv: keep ratio 1.0 is the dense path bit for bit") {
  const sparse_kv_shape s{.layers = 2, .tokens = 100, .tokens_per_page = 16, .row_bytes = 2 * 2 * 8 * 4};
  std::mt19937_64 rng(3);
  std::vector<std::vector<double>> acc(2, std::vector<double>(100));
  for (auto& a : acc)
    for (auto& x : a) x = static_cast<double>(rng() % 1000);
  const std::vector<double> ones{1.0, 1.0};
  const sparse_kv_table t = select_sparse_kv(s, ones, acc, {.recent_window = 4});
  const sparse_kv_table all = sparse_kv_table::dense(s);
  for (std::size_t l = 0; l < 2; ++l)
    CHECK(std::equal(t.positions(l).begin(), t.positions(l).end(), all.positions(l).begin(), all.positions(l).end()));
  CHECK(t.packed_bytes() == t.dense_bytes());
  auto dense = random_floats(rng, t.dense_bytes());
  // The slots past the last token hold no KV (a runtime's last page is partly empty): zero.
  for (std::int64_t l = 0; l < 2; ++l)
    for (std::int64_t p = 100; p < 112; ++p)
      std::memset(dense.data() + dense_offset(s, l, p), 0, static_cast<std::size_t>(s.row_bytes));
  CHECK(pack_sparse_kv(t, dense) == dense);
  // Through the store: the sparsified move and the plain one leave the same bytes and usage.
  const std::int64_t page = s.page_bytes();
  tiered_store<> a(two_tiers(page, 32, 32), page), b(two_tiers(page, 32, 32), page);
  host_copy_engine ea(two_tiers(page, 32, 32), page, {.measure_bandwidth = false}), eb(two_tiers(page, 32, 32), page, {.measure_bandwidth = false});
  REQUIRE(a.insert(make_entry_id(1), t.dense_bytes(), hbm_tier));
  REQUIRE(b.insert(make_entry_id(1), t.dense_bytes(), hbm_tier));
  write_entry(ea, a, make_entry_id(1), dense);
  write_entry(eb, b, make_entry_id(1), dense);
  REQUIRE(move_sparsified(a, ea, make_entry_id(1), tier_id{1}, t));
  REQUIRE(move_entry(b, eb, make_entry_id(1), tier_id{1}));
  CHECK(a.usage(tier_id{1}).used_bytes == b.usage(tier_id{1}).used_bytes);
  // Every token's row is the same (the sparsified move copies rows, not the empty slots).
  const auto sa = copy_bytes(ea, a.find(make_entry_id(1))->copies.front(), page);
  const auto sb = copy_bytes(eb, b.find(make_entry_id(1))->copies.front(), page);
  REQUIRE(sa.size() == sb.size());
  for (std::int64_t l = 0; l < 2; ++l)
    for (std::int64_t p = 0; p < 100; ++p)
      CHECK(std::memcmp(sa.data() + dense_offset(s, l, p), sb.data() + dense_offset(s, l, p), static_cast<std::size_t>(s.row_bytes)) == 0);
  // Attention over the view's rows equals attention over the dense rows, bit for bit.
  const kv_row_format f{.kv_heads = 2, .head_dim = 8};
  const auto& packed = sa;
  std::vector<const std::byte*> pages;
  for (std::int64_t p = 0; p < t.packed_pages(); ++p) pages.push_back(packed.data() + p * page);
  const sparse_kv_view view(t, pages);
  std::normal_distribution<float> nd;
  std::vector<float> q(8), o1(8), o2(8), w1(100), w2(100);
  for (auto& x : q) x = nd(rng);
  for (std::size_t l = 0; l < 2; ++l) {
    std::vector<const float*> r1, r2;
    for (std::int64_t i = 0; i < 100; ++i) {
      r1.push_back(reinterpret_cast<const float*>(view.row(l, i)));
      r2.push_back(reinterpret_cast<const float*>(dense.data() + dense_offset(s, static_cast<std::int64_t>(l), i)));
    }
    attend_rows(q, r1, f, 1, 0.35f, o1, w1);
    attend_rows(q, r2, f, 1, 0.35f, o2, w2);
    CHECK(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(w1.data(), w2.data(), w1.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("sparse kv: the selection keeps ceil(ratio x tokens) per layer, the recent window plus the heaviest, against a reference") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    CAPTURE(trial);
    const sparse_kv_shape s{.layers = 1 + static_cast<std::int64_t>(rng() % 3), .tokens = 1 + static_cast<std::int64_t>(rng() % 70),
                            .tokens_per_page = 16, .row_bytes = 64};
    const sparsify_options o{.recent_window = static_cast<std::int64_t>(rng() % 10)};
    std::vector<double> ratios;
    std::vector<std::vector<double>> acc;
    for (std::int64_t l = 0; l < s.layers; ++l) {
      ratios.push_back(rng() % 5 == 0 ? static_cast<double>(rng() % 2) : static_cast<double>(rng() % 1001) / 1000.0);
      acc.emplace_back();
      for (std::int64_t p = 0; p < s.tokens; ++p) acc.back().push_back(static_cast<double>(rng() % 8));  // ties
    }
    const sparse_kv_table t = select_sparse_kv(s, ratios, acc, o);
    for (std::size_t l = 0; l < ratios.size(); ++l) {
      // Reference: keep = ceil(r T) clamped to [min(T, window), T]; the window's positions,
      // then the rest by score descending, ties by position.
      std::int64_t keep = 0;
      while (static_cast<double>(keep) < ratios[l] * static_cast<double>(s.tokens) - 1e-9) ++keep;
      keep = std::min(s.tokens, std::max(keep, std::min(s.tokens, o.recent_window)));
      const std::int64_t recent = std::min(keep, o.recent_window);
      std::vector<std::int32_t> rest;
      for (std::int64_t p = 0; p < s.tokens - recent; ++p) rest.push_back(static_cast<std::int32_t>(p));
      std::stable_sort(rest.begin(), rest.end(), [&](std::int32_t a, std::int32_t b) { return acc[l][static_cast<std::size_t>(a)] > acc[l][static_cast<std::size_t>(b)]; });
      std::set<std::int32_t> want(rest.begin(), rest.begin() + (keep - recent));
      for (std::int64_t p = s.tokens - recent; p < s.tokens; ++p) want.insert(static_cast<std::int32_t>(p));
      CHECK(std::vector<std::int32_t>(t.positions(l).begin(), t.positions(l).end()) == std::vector<std::int32_t>(want.begin(), want.end()));
    }
  }
  // A profile gives the same table as its keep ratios.
  const sparse_kv_shape s{.layers = 2, .tokens = 64, .tokens_per_page = 16, .row_bytes = 64};
  const std::vector<std::vector<double>> acc(2, std::vector<double>(64, 1.0));
  const auto p = sparsity_profile::from_measurements({0.5, 0.75});
  const std::vector<double> keep{0.5, 0.25};
  CHECK(select_sparse_kv(s, p, acc).kept(0) == select_sparse_kv(s, keep, acc).kept(0));
  CHECK(select_sparse_kv(s, p, acc, {.recent_window = 0}).kept(1) == 16);
}

TEST_CASE("sparse kv: attention over the kept rows equals an fp64 reference on only those positions") {
  std::mt19937_64 rng(5);
  const kv_row_format f{.kv_heads = 2, .head_dim = 16};
  const sparse_kv_shape s{.layers = 2, .tokens = 120, .tokens_per_page = 16, .row_bytes = 2 * 2 * 16 * 4};
  for (int trial = 0; trial < 40; ++trial) {
    CAPTURE(trial);
    // Keys of a few positions get a large component along q: the attention is peaked, so a
    // row read at the wrong position changes the output well beyond the tolerance.
    const auto kept = random_kept(rng, s.layers, s.tokens);
    const sparse_kv_table t(s, kept);
    auto dense = random_floats(rng, t.dense_bytes());
    std::normal_distribution<float> nd;
    std::vector<float> q(16);
    for (auto& x : q) x = nd(rng);
    for (std::int64_t l = 0; l < s.layers; ++l)
      for (std::int64_t p = 0; p < s.tokens; p += 1 + static_cast<std::int64_t>(rng() % 7)) {
        auto* k = reinterpret_cast<float*>(dense.data() + dense_offset(s, l, p)) + 16;  // KV head 1's key
        for (int j = 0; j < 16; ++j) k[j] += 1.5f * q[static_cast<std::size_t>(j)];
      }
    const auto packed = pack_sparse_kv(t, dense);
    std::vector<const std::byte*> pages;
    for (std::int64_t p = 0; p < t.packed_pages(); ++p) pages.push_back(packed.data() + p * s.page_bytes());
    const sparse_kv_view view(t, pages);
    for (std::size_t l = 0; l < 2; ++l) {
      std::vector<const float*> rows, ref_rows;
      for (std::int64_t i = 0; i < view.kept(l); ++i) rows.push_back(reinterpret_cast<const float*>(view.row(l, i)));
      for (const std::int32_t p : kept[l]) ref_rows.push_back(reinterpret_cast<const float*>(dense.data() + dense_offset(s, static_cast<std::int64_t>(l), p)));
      std::vector<float> out(16, 7.0f), w(rows.size());
      attend_rows(q, rows, f, 1, 0.25f, out, w);
      if (rows.empty()) {
        CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
        continue;
      }
      const auto ref = reference_attention(q, ref_rows, f, 1, 0.25);
      double num = 0.0, den = 0.0;
      for (std::size_t j = 0; j < 16; ++j) {
        num = std::max(num, std::fabs(out[j] - ref[j]));
        den = std::max(den, std::fabs(ref[j]));
      }
      CHECK(num <= 1e-5 * den);
      double wsum = 0.0;
      for (float x : w) wsum += x;
      CHECK(wsum == doctest::Approx(1.0).epsilon(1e-5));
    }
  }
}

TEST_CASE("sparse kv: bad input gives a clear error and changes nothing") {
  const sparse_kv_shape s{.layers = 2, .tokens = 40, .tokens_per_page = 16, .row_bytes = 64};
  const std::vector<std::vector<double>> acc(2, std::vector<double>(40, 1.0));
  for (const double bad : {-0.1, 1.1, std::nan("")}) {
    const std::vector<double> r{0.5, bad};
    CHECK_THROWS_WITH_AS((void)select_sparse_kv(s, r, acc), doctest::Contains("layer 1's keep ratio"), invalid_argument);
  }
  const std::vector<double> one{0.5};
  CHECK_THROWS_WITH_AS((void)select_sparse_kv(s, one, acc), doctest::Contains("one keep ratio and one score list per layer"), invalid_argument);
  const std::vector<std::vector<double>> short_acc{std::vector<double>(40, 1.0), std::vector<double>(39, 1.0)};
  const std::vector<double> two{0.5, 0.5};
  CHECK_THROWS_WITH_AS((void)select_sparse_kv(s, two, short_acc), doctest::Contains("layer 1 has 39 scores for 40 tokens"), invalid_argument);
  // Positions out of range, out of order, repeated; a list per layer.
  using lists = std::vector<std::vector<std::int32_t>>;
  CHECK_THROWS_WITH_AS(sparse_kv_table(s, lists{{0, 1}, {3, 40}}), doctest::Contains("layer 1, position 40 is outside [0, 40)"), invalid_argument);
  CHECK_THROWS_WITH_AS(sparse_kv_table(s, lists{{-1}, {}}), doctest::Contains("layer 0, position -1"), invalid_argument);
  CHECK_THROWS_WITH_AS(sparse_kv_table(s, lists{{5, 4}, {}}), doctest::Contains("not above the previous one"), invalid_argument);
  CHECK_THROWS_WITH_AS(sparse_kv_table(s, lists{{5, 5}, {}}), doctest::Contains("not above the previous one"), invalid_argument);
  CHECK_THROWS_WITH_AS(sparse_kv_table(s, lists{{5}}), doctest::Contains("1 position lists for 2 layers"), invalid_argument);
  CHECK_THROWS_WITH_AS(sparse_kv_table({.layers = 2, .tokens = 0, .tokens_per_page = 16, .row_bytes = 64}, lists{{}, {}}),
                       doctest::Contains("must be > 0"), invalid_argument);
  // Mismatched sizes: nothing written.
  const sparse_kv_table t(s, lists{{1, 2, 30}, {39}});
  std::mt19937_64 rng(1);
  const auto dense = random_bytes(rng, t.dense_bytes());
  CHECK_THROWS_WITH_AS((void)pack_sparse_kv(t, std::span(dense).first(dense.size() - 1)), doctest::Contains("dense bytes, the table needs"), invalid_argument);
  auto target = random_bytes(rng, t.dense_bytes());
  const auto target_before = target;
  const auto packed = pack_sparse_kv(t, dense);
  CHECK_THROWS_WITH_AS(unpack_sparse_kv(t, std::span(packed).first(packed.size() - 64), target), doctest::Contains("packed /"), invalid_argument);
  CHECK_THROWS_WITH_AS(unpack_sparse_kv(t, packed, std::span(target).first(target.size() - 1)), doctest::Contains("packed /"), invalid_argument);
  CHECK(target == target_before);
  CHECK_THROWS_WITH_AS((void)plan_sparse_pack(t, page_list::contiguous(0, 3), page_list::contiguous(9, 2)),
                       doctest::Contains("3 dense / 2 packed pages given, the table needs 6 / 2"), invalid_argument);
  const std::vector<copy_span> outside{{0, 0, 64}, {0, static_cast<std::int64_t>(target.size()) - 32, 64}};
  CHECK_THROWS_WITH_AS(run_copies(outside, dense, target), doctest::Contains("outside its buffers"), invalid_argument);
  CHECK(target == target_before);  // not even the first, valid copy ran
  CHECK_THROWS_WITH_AS(sparse_kv_view(t, {packed.data()}), doctest::Contains("1 page addresses for 2 packed pages"), invalid_argument);
  CHECK_THROWS_WITH_AS(sparse_kv_view(t, {packed.data(), nullptr}), doctest::Contains("null page address"), invalid_argument);
  std::vector<float> q(8), out(8), w(1);
  const std::vector<const float*> rows{reinterpret_cast<const float*>(dense.data())};
  CHECK_THROWS_WITH_AS(attend_rows(q, rows, {.kv_heads = 1, .head_dim = 8}, 1, 1.0f, out, w), doctest::Contains("sizes do not match"), invalid_argument);
  // The store: a table of another size, or one keeping nothing, is refused; the store, the
  // arenas and the engine's counters are as before.
  const std::int64_t page = s.page_bytes();
  tiered_store<> store(two_tiers(page, 16, 16), page);
  host_copy_engine engine(two_tiers(page, 16, 16), page, {.measure_bandwidth = false});
  REQUIRE(store.insert(make_entry_id(1), t.dense_bytes(), hbm_tier));
  write_entry(engine, store, make_entry_id(1), dense);
  const auto snapshot = [&] {
    const auto row = store.find(make_entry_id(1));
    return std::make_tuple(store.usage(hbm_tier).used_bytes, store.usage(tier_id{1}).used_bytes, row->copies.size(),
                           row->copies.front().tier, row->copies.front().bytes, copy_bytes(engine, row->copies.front(), page));
  };
  const auto before = snapshot();
  (void)engine.take_stats();
  const sparse_kv_table other({.layers = 2, .tokens = 60, .tokens_per_page = 16, .row_bytes = 64}, lists{{1}, {2}});
  const sparse_kv_table none(s, lists{{}, {}});
  const sparse_kv_table wrong_page({.layers = 2, .tokens = 40, .tokens_per_page = 8, .row_bytes = 128}, lists{{1}, {2}});
  CHECK(move_sparsified(store, engine, make_entry_id(1), tier_id{1}, other).error() == errc::invalid_argument);
  CHECK(move_sparsified(store, engine, make_entry_id(1), tier_id{1}, none).error() == errc::invalid_argument);
  CHECK(move_sparsified(store, engine, make_entry_id(1), tier_id{1}, wrong_page).error() == errc::invalid_argument);
  CHECK(move_sparsified(store, engine, make_entry_id(2), tier_id{1}, t).error() == errc::not_found);
  CHECK(move_sparsified(store, engine, make_entry_id(1), hbm_tier, t).error() == errc::invalid_argument);
  CHECK(snapshot() == before);
  CHECK(engine.take_stats().bytes == 0);
  // A failed copy: the reservation goes, the dense copy stays.
  engine.set_fault_hook([](const copy_span&) { return true; });
  CHECK(move_sparsified(store, engine, make_entry_id(1), tier_id{1}, t).error() == errc::busy);
  engine.set_fault_hook({});
  CHECK(snapshot() == before);
  REQUIRE(move_sparsified(store, engine, make_entry_id(1), tier_id{1}, t));
  CHECK(store.usage(tier_id{1}).used_bytes == t.packed_bytes());
}

TEST_CASE("sparsity calibration: each layer's mean row sparsity, short rows skipped, the profile capped") {
  std::mt19937_64 rng(9);
  sparsity_calibration cal(3, {.relative_threshold = 0.01, .min_keys = 4, .max_sparsity = 0.9});
  std::vector<double> sum(3, 0.0);
  std::vector<std::int64_t> n(3, 0);
  for (int r = 0; r < 300; ++r) {
    const auto l = static_cast<std::size_t>(rng() % 3);
    std::vector<float> row(1 + rng() % 30);
    for (auto& x : row) x = rng() % 4 == 0 ? 1e-4f : static_cast<float>(rng() % 100 + 1) / 100.0f;
    cal.add_row(l, std::span<const float>(row));
    if (row.size() < 4) continue;
    const float mx = *std::max_element(row.begin(), row.end());
    double zeros = 0;
    for (float x : row) zeros += x < 0.01 * mx ? 1 : 0;
    sum[l] += zeros / static_cast<double>(row.size());
    n[l] += 1;
  }
  for (std::size_t l = 0; l < 3; ++l) {
    CHECK(cal.rows(l) == n[l]);
    CHECK(cal.mean(l) == doctest::Approx(sum[l] / static_cast<double>(n[l])));
  }
  const auto p = cal.profile();
  for (std::size_t l = 0; l < 3; ++l) CHECK(p.sparsity[l] == doctest::Approx(std::min(0.9, sum[l] / static_cast<double>(n[l]))));
  sparsity_calibration capped(1, {.min_keys = 1, .max_sparsity = 0.5});
  const std::vector<double> sparse_row{1.0, 0.0, 0.0, 0.0};
  capped.add_row(0, std::span<const double>(sparse_row));
  CHECK(capped.mean(0) == doctest::Approx(0.75));
  CHECK(capped.profile().sparsity[0] == doctest::Approx(0.5));
  sparsity_calibration empty(2);
  CHECK_THROWS_WITH_AS((void)empty.profile(), doctest::Contains("layer 0 counted no row"), invalid_argument);
  CHECK_THROWS_AS(sparsity_calibration(0), invalid_argument);
  CHECK_THROWS_AS(sparsity_calibration(1, {.max_sparsity = 1.0}), invalid_argument);
}
