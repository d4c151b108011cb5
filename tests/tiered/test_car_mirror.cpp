// CaR's score below HBM (issue #38 item 1): the board's scores copied onto the tiered
// store's entries (`tiered::mirror_score`, `tiered_state_store::set_score`), so that the
// watermark cleaner and the tiers below HBM order by CaR's score (`car_score_demotion`)
// instead of by recency. Checked: the table's set/add_score and their errors; a hand-made
// cache whose cleaner pre-writes a different entry than LRU's; and random conversations
// against a reference that orders the cleaner's walk by the board's scores directly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/tiered_state_store.hpp"
#include "hybridcache/tiered/car_score.hpp"
#include "hybridcache/tiered/demotion_policy.hpp"
#include "hybridcache/tiered/tiered_store.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

namespace {

template <class HostScorer>
using car_cache = prefix::prefix_cache<cost_model, prefix::judicious_admission, car_scorer,
                                       stores::tiered_state_store<HostScorer>>;

stores::tiered_state_store_config store_config(const cost_model& m, std::int64_t hbm, std::int64_t host,
                                               watermarks marks) {
  return {.capacity_bytes = hbm,
          .host_capacity_bytes = host,
          .kv_bytes_per_token = m.kv_bytes_per_token(),
          .checkpoint_bytes = m.ssm_checkpoint_bytes(),
          .offload = marks};
}

// Inserts `seq` as a finished request would: match, lookup below HBM, commit, settle.
template <class Cache>
void insert(Cache& c, const std::vector<token_id>& seq) {
  auto m = c.match(seq);
  REQUIRE(m);
  const stores::tiered_hit h = c.store().lookup(seq, *m);
  const auto r = c.commit(seq, static_cast<std::int64_t>(seq.size()), &*m);
  if (!r) {  // no room even after evicting: the request is abandoned
    (void)c.release(*m);
    c.store().release_hit(h);
    return;
  }
  c.store().settle(c.tree(), seq, h);
}

// The nodes `seq` reuses in HBM: the matched path and the node it enters in part.
template <class Cache>
std::vector<node_id> hbm_path(const Cache& c, const std::vector<token_id>& seq) {
  std::vector<node_id> path;
  const auto w = c.tree().walk(seq, path);
  if (w.partial != no_node) path.push_back(w.partial);
  return path;
}

template <class Table>
double score_of(const Table& t, entry_id id) {
  const auto e = t.find(id);
  REQUIRE(e);
  return e->score;
}

template <class Table>
std::size_t copies_of(const Table& t, entry_id id) {
  const auto e = t.find(id);
  REQUIRE(e);
  return e->copies.size();
}

}  // namespace

TEST_CASE("car mirror: the table's set_score and add_score re-sort the victims; bad values change nothing") {
  tiered_store<car_score_demotion> t(
      {{.kind = tier_kind::hbm, .capacity_bytes = 4096}, {.kind = tier_kind::host, .capacity_bytes = 4096}}, 1024);
  const entry_id a = make_entry_id(1), b = make_entry_id(2);
  REQUIRE(t.insert(a, 1024, hbm_tier));
  REQUIRE(t.insert(b, 1024, hbm_tier));
  CHECK(t.victim(hbm_tier) == a);  // equal scores: least recently used
  REQUIRE(t.set_score(a, 2.0));
  CHECK(t.victim(hbm_tier) == b);
  REQUIRE(t.add_score(a, -2.0));
  CHECK(t.victim(hbm_tier) == a);
  REQUIRE(t.add_score(b, -1.0));
  CHECK(t.victim(hbm_tier) == b);
  CHECK(t.set_score(a, std::nan("")).error() == errc::invalid_argument);
  CHECK(t.add_score(a, std::numeric_limits<double>::infinity()).error() == errc::invalid_argument);
  CHECK(t.set_score(make_entry_id(9), 1.0).error() == errc::not_found);
  CHECK(score_of(t, a) == 0.0);
  CHECK(score_of(t, b) == -1.0);
  CHECK(t.check_invariants().empty());
}

