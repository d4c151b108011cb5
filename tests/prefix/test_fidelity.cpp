// Fidelity against the Marconi reference simulator (ruipeterpan/marconi @ 08016617) on the
// synth-v1 chat trace, seed 7, 12 sessions, gap 1000 ms (shared/fixtures/marconi/README.md):
// marconi_7b, a 5e8-byte counting store, logical clock, per request match(input) then
// commit(input ++ output).
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/compose/bundles.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/stores/counting_store.hpp"
#include "hybridcache/sim/reference/reference_scorer.hpp"
#include "hybridcache/sim/synth_v1.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;
using namespace hybridcache::stores;
using namespace hybridcache::compose;

namespace {

const std::vector<sim::synth_request>& trace() {
  static const auto t = sim::generate_synth_v1(
      {.profile = sim::synth_profile::chat, .seed = 7, .sessions = 12, .session_gap_ms = 1000});
  return t;
}

counting_store fixture_store(const cost_model& m) {
  counting_store s(500'000'000, m.kv_bytes_per_token(), m.ssm_checkpoint_bytes());
  s.allow_overflow(true);  // the reference inserts even when eviction cannot make room
  return s;
}

template <class Cache>
std::vector<std::int64_t> replay(Cache& c, std::vector<commit_result>* commits = nullptr) {
  std::vector<std::int64_t> skipped;
  for (const auto& r : trace()) {
    std::vector<token_id> seq = r.input;
    seq.insert(seq.end(), r.output.begin(), r.output.end());
    auto m = c.match(r.input);
    REQUIRE(m);
    skipped.push_back(m->reusable_tokens);
    auto cr = c.commit(seq, static_cast<std::int64_t>(r.input.size()), &*m);
    REQUIRE(cr);
    if (commits) commits->push_back(*cr);
  }
  return skipped;
}

std::string diff(const std::vector<std::int64_t>& got, const std::vector<std::int64_t>& want) {
  std::string out;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] != want[i])
      out += "[" + std::to_string(i) + "] " + std::to_string(got[i]) + " vs " + std::to_string(want[i]) + "; ";
  return out;
}

double token_hit_rate(const std::vector<std::int64_t>& skipped) {
  std::int64_t in = 0;
  for (const auto& r : trace()) in += static_cast<std::int64_t>(r.input.size());
  return static_cast<double>(std::accumulate(skipped.begin(), skipped.end(), std::int64_t{0})) /
         static_cast<double>(in);
}

const std::vector<std::int64_t> sglang_row = {
    0, 0, 0, 0, 0, 740, 0, 690, 1371, 740, 332, 0, 740, 0, 1123, 332, 0, 740, 1522, 690, 740, 740, 1590, 0,
    690, 1401, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2788, 0, 0, 3317, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4913, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8161};
const std::vector<std::int64_t> vllm_row = {
    0, 0, 672, 0, 0, 736, 0, 0, 0, 736, 0, 0, 0, 0, 0, 0, 0, 0, 0, 672, 0, 736, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 672, 0, 0, 2788, 736, 0, 3317, 0, 0, 736, 0, 0, 0, 0, 0, 0, 4913, 0, 0, 0, 0, 0, 0, 672,
    672, 672, 0, 0, 0, 0, 0, 0, 0, 672, 0, 0, 0, 8161};
const std::vector<std::int64_t> marconi_a0_row = {
    0, 0, 0, 0, 0, 740, 0, 690, 740, 740, 332, 0, 740, 0, 1123, 0, 0, 0, 1522, 0, 0, 0, 1590, 0,
    0, 1401, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2788, 0, 0, 3317, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4913, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8161};
const std::vector<std::int64_t> marconi_a1_row = {
    0, 0, 0, 0, 0, 740, 0, 690, 740, 740, 332, 0, 740, 690, 740, 0, 690, 740, 690, 690, 0, 0, 1590, 0,
    0, 1401, 0, 0, 0, 2098, 0, 0, 0, 0, 0, 2788, 0, 0, 3317, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4913, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8161};

}  // namespace

