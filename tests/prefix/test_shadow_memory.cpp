// The memory reports against the allocator: `prefix_cache::memory_bytes` (a shadow's tree,
// token buffers, scorer index, scratch) and `adaptive_overhead::shadow_bytes` must not
// undercount what the program really holds on the heap, and must not be far above it.
//
// Its own executable: it replaces the global operator new/delete with versions that count
// the live bytes requested (each block carries its size in a header), so the real bytes a
// cache holds are the counter's growth from before it was made to after a random stream.
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <span>
#include <vector>

#include "hybridcache/compose/adaptive_scorer.hpp"
#include "hybridcache/compose/bundles.hpp"
#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/gdsf_scorer.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/prefix/switching_scorer.hpp"
#include "hybridcache/stores/counting_store.hpp"

namespace {

std::atomic<std::int64_t> g_live_bytes{0};
constexpr std::size_t header = 2 * sizeof(std::max_align_t) > 16 ? 2 * sizeof(std::max_align_t) : 16;

void* counted_alloc(std::size_t n, std::size_t align) {
  const std::size_t pad = align > header ? align : header;
  void* raw = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + pad + align - 1) / align * align)
                                                : std::malloc(n + pad);
  if (raw == nullptr) throw std::bad_alloc();
  char* p = static_cast<char*>(raw) + pad;
  reinterpret_cast<std::size_t*>(p)[-1] = n;
  reinterpret_cast<std::size_t*>(p)[-2] = pad;
  g_live_bytes.fetch_add(static_cast<std::int64_t>(n), std::memory_order_relaxed);
  return p;
}
void counted_free(void* q) noexcept {
  if (q == nullptr) return;
  char* p = static_cast<char*>(q);
  g_live_bytes.fetch_sub(static_cast<std::int64_t>(reinterpret_cast<std::size_t*>(p)[-1]), std::memory_order_relaxed);
  std::free(p - reinterpret_cast<std::size_t*>(p)[-2]);
}

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new[](std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { counted_free(p); }

namespace {

const hybridcache::cost_model& model() {
  static const hybridcache::cost_model m(hybridcache::presets::marconi_7b());
  return m;
}

}  // namespace

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::compose;
using stores::counting_store;
using seq_t = std::vector<token_id>;

namespace {

/// Requests as conversations make them: a new turn of an earlier request (all of it, then new
/// tokens), a branch inside one (a prefix of it, then new tokens) or a new conversation; tokens
/// from a small vocabulary, so that requests also diverge inside edges.
struct stream {
  std::mt19937_64 rng;
  std::vector<seq_t> seen;

  seq_t next(std::size_t max_new) {
    seq_t s;
    const auto kind = rng() % 4;  // 0: new conversation, 1: branch, 2-3: next turn
    if (!seen.empty() && kind != 0) {
      const seq_t& from = seen[rng() % seen.size()];
      const std::size_t keep = kind == 1 || from.size() > 600 ? 1 + rng() % from.size() : from.size();
      s.assign(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(keep));
    }
    for (auto more = 1 + rng() % max_new; more > 0; --more) s.push_back(static_cast<token_id>(1 + rng() % 4));
    seen.push_back(s);
    return s;
  }
};

/// Match then commit (a refused commit releases), as a shadow replays a request. Returns
/// the commit's evictions, or -1 when a call failed. No doctest assertion here: they
/// allocate, and the counter must see only the cache.
template <class Cache>
std::int64_t replay(Cache& c, const seq_t& s, std::int64_t in, const cache_salt& salt) {
  const std::span<const token_id> input(s.data(), static_cast<std::size_t>(in));
  auto m = c.match(input, salt);
  if (!m) return -1;
  auto r = c.commit(s, in, &*m);
  if (r) return r->evictions;
  return c.release(*m) ? 0 : -1;
}

/// The real bytes a cache made by `make` holds after `requests` random requests, and what
/// `report(cache)` says it holds (both include the cache object).
template <class Make, class Report>
void check_reported(Make make, Report report, std::uint64_t seed, int requests) {
  stream st{std::mt19937_64(seed), {}};
  const std::int64_t before = g_live_bytes.load();
  auto cache = make();
  std::int64_t evictions = 0;
  bool failed = false;
  for (int i = 0; i < requests; ++i) {
    const seq_t s = st.next(80);
    const auto in = static_cast<std::int64_t>(1 + st.rng() % s.size());
    const cache_salt salt = st.rng() % 5 == 0 ? cache_salt(st.rng() % 3) : std::nullopt;
    const std::int64_t e = replay(*cache, s, in, salt);
    failed = failed || e < 0;
    evictions += e < 0 ? 0 : e;
  }
  st.seen = {};
  st.seen.shrink_to_fit();
  const std::int64_t real = g_live_bytes.load() - before;
  const std::int64_t reported = report(*cache);
  CAPTURE(seed);
  CAPTURE(real);
  CAPTURE(reported);
  CHECK(!failed);
  CHECK(evictions > 0);
  CHECK(reported >= real);                    // never undercounts
  CHECK(reported <= real + real / 20 + 512);  // and is close (the map nodes' guess)
}

template <class Scorer>
using plain_cache = prefix_cache<cost_model, judicious_admission, Scorer, counting_store, no_lock>;

template <class Scorer, class MakeScorer>
void check_plain(MakeScorer make_scorer, std::uint64_t seed) {
  const std::int64_t kv = model().kv_bytes_per_token(), ck = model().ssm_checkpoint_bytes();
  auto make = [&] {
    return std::make_unique<plain_cache<Scorer>>(model(), counting_store(5 * ck + 300 * kv, kv, ck), make_scorer());
  };
  auto report = [](const plain_cache<Scorer>& c) { return static_cast<std::int64_t>(sizeof(c)) + c.memory_bytes(); };
  check_reported(make, report, seed, 400);
}

}  // namespace

TEST_CASE("prefix_cache::memory_bytes is what a metadata-only cache holds on the heap, for every scorer") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    check_plain<lru_scorer>([] { return lru_scorer{}; }, seed);
    check_plain<lru_scorer>([] { return lru_scorer({.ties = lru_ties::python_heapq}); }, seed);
    check_plain<flop_aware_scorer>([] { return flop_aware_scorer(model(), {.alpha = 1.0}); }, seed);
    check_plain<flop_aware_scorer>(
        [] { return flop_aware_scorer(model(), {.alpha = 0.5, .index = flop_index::efficiency_classes}); }, seed);
    check_plain<gdsf_scorer>([] { return gdsf_scorer(model()); }, seed);
    check_plain<lru_flop_gdsf_scorer>(
        [] { return lru_flop_gdsf_scorer(lru_scorer{}, flop_aware_scorer(model()), gdsf_scorer(model()), 1); }, seed);
  }
}

