// Conformance suite of `hybridcache::admission_policy`: every policy against the
// concept's contract (concepts/prefix.hpp) on random insertion views of the shape the
// prefix cache builds (`make_view`):
//
//   0 <= reusable_tokens <= min(input_tokens, common_prefix), input_tokens <= total_tokens,
//   common_prefix <= total_tokens, branch_point = 0 or common_prefix (> reusable_tokens),
//   lower_branch_point = 0 or in (common_prefix, total_tokens) (plan_into).
//
// Laws: `select` only appends (what `out` held is untouched); it appends positions in
// (reusable_tokens, total_tokens] only, i.e. states this request computed; the same view
// gives the same positions (the cache calls it once per plan and once per commit and
// expects both to agree); with the capacity the cache reserves (total_tokens + 2) it does
// not reallocate, so steady state allocates nothing.
//
// A new policy is covered by naming it in TEST_CASE_TEMPLATE_INVOKE.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "hybridcache/prefix/admission.hpp"

using namespace hybridcache::prefix;
using namespace hybridcache;

namespace {

insertion_view random_view(std::mt19937_64& rng) {
  insertion_view v;
  v.total_tokens = static_cast<std::int64_t>(1 + rng() % 300);
  v.input_tokens = static_cast<std::int64_t>(1 + rng() % static_cast<std::uint64_t>(v.total_tokens));
  v.common_prefix = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(v.total_tokens + 1));
  const std::int64_t reuse_max = std::min(v.input_tokens, v.common_prefix);
  v.reusable_tokens = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(reuse_max + 1));
  // Block-aligned prefixes and full hits are where off-by-one errors live: bias towards them.
  switch (rng() % 6) {
    case 0: v.reusable_tokens = reuse_max; break;
    case 1: v.reusable_tokens = reuse_max / 8 * 8; break;
    default: break;
  }
  if (v.common_prefix > v.reusable_tokens && rng() % 2 == 0) v.branch_point = v.common_prefix;
  if (v.total_tokens - v.common_prefix > 1 && rng() % 3 == 0)
    v.lower_branch_point = v.common_prefix + 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(v.total_tokens - v.common_prefix - 1));
  return v;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("admission_policy conformance", A, admission_policy_conformance) {
  static_assert(admission_policy<A>);
  const A policy{};

  SUBCASE("select appends positions in (reusable_tokens, total_tokens] and keeps what out held") {
    std::mt19937_64 rng(11);
    for (int i = 0; i < 20000; ++i) {
      const insertion_view v = random_view(rng);
      CAPTURE(v.input_tokens);
      CAPTURE(v.total_tokens);
      CAPTURE(v.reusable_tokens);
      CAPTURE(v.common_prefix);
      CAPTURE(v.branch_point);
      CAPTURE(v.lower_branch_point);
      std::vector<std::int64_t> out;
      const std::size_t before = rng() % 4;  // sentinels outside any valid range
      for (std::size_t k = 0; k < before; ++k) out.push_back(-1000 - static_cast<std::int64_t>(k));
      policy.select(v, out);
      REQUIRE(out.size() >= before);
      for (std::size_t k = 0; k < before; ++k) CHECK(out[k] == -1000 - static_cast<std::int64_t>(k));
      for (std::size_t k = before; k < out.size(); ++k) {
        CHECK(out[k] > v.reusable_tokens);
        CHECK(out[k] <= v.total_tokens);
      }
    }
  }

  SUBCASE("the same view selects the same positions") {
    std::mt19937_64 rng(12);
    for (int i = 0; i < 5000; ++i) {
      const insertion_view v = random_view(rng);
      std::vector<std::int64_t> a, b;
      policy.select(v, a);
      policy.select(v, b);
      CHECK(a == b);
      const A copy = policy;  // a policy's choice depends on the view, not on its history
      std::vector<std::int64_t> c;
      copy.select(v, c);
      CHECK(a == c);
    }
  }

  SUBCASE("with the capacity the cache reserves, select does not reallocate") {
    std::mt19937_64 rng(13);
    std::vector<std::int64_t> out;
    for (int i = 0; i < 5000; ++i) {
      const insertion_view v = random_view(rng);
      out.clear();
      out.reserve(static_cast<std::size_t>(v.total_tokens) + 2);  // prefix_cache::select_positions
      const auto* data = out.data();
      const std::size_t cap = out.capacity();
      policy.select(v, out);
      CHECK(out.data() == data);
      CHECK(out.capacity() == cap);
    }
  }

  SUBCASE("an empty sequence selects nothing") {
    std::vector<std::int64_t> out;
    policy.select(insertion_view{}, out);
    CHECK(out.empty());
  }
}

TEST_CASE_TEMPLATE_INVOKE(admission_policy_conformance, judicious_admission, every_block_admission<1>,
                          every_block_admission<8>, every_block_admission<32>, last_token_admission, no_admission);

TEST_CASE("judicious admission keeps the branch point below HBM; last-token admission does not (issue #15)") {
  // A sequence of 500 tokens whose first 300 are cached on the host only: HBM matched 40.
  const insertion_view v{.input_tokens = 480, .total_tokens = 500, .reusable_tokens = 40, .common_prefix = 40,
                         .branch_point = 0, .lower_branch_point = 300};
  std::vector<std::int64_t> j, l;
  judicious_admission{}.select(v, j);
  last_token_admission{}.select(v, l);
  CHECK(j == std::vector<std::int64_t>{300, 500});
  CHECK(l == std::vector<std::int64_t>{500});
}

// --- negative cases ------------------------------------------------------------------------

namespace {

// select runs inside plan/commit before anything can be rolled back: it must not throw.
struct throwing_select {
  void select(const insertion_view&, std::vector<std::int64_t>&) const {}
};
// The cache holds the policy by value and calls it through a const member.
struct mutable_select {
  void select(const insertion_view&, std::vector<std::int64_t>&) noexcept {}
};
// Returning the positions instead of appending them would allocate on every call.
struct returns_positions {
  std::vector<std::int64_t> select(const insertion_view&) const noexcept { return {}; }
};
struct no_select {};

}  // namespace

static_assert(!admission_policy<throwing_select>);
static_assert(!admission_policy<mutable_select>);
static_assert(!admission_policy<returns_positions>);
static_assert(!admission_policy<no_select>);