namespace {

// Three conversations of 64 tokens (llama2: KV only, one entry each), committed A, B, C, so
// A is the oldest. HBM holds 4 of them; the marks make the cleaner pre-write one entry's
// bytes (used 3/4 >= high 0.7; it walks 3/4 - low 0.625 = 1/8 of HBM, half an entry). A
// request that will reuse A enters the window. Returns which of A, B, C got a clean copy
// below, and checks the scores the table holds.
template <class HostScorer>
std::vector<bool> cleaned_after_window_entry() {
  const cost_model m(presets::llama2_7b());
  const std::int64_t b = 64 * m.kv_bytes_per_token();
  std::vector<std::vector<token_id>> seqs(3);
  for (std::size_t s = 0; s < 3; ++s)
    for (token_id k = 0; k < 64; ++k) seqs[s].push_back(static_cast<token_id>(1000 * (s + 1)) + k);
  car_score_board board;
  car_cache<HostScorer> c(m, stores::tiered_state_store<HostScorer>(store_config(m, 4 * b, 16 * b, {.high = 0.7, .low = 0.625})),
                          car_scorer(board));
  for (const auto& s : seqs) insert(c, s);
  REQUIRE(c.store().used_bytes() == 3 * b);
  std::vector<entry_id> kv;
  for (const auto& s : seqs) {
    const auto p = hbm_path(c, s);
    REQUIRE(p.size() == 1);
    kv.push_back(c.tree().at(p.back()).kv.id);
  }
  const auto uses = hbm_path(c, seqs[0]);
  board.enter_window(7, uses);
  mirror_scores(board, c.tree(), c.store(), uses);
  CHECK(score_of(c.store().table(), kv[0]) == 1.0);
  CHECK(score_of(c.store().table(), kv[1]) == 0.0);
  CHECK(c.store().offload() == b);  // one entry's bytes
  c.store().drain();
  std::vector<bool> cleaned;
  for (const entry_id id : kv) cleaned.push_back(copies_of(c.store().table(), id) == 2);
  // Its generation completes: the score is withdrawn on the board and in the table.
  board.complete(7, [&](node_id n, double) noexcept { mirror_score(board, c.tree(), c.store(), n); });
  CHECK(score_of(c.store().table(), kv[0]) == 0.0);
  const std::string bad = c.store().check_invariants(c.tree());
  CHECK_MESSAGE(bad.empty(), bad);
  return cleaned;
}

}  // namespace

TEST_CASE("car mirror: the cleaner pre-writes the lowest-scored entry, where LRU's pre-writes the oldest") {
  CHECK(cleaned_after_window_entry<lru_demotion>() == std::vector<bool>{true, false, false});
  CHECK(cleaned_after_window_entry<car_score_demotion>() == std::vector<bool>{false, true, false});
}

TEST_CASE("car mirror: set_score reaches only the tree's entries; bad values change nothing") {
  const cost_model m(presets::llama2_7b());
  const std::int64_t b = 64 * m.kv_bytes_per_token();
  car_score_board board;
  car_cache<car_score_demotion> c(m, stores::tiered_state_store<car_score_demotion>(store_config(m, 2 * b, 8 * b, {})),
                                  car_scorer(board));
  std::vector<token_id> a, z;
  for (token_id k = 0; k < 64; ++k) {
    a.push_back(k + 1);
    z.push_back(k + 500);
  }
  insert(c, a);
  const entry_id id = c.tree().at(hbm_path(c, a).back()).kv.id;
  REQUIRE(c.store().set_score(id, 3.0));
  REQUIRE(c.store().add_score(id, -1.0));
  CHECK(score_of(c.store().table(), id) == 2.0);
  CHECK(c.store().set_score(id, std::nan("")).error() == errc::invalid_argument);
  CHECK(c.store().add_score(id, std::numeric_limits<double>::infinity()).error() == errc::invalid_argument);
  CHECK(c.store().set_score(no_entry, 1.0).error() == errc::not_found);
  CHECK(c.store().set_score(make_entry_id(12345), 1.0).error() == errc::not_found);
  CHECK(score_of(c.store().table(), id) == 2.0);
  // Evicted by the tree (a second conversation needs the room): the entry is free below
  // HBM, its score back to 0, and set_score refuses it.
  insert(c, z);
  std::vector<token_id> y;
  for (token_id k = 0; k < 64; ++k) y.push_back(k + 900);
  insert(c, y);
  c.store().drain();
  if (const auto e = c.store().table().find(id)) {
    CHECK(e->score == 0.0);
    CHECK(c.store().set_score(id, 1.0).error() == errc::not_found);
  }
  const std::string bad = c.store().check_invariants(c.tree());
  CHECK_MESSAGE(bad.empty(), bad);
}

