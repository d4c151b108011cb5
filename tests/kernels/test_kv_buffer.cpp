// Host tests of the KVBuffer: table bookkeeping, chunkwise decode through flush cycles,
// B = 1 bit-identity with recurrent decode, draft verification and commit, KV-only decode and
// the switch to chunkwise, skipped slots, guard regions, and bad input.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hybridcache/attention/decode_programs.hpp"
#include "hybridcache/attention/linear_attention_forms.hpp"
#include "reference.hpp"

namespace hc = hybridcache::attention;
using hctest::problem;

namespace {

constexpr float sentinel = -12345.0f;
constexpr std::size_t guard = 64;

// A vector with `guard` sentinel floats on both sides of the payload.
template <class T>
struct guarded {
  std::vector<T> all;
  explicit guarded(std::size_t n, T fill) : all(n + 2 * guard, fill) {
    for (std::size_t i = 0; i < guard; ++i) all[i] = all[all.size() - 1 - i] = guard_value();
  }
  static T guard_value() { return hc::from_float<T>(sentinel); }
  T* data() { return all.data() + guard; }
  std::size_t size() const { return all.size() - 2 * guard; }
  bool guards_intact() const {
    const T g = guard_value();
    for (std::size_t i = 0; i < guard; ++i) {
      if (std::memcmp(&all[i], &g, sizeof(T)) != 0) return false;
      if (std::memcmp(&all[all.size() - 1 - i], &g, sizeof(T)) != 0) return false;
    }
    return true;
  }
};

// One layer's KVBuffer on the host plus a request per slot, each with its own random sequence.
template <class Rule, hc::state_layout L, int DK, int DV, class In, class ValueT>
struct harness {
  static constexpr std::int64_t n_state = static_cast<std::int64_t>(DK) * DV;
  int H, HV;
  hc::kv_buffer_config cfg;
  hc::kv_buffer_table table;
  guarded<In> keys;
  guarded<ValueT> values;
  guarded<float> decays;
  guarded<float> states;
  std::vector<problem> req;                   // per slot
  std::vector<int> pos;                       // per slot: tokens consumed so far
  std::vector<std::vector<double>> ref_o;     // per slot: fp64 outputs [T][HV][dv]
  bool delta = Rule::delta;

  harness(const hc::kv_buffer_config& c, int h, int hv, int T, std::uint64_t seed, double gate_norm)
      : H(h), HV(hv), cfg(c), table(c),
        keys(static_cast<std::size_t>(c.num_blocks) * c.block_tokens * h * DK, In{}),
        values(static_cast<std::size_t>(c.num_blocks) * c.block_tokens * hv * DV, ValueT{}),
        decays(static_cast<std::size_t>(c.num_blocks) * c.block_tokens * hv, 0.0f),
        states(static_cast<std::size_t>(c.num_slots) * hv * n_state, sentinel) {
    for (int s = 0; s < c.num_slots; ++s) {
      req.push_back(hctest::make_problem(seed + s, T, h, hv, DK, DV, gate_norm, 0.3, true));
      hctest::round_inputs<In>(req.back());
      ref_o.emplace_back(static_cast<std::size_t>(T) * hv * DV);
      for (int v = 0; v < hv; ++v) {
        auto st = hctest::initial_state(req.back(), v);
        hctest::reference_run(req.back(), delta, v, st, ref_o.back(), 0, T);
      }
    }
    pos.assign(static_cast<std::size_t>(c.num_slots), 0);
  }

  hc::kv_buffer_ref<In, ValueT> ref() {
    return {keys.data(), values.data(), decays.data(), table.block_table_data(),
            table.cursor_data(), table.state_valid_data(), cfg.block_tokens, table.max_blocks_per_slot(), H, HV, DK, DV};
  }
  float* state_of(int slot, int hv) { return states.data() + (static_cast<std::int64_t>(slot) * HV + hv) * n_state; }

  void open(int slot, bool kv_only) {
    REQUIRE(table.open(slot, kv_only));
    if (!kv_only)
      for (int v = 0; v < HV; ++v) hctest::store_state(L, DK, DV, hctest::initial_state(req[slot], v), state_of(slot, v));
  }

