// Fidelity against the Marconi reference simulator (ruipeterpan/marconi @ 08016617) on the
// synth-v1 chat trace, seed 7, 12 sessions, gap 1000 ms (shared/fixtures/marconi/README.md):
// marconi_7b, a 5e8-byte counting store, logical clock, per request match(input) then
// commit(input ++ output).
#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <vector>

#include "hybridcache/core/presets.hpp"
#include "hybridcache/prefix/flop_aware_scorer.hpp"
#include "hybridcache/prefix/prefix_cache.hpp"
#include "hybridcache/prefix/reference_scorer.hpp"
#include "hybridcache/sim/synth_v1.hpp"

using namespace hybridcache;
using namespace hybridcache::prefix;

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
  prefix_cache<cost_model, judicious_admission, lru_scorer> c(
      m, fixture_store(m), lru_scorer({.ties = lru_ties::python_heapq}), {}, {.admit_oversized = true});
  const auto skipped = replay(c);
  CHECK_MESSAGE(skipped == sglang_row, diff(skipped, sglang_row));
  CHECK(token_hit_rate(skipped) == doctest::Approx(0.146730).epsilon(1e-6));
}

TEST_CASE("Marconi with the reference's quirks reproduces the fixed-alpha rows exactly") {
  const cost_model m(presets::marconi_7b());
  for (const auto& [alpha, row] : {std::pair{0.0, marconi_a0_row}, std::pair{1.0, marconi_a1_row}}) {
    CAPTURE(alpha);
    prefix_cache<cost_model, judicious_admission, reference_flop_scorer> c(
        m, fixture_store(m), reference_flop_scorer(m, {.alpha = alpha, .quirks = true}), {}, {.admit_oversized = true});
    const auto skipped = replay(c);
    CHECK_MESSAGE(skipped == row, diff(skipped, row));
  }
}