namespace {

// Every live node's KV and checkpoint entries score as the node does on the board; every
// entry the tree does not hold scores 0. Returns the first violation, empty when none.
template <class Cache>
std::string mirror_violation(const Cache& c, const car_score_board& board) {
  std::map<entry_id, node_id> owner;
  const auto& tree = c.tree();
  for (node_id n = 1; n < tree.id_bound(); ++n) {
    if (!tree.live(n)) continue;
    const auto& nd = tree.at(n);
    if (nd.kv.id != no_entry) owner[nd.kv.id] = n;
    if (nd.has_checkpoint && nd.checkpoint.id != no_entry) owner[nd.checkpoint.id] = n;
  }
  std::string bad;
  c.store().table().for_each([&](const cache_entry& e) {
    if (!bad.empty()) return;
    const auto it = owner.find(e.id);
    const double want = it == owner.end() ? 0.0 : board.score(it->second);
    if (e.score != want)
      bad = "entry " + std::to_string(to_underlying(e.id)) + " scores " + std::to_string(e.score) + ", its node " +
            std::to_string(want);
  });
  return bad;
}

// The reference cleaner: the HBM entries in the order of (the board's score of the node that
// holds them, 0 for the rest; the table's recency; the id), walked as `offload` walks,
// keeping the tree's entries without a copy below. Empty when under the high mark.
template <class Cache>
std::set<entry_id> reference_cleaned(const Cache& c, const car_score_board& board, watermarks marks) {
  const auto& st = c.store();
  const auto cap = static_cast<double>(st.capacity_bytes());
  const auto used = static_cast<double>(st.used_bytes());
  std::set<entry_id> out;
  if (used < marks.high * cap) return out;
  std::map<entry_id, node_id> owner;
  const auto& tree = c.tree();
  for (node_id n = 1; n < tree.id_bound(); ++n) {
    if (!tree.live(n)) continue;
    const auto& nd = tree.at(n);
    if (nd.kv.id != no_entry) owner[nd.kv.id] = n;
    if (nd.has_checkpoint && nd.checkpoint.id != no_entry) owner[nd.checkpoint.id] = n;
  }
  std::vector<std::pair<std::pair<demotion_key, entry_id>, std::pair<double, bool>>> order;
  st.table().for_each([&](const cache_entry& e) {
    const tier_copy* h = e.in(hbm_tier);
    if (h == nullptr || !h->idle()) return;
    const auto it = owner.find(e.id);
    const double s = it == owner.end() ? 0.0 : board.score(it->second);
    order.push_back({{demotion_key{s, static_cast<double>(e.last_access)}, e.id},
                     {static_cast<double>(h->bytes), it != owner.end() && e.copies.size() == 1}});
  });
  std::sort(order.begin(), order.end());
  const double target = used - marks.low * cap;
  double walked = 0.0;
  for (const auto& [key, what] : order) {
    if (walked >= target) break;
    walked += what.first;
    if (what.second) out.insert(key.second);
  }
  return out;
}

}  // namespace