  // Builds a step's inputs: entry b takes tokens [pos, pos+n) of its slot's sequence, or of
  // `other` (wrong drafts) from draft index `first_wrong` on.
  struct step_inputs {
    std::vector<In> q, k, v;
    std::vector<float> g, beta, o;
  };
  step_inputs inputs(const std::vector<std::int32_t>& slots, int n, const problem* other = nullptr, int first_wrong = 1 << 30) {
    step_inputs in;
    const std::size_t B = slots.size();
    in.q.resize(B * n * H * DK);
    in.k.resize(in.q.size());
    in.v.resize(B * n * HV * DV);
    in.g.resize(B * n * HV);
    in.beta.resize(in.g.size());
    in.o.assign(B * n * HV * DV, sentinel);
    for (std::size_t b = 0; b < B; ++b) {
      if (slots[b] < 0) continue;
      for (int r = 0; r < n; ++r) {
        const problem& p = r >= first_wrong && other ? *other : req[slots[b]];
        const int t = pos[slots[b]] + r;
        const std::size_t dst = b * n + r;
        for (int i = 0; i < H * DK; ++i) {
          in.q[dst * H * DK + i] = hc::from_float<In>(p.q[t * H * DK + i]);
          in.k[dst * H * DK + i] = hc::from_float<In>(p.k[t * H * DK + i]);
        }
        for (int i = 0; i < HV * DV; ++i) in.v[dst * HV * DV + i] = hc::from_float<In>(p.v[t * HV * DV + i]);
        for (int i = 0; i < HV; ++i) {
          in.g[dst * HV + i] = p.g[t * HV + i];
          in.beta[dst * HV + i] = p.beta[t * HV + i];
        }
      }
    }
    return in;
  }
  hc::step_io<In, float> io(const std::vector<std::int32_t>& slots, int n, step_inputs& in) {
    hc::step_io<In, float> s;
    s.slots = slots.data();
    s.batch = static_cast<int>(slots.size());
    s.new_tokens = n;
    s.num_k_heads = H;
    s.num_v_heads = HV;
    s.q = in.q.data();
    s.k = in.k.data();
    s.v = in.v.data();
    s.log_decay = in.g.data();
    s.beta = in.beta.data();
    s.o = in.o.data();
    s.states = states.data();
    s.qk = req[0].opt;
    return s;
  }

  // One decode step for `slots`; checks outputs of active entries against fp64.
  std::vector<float> decode(const std::vector<std::int32_t>& slots, double tol) {
    table.check_step(slots, 1);
    auto in = inputs(slots, 1);
    auto s = io(slots, 1, in);
    hc::kv_step_host<Rule, L, DK, DV>(s, ref(), cfg.flush_interval, cfg.kv_only_crossover, true);
    for (std::size_t b = 0; b < slots.size(); ++b) {
      if (slots[b] < 0) continue;
      check_outputs(slots[b], in.o.data() + b * HV * DV, 1, tol);
      table.advance(slots[b], 1);
      ++pos[slots[b]];
    }
    return in.o;
  }

  void check_outputs(int slot, const float* o, int n, double tol) {
    const auto first = ref_o[slot].begin() + static_cast<std::ptrdiff_t>(pos[slot]) * HV * DV;
    std::vector<double> want(first, first + static_cast<std::ptrdiff_t>(n) * HV * DV);
    std::vector<float> got(o, o + static_cast<std::ptrdiff_t>(n) * HV * DV);
    const int at = pos[slot];
    CAPTURE(slot);
    CAPTURE(at);
    CHECK(hctest::rel_rms(got, want) <= tol);
  }