TEST_CASE("fixture trace: 70 requests, 227,356 input tokens") {
  CHECK(trace().size() == 70);
  std::int64_t in = 0;
  for (const auto& r : trace()) in += static_cast<std::int64_t>(r.input.size());
  CHECK(in == 227356);
  const cost_model m(presets::marconi_7b());
  CHECK(m.ssm_checkpoint_bytes() == 26'787'840);
  CHECK(m.kv_bytes_per_token() == 65'536);
}

TEST_CASE("SGLang+ (judicious + lru) reproduces the reference row exactly") {
  const cost_model m(presets::marconi_7b());
  prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> c(
      m, fixture_store(m), lru_scorer({.ties = lru_ties::python_heapq}), {}, {.admit_oversized = true});
  const auto skipped = replay(c);
  CHECK_MESSAGE(skipped == sglang_row, diff(skipped, sglang_row));
  CHECK(token_hit_rate(skipped) == doctest::Approx(0.146730).epsilon(1e-6));
}

TEST_CASE("Marconi with the reference's quirks reproduces the fixed-alpha rows exactly") {
  const cost_model m(presets::marconi_7b());
  for (const auto& cse : {std::pair{0.0, marconi_a0_row}, std::pair{1.0, marconi_a1_row}}) {
    const double alpha = cse.first;  // (no structured bindings: clang 14 cannot capture them)
    const std::vector<std::int64_t>& row = cse.second;
    CAPTURE(alpha);
    prefix_cache<cost_model, judicious_admission, sim::reference_flop_scorer, counting_store> c(
        m, fixture_store(m), sim::reference_flop_scorer(m, {.alpha = alpha, .quirks = true}), {}, {.admit_oversized = true});
    const auto skipped = replay(c);
    CHECK_MESSAGE(skipped == row, diff(skipped, row));
  }
}

TEST_CASE("vLLM+ (every_block<32> + lru) reproduces the reference row exactly") {
  // The reference's block tree differs structurally (a partial last block is later filled
  // in place, dropping the state at its old end; its byte estimate counts the root as a
  // block), but on this trace none of those paths changes a decision: the rows are equal.
  const cost_model m(presets::marconi_7b());
  prefix_cache<cost_model, every_block_admission<32>, lru_scorer, counting_store> c(
      m, fixture_store(m), lru_scorer({.ties = lru_ties::python_heapq}), {}, {.admit_oversized = true});
  const auto skipped = replay(c);
  CHECK_MESSAGE(skipped == vllm_row, diff(skipped, vllm_row));
  CHECK(token_hit_rate(skipped) == doctest::Approx(0.121233).epsilon(1e-6));
}

TEST_CASE("SGLang+ with deterministic node-id ties: pinned (one request differs by tie order)") {
  // Leaves with equal last-access times exist (an edge split stamps the old tail and creates
  // the new leaf at the same tick); heapq pops them in an order set by the DFS layout, the
  // default breaks ties by node id. Request 8 then hits 740 instead of 1371.
  const cost_model m(presets::marconi_7b());
  prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> c(m, fixture_store(m), lru_scorer{}, {},
                                                              {.admit_oversized = true});
  auto expected = sglang_row;
  expected[8] = 740;
  const auto skipped = replay(c);
  CHECK_MESSAGE(skipped == expected, diff(skipped, expected));
}

TEST_CASE("Marconi, correct FLOP-aware scorer: pinned rows; threshold walk == naive scorer") {
  const cost_model m(presets::marconi_7b());
  // alpha = 0: only recency counts, and the byte-accounting defect happens not to change a
  // decision here, so the row equals the reference's.
  // alpha = 1: the correct marginal FLOPs and the node's own bytes rank nodes differently
  // (the reference's mem(n) grows with the whole prefix, which favours evicting deep nodes;
  // its MLP typo makes eff negative for short nodes deep in a conversation).
  const std::vector<std::int64_t> correct_a1 = {
      0, 0, 0, 0, 0, 740, 0, 690, 1371, 740, 0, 0, 740, 690, 740, 0, 690, 0, 1522, 0, 0, 0, 0, 0,
      0, 1401, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2788, 0, 0, 3317, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4913, 0, 0, 0,
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8161};
  for (const auto& cse : {std::pair{0.0, marconi_a0_row}, std::pair{1.0, correct_a1}}) {
    const double alpha = cse.first;
    const std::vector<std::int64_t>& row = cse.second;
    CAPTURE(alpha);
    // The paper's candidate rule (the library's default protects branch points: below).
    prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> fast(
        m, fixture_store(m), flop_aware_scorer(m, {.alpha = alpha, .candidates = flop_candidates::paper}), {},
        {.admit_oversized = true});
    prefix_cache<cost_model, judicious_admission, sim::reference_flop_scorer, counting_store> naive(
        m, fixture_store(m), sim::reference_flop_scorer(m, {.alpha = alpha, .candidates = flop_candidates::paper}), {},
        {.admit_oversized = true});
    std::vector<commit_result> cf, cn;
    const auto a = replay(fast, &cf);
    const auto b = replay(naive, &cn);
    CHECK_MESSAGE(a == row, diff(a, row));
    CHECK(a == b);
    REQUIRE(cf.size() == cn.size());
    for (std::size_t i = 0; i < cf.size(); ++i) {
      CHECK(cf[i].evictions == cn[i].evictions);
      CHECK(cf[i].bytes_evicted == cn[i].bytes_evicted);
    }
  }
}

TEST_CASE("Marconi V2 with online tuning (reference quirks, bootstrap multiplier 2) picks alpha 1.5") {
  // Reference: "V2 (bootstrap multiplier 2): tunes alpha=1.5 -> 13.8954%".
  const cost_model m(presets::marconi_7b());
  alpha_tuned_cache<prefix_cache<cost_model, judicious_admission, sim::reference_flop_scorer, counting_store>> c(
      m, fixture_store(m), sim::reference_flop_scorer(m, {.alpha = 0.0, .quirks = true}), {}, {.admit_oversized = true},
      {.enabled = true, .bootstrap_multiplier = 2});
  const auto skipped = replay(c);
  REQUIRE(c.tuning_history().size() == 1);
  const auto& ev = c.tuning_history()[0];
  CHECK(c.requests_before_first_eviction() == 6);
  CHECK(ev.at_request == 12);
  CHECK(ev.window == 12);
  CHECK(ev.alphas.size() == 21);
  CHECK(ev.alpha == 1.5);
  CHECK(c.alpha() == 1.5);
  // 1.5 .. 1.8 tie at the maximum: the smallest wins (deterministic).
  CHECK(ev.scores[15] == ev.scores[18]);
  CHECK(ev.scores[14] < ev.scores[15]);
  CHECK(token_hit_rate(skipped) == doctest::Approx(0.138954).epsilon(1e-6));
}

TEST_CASE("alpha tuning: hit-rate objective and periodic re-tuning over a sliding window") {
  const cost_model m(presets::marconi_7b());
  alpha_tuned_cache<prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store>> c(
      m, fixture_store(m), flop_aware_scorer(m, {.alpha = 0.0}), {}, {.admit_oversized = true},
      {.enabled = true,
       .bootstrap_multiplier = 2,
       .objective = tuning_objective::token_hit_rate,
       .threads = 3,
       .retune_every = 20,
       .retune_window = 30});
  CHECK(c.alpha() == 0.0);
  (void)replay(c);
  const auto& h = c.tuning_history();
  REQUIRE(h.size() >= 3);  // at request 12, then every 20 requests
  CHECK(h[0].at_request == 12);
  CHECK(h[0].window == 12);
  for (std::size_t i = 1; i < h.size(); ++i) {
    CHECK(h[i].at_request - h[i - 1].at_request == 20);
    CHECK(h[i].window == 30);
  }
  for (const auto& e : h) {
    REQUIRE(e.scores.size() == 21);
    for (double s : e.scores) CHECK((s >= 0.0 && s <= 1.0));  // hit rates
    // The chosen alpha is the smallest with the best score.
    std::size_t best = 0;
    for (std::size_t i = 1; i < e.scores.size(); ++i)
      if (e.scores[i] > e.scores[best]) best = i;
    CHECK(e.alpha == e.alphas[best]);
  }
  CHECK(c.alpha() == h.back().alpha);
}

TEST_CASE("alpha tuning: the replay is deterministic whatever the thread count" * doctest::test_suite("concurrency")) {
  const cost_model m(presets::marconi_7b());
  std::vector<double> first;
  for (unsigned threads : {1u, 4u}) {
    alpha_tuned_cache<prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store>> c(
        m, fixture_store(m), flop_aware_scorer(m, {.alpha = 0.0}), {}, {.admit_oversized = true},
        {.enabled = true, .bootstrap_multiplier = 2, .threads = threads});
    (void)replay(c);
    REQUIRE(c.tuning_history().size() == 1);
    if (first.empty()) first = c.tuning_history()[0].scores;
    else CHECK(c.tuning_history()[0].scores == first);
  }
}

TEST_CASE("vLLM+ block-tree quirk 'partial block filled in place' (pinned: we keep the state)") {
  // radix_cache_vllm.py fills a partial last block when a later sequence extends it, so the
  // state at the old sequence end (token 40 here) is replaced by the state at token 64.
  // every_block_admission keeps both: a request that shares exactly the first 40 tokens and
  // then diverges reuses 40 tokens here; the reference would reuse 32.
  const cost_model m(presets::marconi_7b());
  const std::int64_t ck = m.ssm_checkpoint_bytes(), kv = m.kv_bytes_per_token();
  prefix_cache<cost_model, every_block_admission<32>, lru_scorer, counting_store> c(m, counting_store(100 * ck + 1000 * kv, kv, ck),
                                                                    lru_scorer{});
  std::vector<token_id> a(40);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<token_id>(i + 1);
  REQUIRE(c.commit(a, 40));
  std::vector<token_id> b = a;
  for (int i = 0; i < 30; ++i) b.push_back(500 + i);
  REQUIRE(c.commit(b, 70));
  std::vector<token_id> q = a;
  q.push_back(9999);
  auto r = c.match(q);
  CHECK(r->reusable_tokens == 40);  // reference: 32
  CHECK(c.release(*r));
}

namespace {

template <class Cache>
double hit_rate_percent(Cache& c, const std::vector<sim::synth_request>& tr) {
  std::int64_t skipped = 0, inputs = 0;
  for (const auto& r : tr) {
    std::vector<token_id> seq = r.input;
    seq.insert(seq.end(), r.output.begin(), r.output.end());
    auto m = c.match(r.input);
    REQUIRE(m);
    skipped += m->reusable_tokens;
    inputs += static_cast<std::int64_t>(r.input.size());
    REQUIRE(c.commit(seq, static_cast<std::int64_t>(r.input.size()), &*m));
  }
  // The reference prints two decimals.
  return std::round(10000.0 * static_cast<double>(skipped) / static_cast<double>(inputs)) / 100.0;
}

counting_store store_5gb(const cost_model& m) {
  counting_store s(5'000'000'000, m.kv_bytes_per_token(), m.ssm_checkpoint_bytes());
  s.allow_overflow(true);
  return s;
}

}  // namespace

TEST_CASE("larger synth traces at 5 GB: the reference driver's logged rates (anchors/marconi.md 1(i))") {
  const cost_model m(presets::marconi_7b());
  const prefix_cache_config cfg{.admit_oversized = true};
  const lru_scorer heapq_lru({.ties = lru_ties::python_heapq});
  SUBCASE("agent profile, seed 2, 100 sessions, gap 4000 ms (570 requests)") {
    const auto tr = sim::generate_synth_v1(
        {.profile = sim::synth_profile::agent, .seed = 2, .sessions = 100, .session_gap_ms = 4000});
    REQUIRE(tr.size() == 570);
    prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> v1(m, store_5gb(m), heapq_lru, {}, cfg);
    CHECK(hit_rate_percent(v1, tr) == 83.03);
    alpha_tuned_cache<prefix_cache<cost_model, judicious_admission, sim::reference_flop_scorer, counting_store>> v2(
        m, store_5gb(m), sim::reference_flop_scorer(m, {.quirks = true}), {}, cfg, {.enabled = true, .bootstrap_multiplier = 5});
    CHECK(hit_rate_percent(v2, tr) == 83.26);
    CHECK(v2.requests_before_first_eviction() == 54);
    CHECK(v2.alpha() == 0.0);
    for (const auto& [alpha, rate] : std::vector<std::pair<double, double>>{
             {0.0, 83.26}, {0.5, 69.90}, {1.0, 66.41}, {1.5, 52.97}, {2.0, 52.71}}) {
      prefix_cache<cost_model, judicious_admission, sim::reference_flop_scorer, counting_store> v3(
          m, store_5gb(m), sim::reference_flop_scorer(m, {.alpha = alpha, .quirks = true}), {}, cfg);
      CHECK(hit_rate_percent(v3, tr) == rate);
    }
    // vLLM+: the reference logs 28.66 %. Its block tree (radix_cache_vllm.py) estimates the bytes of
    // an insert with fractional states ((len - 32·|path|)/32, root counted as a block), so its tree
    // overshoots capacity (5.054e9 B after request 3 here; ours stays at 4.992e9 B) and keeps blocks
    // that we evict; it also duplicates the KV of a block shared only in part (16 tokens per session
    // after the 1200-token prompt) and fills partial blocks in place. 14 of 570 requests reuse one
    // block (32 tokens) less here. Pinned:
    prefix_cache<cost_model, every_block_admission<32>, lru_scorer, counting_store> vllm(m, store_5gb(m), heapq_lru, {}, cfg);
    CHECK(hit_rate_percent(vllm, tr) == 28.64);
  }
  SUBCASE("chat profile, seed 1, 100 sessions, gap 2000 ms (692 requests)") {
    const auto tr = sim::generate_synth_v1(
        {.profile = sim::synth_profile::chat, .seed = 1, .sessions = 100, .session_gap_ms = 2000});
    REQUIRE(tr.size() == 692);
    prefix_cache<cost_model, judicious_admission, lru_scorer, counting_store> v1(m, store_5gb(m), heapq_lru, {}, cfg);
    CHECK(hit_rate_percent(v1, tr) == 33.65);
    alpha_tuned_cache<prefix_cache<cost_model, judicious_admission, sim::reference_flop_scorer, counting_store>> v2(
        m, store_5gb(m), sim::reference_flop_scorer(m, {.quirks = true}), {}, cfg, {.enabled = true, .bootstrap_multiplier = 5});
    CHECK(hit_rate_percent(v2, tr) == 29.77);
    CHECK(v2.requests_before_first_eviction() == 63);
    CHECK(v2.alpha() == 1.6);  // 1.6 and 1.7 tie; the reference also chose 1.6
    for (const auto& [alpha, rate] : std::vector<std::pair<double, double>>{
             {0.0, 33.76}, {0.3, 35.59}, {0.5, 32.80}, {1.0, 32.78}, {2.0, 31.45}}) {
      prefix_cache<cost_model, judicious_admission, sim::reference_flop_scorer, counting_store> v3(
          m, store_5gb(m), sim::reference_flop_scorer(m, {.alpha = alpha, .quirks = true}), {}, cfg);
      CHECK(hit_rate_percent(v3, tr) == rate);
    }
    // The correct FLOP-aware scorer (no reference defects): FLOP awareness now pays off on this
    // trace, rising with alpha above LRU (33.65 %), where the defective efficiency fell below it.
    for (const auto& [alpha, rate] :
         std::vector<std::pair<double, double>>{{0.0, 33.89}, {1.0, 36.09}, {2.0, 37.21}}) {
      prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> ok(
          m, store_5gb(m), flop_aware_scorer(m, {.alpha = alpha, .candidates = flop_candidates::paper}), {}, cfg);
      CHECK(hit_rate_percent(ok, tr) == rate);
    }
    // The library's default candidate rule protects branch points (issue #14): the shared
    // system prompt's checkpoint is no longer merged while sessions below it are hot.
    for (const auto& [alpha, rate] :
         std::vector<std::pair<double, double>>{{0.0, 34.34}, {1.0, 38.41}, {2.0, 38.82}}) {
      prefix_cache<cost_model, judicious_admission, flop_aware_scorer, counting_store> ok(
          m, store_5gb(m), flop_aware_scorer(m, {.alpha = alpha}), {}, cfg);
      CHECK(hit_rate_percent(ok, tr) == rate);
    }
    // vLLM+: reference 6.98 % (same block-tree accounting as above). Pinned:
    prefix_cache<cost_model, every_block_admission<32>, lru_scorer, counting_store> vllm(m, store_5gb(m), heapq_lru, {}, cfg);
    CHECK(hit_rate_percent(vllm, tr) == 6.95);
  }
}