TEST_CASE("car mirror: random conversations keep the table's scores equal to the board's; the cleaner walks by them") {
  // A hybrid model (KV and checkpoint entries), an HBM that holds a few conversations, a
  // large host tier. Random events: requests enter the window, are dispatched (their
  // sequence inserted: splits, evictions to the host tier), complete; the cleaner runs. After
  // every event the table mirrors the board; before every cleaner run the reference says
  // which entries it pre-writes.
  const cost_model m(presets::marconi_7b());
  const watermarks marks{.high = 0.6, .low = 0.3};
  std::int64_t cleaner_runs = 0, cleaned = 0, scored_hbm = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    std::mt19937_64 rng(seed);
    const std::int64_t hbm = 6 * m.ssm_checkpoint_bytes() + 3000 * m.kv_bytes_per_token();
    car_score_board board;
    car_cache<car_score_demotion> c(m, stores::tiered_state_store<car_score_demotion>(store_config(m, hbm, 40 * hbm, marks)),
                                    car_scorer(board));
    std::vector<std::vector<token_id>> convs;
    std::map<std::uint64_t, std::vector<token_id>> waiting;
    std::vector<std::uint64_t> generating;
    std::uint64_t next_request = 0;
    token_id next_token = 1;
    for (int step = 0; step < 160; ++step) {
      const auto what = rng() % 6;
      if (what <= 1) {  // a request enters the window: a new conversation or a next turn
        std::vector<token_id> in;
        if (!convs.empty() && rng() % 4 != 0) {
          in = convs[rng() % convs.size()];
          if (rng() % 3 == 0 || in.size() > 1500) in.resize(in.size() / 2 + 1);  // a branch off an earlier turn
        }
        for (std::int64_t k = 0, add = 20 + static_cast<std::int64_t>(rng() % 400); k < add; ++k) in.push_back(next_token++);
        const std::uint64_t r = next_request++;
        const auto path = hbm_path(c, in);
        board.enter_window(r, path);
        mirror_scores(board, c.tree(), c.store(), path);
        waiting.emplace(r, std::move(in));
      } else if (what <= 3 && !waiting.empty()) {  // dispatch one: its prompt and output go in
        auto it = waiting.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % waiting.size()));
        const std::uint64_t r = it->first;
        std::vector<token_id> seq = std::move(it->second);
        waiting.erase(it);
        const auto path = hbm_path(c, seq);
        board.dispatch(r, path);
        mirror_scores(board, c.tree(), c.store(), path);
        for (std::int64_t k = 0, out = 1 + static_cast<std::int64_t>(rng() % 60); k < out; ++k) seq.push_back(next_token++);
        insert(c, seq);
        const auto made = hbm_path(c, seq);
        board.adopt(r, made);
        mirror_scores(board, c.tree(), c.store(), made);
        convs.push_back(std::move(seq));
        generating.push_back(r);
      } else if (what == 4 && !generating.empty()) {  // one completes
        const std::size_t k = rng() % generating.size();
        board.complete(generating[k], [&](node_id n, double) noexcept { mirror_score(board, c.tree(), c.store(), n); });
        generating.erase(generating.begin() + static_cast<std::ptrdiff_t>(k));
      } else {  // the cleaner
        c.store().drain();
        const std::set<entry_id> want = reference_cleaned(c, board, marks);
        std::set<entry_id> dirty;
        c.store().table().for_each([&](const cache_entry& e) {
          if (e.in(hbm_tier) != nullptr && e.copies.size() == 1) dirty.insert(e.id);
          if (e.in(hbm_tier) != nullptr && e.score != 0.0) ++scored_hbm;
        });
        (void)c.store().offload();
        c.store().drain();
        std::set<entry_id> got;
        for (const entry_id id : dirty)
          if (const auto e = c.store().table().find(id); e && e->copies.size() >= 2) got.insert(id);
        REQUIRE(got == want);
        cleaner_runs += want.empty() ? 0 : 1;
        cleaned += static_cast<std::int64_t>(got.size());
      }
      const std::string bad = mirror_violation(c, board);
      REQUIRE_MESSAGE(bad.empty(), "seed " << seed << " step " << step << ": " << bad);
      const std::string inv = c.store().check_invariants(c.tree());
      REQUIRE_MESSAGE(inv.empty(), inv);
    }
    for (const auto r : generating)
      board.complete(r, [&](node_id n, double) noexcept { mirror_score(board, c.tree(), c.store(), n); });
    for (const auto& [r, in] : waiting)
      board.complete(r, [&](node_id n, double) noexcept { mirror_score(board, c.tree(), c.store(), n); });
    CHECK(mirror_violation(c, board).empty());
    c.store().table().for_each([&](const cache_entry& e) { CHECK(e.score == 0.0); });  // no score outlives its requests
  }
  MESSAGE("cleaner runs that pre-wrote: " << cleaner_runs << ", entries: " << cleaned << ", scored HBM entries seen: " << scored_hbm);
  CHECK(cleaner_runs > 0);
  CHECK(scored_hbm > 0);
}