  // The pool state holds the state at the last flush (pos - cursor): compare it with fp64.
  void check_state(int slot, double tol) {
    std::vector<double> want, got;
    const int flushed_at = pos[slot] - table.cursor(slot);
    for (int v = 0; v < HV; ++v) {
      auto st = hctest::initial_state(req[slot], v);
      std::vector<double> scratch(req[slot].o_size());
      hctest::reference_run(req[slot], delta, v, st, scratch, 0, flushed_at);
      want.insert(want.end(), st.begin(), st.end());
      const auto g = hctest::load_state(L, DK, DV, state_of(slot, v));
      got.insert(got.end(), g.begin(), g.end());
    }
    CAPTURE(slot);
    CAPTURE(flushed_at);
    CHECK(hctest::rel_rms(got, want) <= tol);
  }
};

constexpr auto V = hc::state_layout::v_major;
constexpr auto K = hc::state_layout::k_major;

}  // namespace

TEST_CASE("kv_buffer_table: open, capacity, close, strong guarantee, cursor rule") {
  hc::kv_buffer_table t({.num_slots = 4, .num_blocks = 4, .block_tokens = 8, .flush_interval = 8,
                         .max_new_tokens = 4, .kv_only_crossover = 20});
  CHECK(t.capacity(false) == 11);
  CHECK(t.capacity(true) == 23);
  CHECK(t.max_blocks_per_slot() == 3);
  REQUIRE(t.open(0, false));
  CHECK(t.free_blocks() == 2);
  CHECK(t.open(0, false).error() == hybridcache::errc::invalid_argument);  // already open
  CHECK(t.open(9, false).error() == hybridcache::errc::invalid_argument);
  const auto before = t.version();
  CHECK(t.open(1, true).error() == hybridcache::errc::out_of_capacity);  // needs 3 blocks, 2 free
  CHECK(t.free_blocks() == 2);
  CHECK(t.version() == before);
  CHECK_FALSE(t.is_open(1));
  t.close(0);
  CHECK(t.free_blocks() == 4);
  REQUIRE(t.open(1, true));
  CHECK(t.free_blocks() == 1);
  CHECK_FALSE(t.state_valid(1));
  for (int i = 0; i < 19; ++i) CHECK_FALSE(t.advance(1, 1).fold);
  const auto st = t.advance(1, 1);  // reaches the crossover: fold + switch, surplus block released
  CHECK(st.fold);
  CHECK(t.state_valid(1));
  CHECK(t.cursor(1) == 0);
  CHECK(t.free_blocks() == 2);
  CHECK_THROWS_AS(t.advance(1, 20), hybridcache::invalid_argument);
  CHECK_THROWS_AS(hc::kv_buffer_table({.num_slots = 0}), hybridcache::invalid_argument);
  CHECK_THROWS_AS(hc::kv_buffer_table({.num_slots = 1, .num_blocks = 1, .block_tokens = 4}), hybridcache::invalid_argument);
  // The cursor rule the kernels share.
  CHECK(hc::advance_cursor(15, true, 1, 16, 0).fold);
  CHECK_FALSE(hc::advance_cursor(14, true, 1, 16, 0).fold);
  CHECK(hc::advance_cursor(14, true, 3, 16, 0).length == 0);
  CHECK(hc::advance_cursor(2, true, 0, 16, 0).length == 2);
  CHECK(hc::optimal_flush_interval(128, 128) == 16);
  CHECK(hc::kv_only_crossover(16, 32, 128, 128) == 171);
  CHECK(hc::kv_only_crossover(8, 8, 128, 128) == 128);
}