TEST_CASE("adaptive selector: the live cache's memory_bytes plus shadow_bytes is what the whole cache holds") {
  const std::int64_t kv = model().kv_bytes_per_token(), ck = model().ssm_checkpoint_bytes();
  using cache_t = marconi_adaptive_cache<counting_store, no_lock>;
  for (std::uint64_t seed = 1; seed <= 4; ++seed)
    for (const double rate : {1.0, 0.5}) {  // exact shadows; sampled ones (warming, then sampled)
      CAPTURE(rate);
      check_reported(
          [&] {
            return std::make_unique<cache_t>(
                model(), counting_store(8 * ck + 400 * kv, kv, ck),
                make_marconi_adaptive_scorer(
                    model(), {.decay = 0.9,
                              .switch_margin = 0.0,
                              .confidence = 0.0,
                              .sampling = {.rate = rate, .min_sampled_conversations = rate < 1 ? 2.0 : 0.0}}));
          },
          [](const cache_t& c) {
            return static_cast<std::int64_t>(sizeof(c)) + c.memory_bytes() + c.scorer().overhead().shadow_bytes;
          },
          seed, 300);
    }
}

TEST_CASE("admission policies append at most max_positions(view) positions (the cache reserves only that)") {
  std::mt19937_64 rng(7);
  auto check = [&](const auto& policy) {
    std::vector<std::int64_t> out;
    for (int i = 0; i < 20'000; ++i) {
      insertion_view v;
      v.total_tokens = static_cast<std::int64_t>(rng() % 300);
      v.reusable_tokens = static_cast<std::int64_t>(rng() % 300);
      v.common_prefix = std::max(v.reusable_tokens, static_cast<std::int64_t>(rng() % 300));
      v.branch_point = rng() % 2 == 0 ? 0 : static_cast<std::int64_t>(rng() % 300);
      v.lower_branch_point = rng() % 2 == 0 ? 0 : static_cast<std::int64_t>(rng() % 300);
      out.clear();
      policy.select(v, out);
      REQUIRE(static_cast<std::int64_t>(out.size()) <= policy.max_positions(v));
    }
  };
  check(judicious_admission{});
  check(every_block_admission<32>{});
  check(every_block_admission<7>{});
  check(last_token_admission{});
  check(no_admission{});
}