TEST_CASE("KVBuffer decode through flush cycles matches the fp64 recurrence") {
  SUBCASE("GDN, Qwen3-Next heads (H 16, HV 32, d 128), B 16, two requests + a skipped entry") {
    harness<hc::delta_rule, V, 128, 128, hc::bfloat16_t, float> hx(
        {.num_slots = 3, .num_blocks = 6, .block_tokens = 8, .flush_interval = 16}, 16, 32, 18, 100, 1.0);
    hx.open(0, false);
    hx.open(2, false);
    std::vector<float> untouched(hx.states.data() + 32 * 128 * 128, hx.states.data() + 2 * 32 * 128 * 128);
    const std::vector<float> initial(hx.states.data(), hx.states.data() + 32 * 128 * 128);
    for (int step = 0; step < 18; ++step) {
      const auto o = hx.decode({2, -1, 0}, 2e-3);
      for (int i = 0; i < 32 * 128; ++i) REQUIRE(o[32 * 128 + i] == sentinel);  // skipped entry untouched
      if (step == 14)  // m = B-1: the state is still the one written at open (read, never written)
        CHECK(std::memcmp(initial.data(), hx.states.data(), initial.size() * sizeof(float)) == 0);
      if (step == 15) hx.check_state(0, 2e-3);          // flush at m = B
    }
    CHECK(std::memcmp(untouched.data(), hx.states.data() + 32 * 128 * 128, untouched.size() * sizeof(float)) == 0);
    CHECK(hx.table.cursor(0) == 2);
    CHECK(hx.keys.guards_intact());
    CHECK(hx.values.guards_intact());
    CHECK(hx.decays.guards_intact());
    CHECK(hx.states.guards_intact());
  }
  SUBCASE("linear attention with decay, d 60, GVA 4, B 5, fp16 values in the buffer") {
    harness<hc::linear_rule, K, 60, 60, hc::half_t, hc::half_t> hx(
        {.num_slots = 2, .num_blocks = 4, .block_tokens = 3, .flush_interval = 5}, 1, 4, 23, 200, 10.0);
    hx.open(0, false);
    hx.open(1, false);
    for (int step = 0; step < 23; ++step) {
      hx.decode({1, 0}, 1e-3);
      if (step % 5 == 4) {
        hx.check_state(0, 1e-3);
        hx.check_state(1, 1e-3);
      }
    }
    CHECK(hx.keys.guards_intact());
    CHECK(hx.values.guards_intact());
  }
}

TEST_CASE("KVBuffer with B = 1 is bit-identical to recurrent decode") {
  harness<hc::delta_rule, V, 100, 100, float, float> hx({.num_slots = 2, .num_blocks = 2, .block_tokens = 1, .flush_interval = 1},
                                                         2, 4, 6, 300, 0.1);
  hx.open(0, false);
  hx.open(1, false);
  guarded<float> rec_states(hx.states.size(), 0.0f);
  std::memcpy(rec_states.data(), hx.states.data(), hx.states.size() * sizeof(float));
  for (int step = 0; step < 6; ++step) {
    const std::vector<std::int32_t> slots{0, 1};
    auto in = hx.inputs(slots, 1);
    auto io = hx.io(slots, 1, in);
    io.states = rec_states.data();
    hc::recurrent_step_host<hc::delta_rule, V, 100, 100>(io);
    const auto rec_o = in.o;
    const auto buf_o = hx.decode(slots, 2e-3);
    REQUIRE(std::memcmp(rec_o.data(), buf_o.data(), rec_o.size() * sizeof(float)) == 0);
    REQUIRE(std::memcmp(rec_states.data(), hx.states.data(), hx.states.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("fold_row and group_dot round as explicit FMAs, the spelling nvcc and g++ share") {
  // nvcc contracts `alpha * s + k * u` into an FMA of its choice, g++ does not: the shared
  // functions spell the FMA out (fma(k, u, alpha * s); acc = fma(a, b, acc)) so that every
  // compiler rounds alike. Random inputs where the unfused spelling differs in some element.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u01(-1.0f, 1.0f);
  constexpr int N = 64;
  int differs = 0;
  for (int rep = 0; rep < 50; ++rep) {
    float s[N], k[N], q[N];
    for (int e = 0; e < N; ++e) s[e] = u01(rng), k[e] = u01(rng), q[e] = u01(rng);
    const float alpha = 0.5f + 0.5f * u01(rng), uu = u01(rng);
    float folded[N];
    std::memcpy(folded, s, sizeof s);
    hc::fold_row(folded, alpha, k, uu);
    for (int e = 0; e < N; ++e) {
      const float product = alpha * s[e];
      const float fused = std::fma(k[e], uu, product);
      REQUIRE(std::memcmp(&folded[e], &fused, sizeof(float)) == 0);
      const volatile float kv = k[e] * uu;  // the two-rounding spelling
      differs += (product + kv) != fused ? 1 : 0;
    }
    float acc = 0.0f;
    for (int e = 0; e < N; ++e) acc = std::fma(s[e], q[e], acc);
    const float dot = hc::group_dot(s, q, hc::serial_group{});
    REQUIRE(std::memcmp(&dot, &acc, sizeof(float)) == 0);
  }
  CHECK(differs > 0);  // the test can tell the spellings apart
}

TEST_CASE("speculative verification: n drafts in parallel, commit only the accepted prefix") {
  for (int m : {0, 5, 7}) {
    for (int accept = 0; accept <= 4; ++accept) {
      CAPTURE(m);
      CAPTURE(accept);
      harness<hc::delta_rule, V, 64, 64, float, float> hx(
          {.num_slots = 2, .num_blocks = 6, .block_tokens = 4, .flush_interval = 8, .max_new_tokens = 4}, 1, 2, 24,
          400, 1.0);
      const auto wrong = hctest::make_problem(999, 24, 1, 2, 64, 64, 1.0, 0.3, true);
      hx.open(0, false);
      hx.open(1, false);
      for (int i = 0; i < m; ++i) hx.decode({0, 1}, 2e-3);
      const std::vector<float> state_before(hx.states.data(), hx.states.data() + hx.states.size());
      // Verify 4 drafts; the first `accept` are right, the rest come from another sequence.
      const std::vector<std::int32_t> slots{0, -1, 1};
      hx.table.check_step(slots, 4);
      auto in = hx.inputs(slots, 4, &wrong, accept);
      auto io = hx.io(slots, 4, in);
      hc::kv_step_host<hc::delta_rule, V, 64, 64>(io, hx.ref(), 8, 0, false);
      // No state write during verification; outputs of the right drafts match fp64.
      REQUIRE(std::memcmp(state_before.data(), hx.states.data(), state_before.size() * sizeof(float)) == 0);
      if (accept > 0) {
        hx.check_outputs(0, in.o.data(), accept, 2e-3);
        hx.check_outputs(1, in.o.data() + 2 * 4 * 2 * 64, accept, 2e-3);
      }
      for (std::size_t i = 4 * 2 * 64; i < 2 * 4 * 2 * 64; ++i) REQUIRE(in.o[i] == sentinel);
      // Commit: entry 0 accepts `accept`, entry 1 accepts `accept` too; a skipped entry in between.
      const std::vector<std::int32_t> acc{accept, 3, accept};
      hc::kv_commit_host<hc::delta_rule, V, 64, 64>(slots.data(), acc.data(), 3, 1, 2, hx.states.data(), hx.ref(),
                                                   hx.req[0].opt, 8, 0);
      for (int s : {0, 1}) {
        const auto st = hx.table.advance(s, accept);
        hx.pos[s] += accept;
        CHECK(st.fold == (m + accept >= 8));
        if (st.fold) hx.check_state(s, 2e-3);
      }
      if (m + accept < 8)
        REQUIRE(std::memcmp(state_before.data(), hx.states.data(), state_before.size() * sizeof(float)) == 0);
      // Decoding continues with the true sequence; rejected drafts leave no trace.
      for (int i = 0; i < 10; ++i) hx.decode({0, 1}, 2e-3);
      hx.check_state(0, 2e-3);
      CHECK(hx.states.guards_intact());
      CHECK(hx.values.guards_intact());
    }
  }
}

TEST_CASE("KV-only decode below the crossover, then fold into a state and switch to chunkwise") {
  harness<hc::delta_rule, V, 60, 60, float, float> hx(
      {.num_slots = 2, .num_blocks = 12, .block_tokens = 4, .flush_interval = 4, .kv_only_crossover = 10}, 1, 2, 30,
      500, 1.0);
  // KV-only requests start from a zero state: make the fp64 oracle agree.
  for (auto& p : hx.req) std::fill(p.s0.begin(), p.s0.end(), 0.0);
  for (int s = 0; s < 2; ++s)
    for (int v = 0; v < 2; ++v) {
      auto st = hctest::initial_state(hx.req[s], v);
      hctest::reference_run(hx.req[s], true, v, st, hx.ref_o[s], 0, 30);
    }
  hx.open(0, true);
  hx.open(1, true);
  const int free_kv_only = hx.table.free_blocks();
  for (int step = 0; step < 30; ++step) {
    hx.decode({0, 1}, 2e-3);
    if (step < 9) {
      CHECK_FALSE(hx.table.state_valid(0));
      REQUIRE(hx.states.data()[0] == sentinel);  // the state is never read or written
    }
    if (step == 9) {
      CHECK(hx.table.state_valid(0));
      CHECK(hx.table.free_blocks() == free_kv_only + 4);  // both requests: 3 -> 1 block
      hx.check_state(0, 2e-3);
    }
  }
  hx.check_state(1, 2e-3);
}

TEST_CASE("bad input: clear errors before any write") {
  harness<hc::delta_rule, V, 64, 64, float, float> hx(
      {.num_slots = 3, .num_blocks = 6, .block_tokens = 4, .flush_interval = 8, .max_new_tokens = 2}, 1, 2, 8, 600, 1.0);
  hx.open(0, false);
  CHECK_THROWS_AS(hx.table.check_step(std::vector<std::int32_t>{0}, 3), hybridcache::invalid_argument);  // drafts > capacity
  CHECK_THROWS_AS(hx.table.check_step(std::vector<std::int32_t>{1}, 1), hybridcache::invalid_argument);  // slot not open
  CHECK_THROWS_AS(hx.table.check_step(std::vector<std::int32_t>{7}, 1), hybridcache::invalid_argument);  // out of range
  CHECK_NOTHROW(hx.table.check_step(std::vector<std::int32_t>{-1, 0}, 2));
  CHECK_THROWS_AS(hx.table.check_step(std::vector<std::int32_t>{0, -1, 0}, 1), hybridcache::invalid_argument);  // twice
  CHECK_NOTHROW(hx.table.check_step(std::vector<std::int32_t>{0, -1, -1}, 1));  // marks do not leak between checks
  for (int i = 0; i < 7; ++i) hx.decode({0}, 2e-3);
  CHECK_THROWS_AS(hx.table.advance(0, 3), hybridcache::invalid_argument);  // past the reserved buffer
  CHECK(hx.table.cursor(0) == 7);
  const std::vector<std::int32_t> slots{0};
  auto in = hx.inputs(slots, 1);
  in.k[3] = std::numeric_limits<float>::quiet_NaN();
  auto io = hx.io(slots, 1, in);
  const std::vector<float> before(hx.states.all);
#if !defined(NDEBUG)
  CHECK_THROWS_AS((hc::kv_step_host<hc::delta_rule, V, 64, 64>(io, hx.ref(), 8, 0, true)), hybridcache::invalid_argument);
  CHECK(before == hx.states.all);
  // A log decay of -inf is a reset (alpha = 0), accepted; NaN and +inf are not.
  in.k[3] = 0.5f;
  in.g[0] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS((hc::recurrent_step_host<hc::delta_rule, V, 64, 64>(hx.io(slots, 1, in))), hybridcache::invalid_argument);
  in.g[0] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS((hc::recurrent_step_host<hc::delta_rule, V, 64, 64>(hx.io(slots, 1, in))), hybridcache::invalid_argument);
  CHECK(before == hx.states.all);
#endif
  io.num_v_heads = 3;  // not a multiple of H... (H = 1 always divides); use H = 2 instead
  io.num_k_heads = 2;
  CHECK_THROWS_AS((hc::recurrent_step_host<hc::delta_rule, V, 64, 64>(io)), hybridcache::invalid_argument);
  CHECK(before == hx.states.all);
  in.k[3] = 0.5f;
  in.g[0] = -std::numeric_limits<float>::infinity();
  CHECK_NOTHROW((hc::recurrent_step_host<hc::delta_rule, V, 64, 64>(hx.io(slots, 1, in))));
}

TEST_CASE("kv_buffer_table: 20000 random operations against a naive model") {
  const hc::kv_buffer_config cfg{.num_slots = 8, .num_blocks = 30, .block_tokens = 4, .flush_interval = 6,
                                 .max_new_tokens = 3, .kv_only_crossover = 13};
  hc::kv_buffer_table t(cfg);
  struct naive_slot {
    bool open = false, valid = false;
    int cursor = 0, blocks = 0;
  };
  std::vector<naive_slot> model(8);
  auto blocks_for = [&](int tokens) { return (tokens + 3) / 4; };
  auto used = [&] {
    int u = 0;
    for (auto& s : model) u += s.open ? s.blocks : 0;
    return u;
  };
  std::mt19937_64 rng(99);
  for (int op = 0; op < 20000; ++op) {
    const int s = static_cast<int>(rng() % 9) - (rng() % 16 == 0 ? 3 : 0);  // some out-of-range slots
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {
      const bool kv_only = rng() % 2 == 0;
      const int need = blocks_for(kv_only ? 13 - 1 + 3 : 6 - 1 + 3);
      const auto r = t.open(s, kv_only);
      const bool ok = s >= 0 && s < 8 && !model[s].open && need <= 30 - used();
      REQUIRE(static_cast<bool>(r) == ok);
      if (ok) model[s] = {true, !kv_only, 0, need};
    } else if (kind == 1) {
      t.close(s);
      if (s >= 0 && s < 8) model[s] = {};
    } else {
      const int accepted = static_cast<int>(rng() % 4);
      const bool open = s >= 0 && s < 8 && model[s].open;
      const int cap = open ? (model[s].valid ? 6 - 1 + 3 : 13 - 1 + 3) : 0;
      if (!open || model[s].cursor + accepted > cap) {
        const int before = t.free_blocks();
        CHECK_THROWS_AS(t.advance(s, accepted), hybridcache::invalid_argument);
        REQUIRE(t.free_blocks() == before);
        continue;
      }
      const auto st = t.advance(s, accepted);
      naive_slot& m = model[s];
      const int n = m.cursor + accepted;
      const bool fold = m.valid ? n >= 6 : n >= 13;
      REQUIRE(st.fold == fold);
      if (fold && !m.valid) m.blocks = blocks_for(6 - 1 + 3);
      m.cursor = fold ? 0 : n;
      m.valid = m.valid || fold;
    }
    REQUIRE(t.free_blocks() == 30 - used());
    for (int i = 0; i < 8; ++i) {
      REQUIRE(t.is_open(i) == model[i].open);
      if (!model[i].open) continue;
      REQUIRE(t.cursor(i) == model[i].cursor);
      REQUIRE(t.state_valid(i) == model[i].valid);
      // The slot's table row holds exactly its blocks, all distinct across slots.
      int owned = 0;
      for (int b = 0; b < t.max_blocks_per_slot(); ++b) owned += t.block_table_data()[i * t.max_blocks_per_slot() + b] >= 0;
      REQUIRE(owned == model[i].blocks);
    }
    std::vector<int> seen(30, 0);
    for (int i = 0; i < 8 * t.max_blocks_per_slot(); ++i) {
      const int b = t.block_table_data()[i];
      if (b >= 0) REQUIRE(++seen[b] == 1);
    }
  }
}

TEST_CASE("KV-only request from a short prefill: prefill emits u, the buffer takes it, decode continues") {
  harness<hc::delta_rule, V, 60, 60, float, float> hx(
      {.num_slots = 1, .num_blocks = 3, .block_tokens = 4, .flush_interval = 4, .kv_only_crossover = 10}, 1, 2, 20,
      700, 1.0);
  auto& p = hx.req[0];
  std::fill(p.s0.begin(), p.s0.end(), 0.0);  // a KV-only request starts from no state
  for (int v = 0; v < 2; ++v) {
    auto st = hctest::initial_state(p, v);
    hctest::reference_run(p, true, v, st, hx.ref_o[0], 0, 20);
  }
  // Prefill the 7-token prompt with the batched prefill program, collecting u.
  constexpr int prompt = 7;
  const std::vector<std::int64_t> cu{0, prompt}, starts{0};
  const std::vector<std::int32_t> slot0{0};
  std::vector<float> zero_state(2 * 60 * 60, 0.0f), o(prompt * 2 * 60), u(prompt * 2 * 60);
  hc::prefill_io<float, float> io;
  io.num_seqs = 1;
  io.num_k_heads = 1;
  io.num_v_heads = 2;
  io.chunk = 4;
  io.cu_seqlens = cu.data();
  io.start_positions = starts.data();
  io.slots = slot0.data();
  io.q = p.q.data();
  io.k = p.k.data();
  io.v = p.v.data();
  io.log_decay = p.g.data();
  io.beta = p.beta.data();
  io.o = o.data();
  io.states = zero_state.data();
  io.u_out = u.data();
  io.qk = p.opt;
  hc::chunked_prefill_host<hc::delta_rule, V, 60, 60>(io);
  hx.check_outputs(0, o.data(), prompt, 5e-3);
  // The request stays KV-only: its buffer takes the prompt's (k, u, g); no state is written.
  REQUIRE(hx.table.open(0, true));
  hc::kv_buffer_append_host(hx.ref(), 0, prompt, p.k.data(), u.data(), p.g.data());
  CHECK_FALSE(hx.table.advance(0, prompt).fold);
  hx.pos[0] = prompt;
  for (int step = prompt; step < 20; ++step) {
    hx.decode({0}, 5e-3);
    CHECK(hx.table.state_valid(0) == (step >= 9));  // folds at the crossover (10 tokens)
  }
  hx.check_state(0, 5e-3);
  CHECK(hx.states.guards_intact());
  CHECK(hx.keys.guards_intact());
  CHECK(hx.values.guards_intact());
}

TEST_CASE("fused Qwen3-Next gating gives the same bits as precomputed g and beta") {
  harness<hc::delta_rule, V, 64, 64, hc::bfloat16_t, float> hx(
      {.num_slots = 2, .num_blocks = 4, .block_tokens = 4, .flush_interval = 4}, 2, 4, 6, 800, 1.0);
  hx.open(0, false);
  hx.open(1, false);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> a_log(4), dt_bias(4);
  for (auto& x : a_log) x = 0.1f * n01(rng);
  for (auto& x : dt_bias) x = 0.1f * n01(rng);
  guarded<float> fused_states(hx.states.size(), 0.0f);
  std::memcpy(fused_states.data(), hx.states.data(), hx.states.size() * sizeof(float));
  for (int step = 0; step < 6; ++step) {
    const std::vector<std::int32_t> slots{1, 0};
    auto in = hx.inputs(slots, 1);
    std::vector<hc::bfloat16_t> a(in.g.size()), b(in.g.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = hc::from_float<hc::bfloat16_t>(0.5f * n01(rng));
      b[i] = hc::from_float<hc::bfloat16_t>(n01(rng));
      in.g[i] = hc::qwen3_next_log_decay(a_log[i % 4], hc::to_float(a[i]), dt_bias[i % 4]);
      in.beta[i] = hc::qwen3_next_beta(hc::to_float(b[i]));
    }
    auto io = hx.io(slots, 1, in);
    io.states = fused_states.data();
    std::vector<float> fused_o(in.o.size(), sentinel);
    auto fused = io;
    fused.o = fused_o.data();
    fused.log_decay = nullptr;
    fused.beta = nullptr;
    fused.gate_a = a.data();
    fused.gate_b = b.data();
    fused.a_log = a_log.data();
    fused.dt_bias = dt_bias.data();
    hc::recurrent_step_host<hc::delta_rule, V, 64, 64>(fused);
    io.states = hx.states.data();
    hc::recurrent_step_host<hc::delta_rule, V, 64, 64>(io);
    REQUIRE(std::memcmp(fused_o.data(), in.o.data(), in.o.size() * sizeof(float)) == 0);
    REQUIRE(std::memcmp(fused_states.data(), hx.states.data(), hx.states.size() * sizeof(float)) == 0);
  }
  const std::vector<std::int32_t> one{0};
  auto in = hx.inputs(one, 1);
  auto io = hx.io(one, 1, in);
  io.gate_a = in.q.data();  // gate_b etc. missing
  CHECK_THROWS_AS((hc::recurrent_step_host<hc::delta_rule, V, 64, 64>(io)), hybridcache::invalid_argument);
}
