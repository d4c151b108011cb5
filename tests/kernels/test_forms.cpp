// Host tests of the per-head forms (recurrent, chunkwise, parallel, checkpoints) against the
// fp64 recurrence, for linear attention and Gated DeltaNet.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "hybridcache/attention/linear_attention_forms.hpp"
#include "hybridcache/prefix/types.hpp"
#include "reference.hpp"

namespace hc = hybridcache::attention;
using hctest::problem;

namespace {

enum class form { recurrent, chunkwise, parallel };

struct run_result {
  std::vector<float> o;       // [T][HV][dv]
  std::vector<double> state;  // [HV][dk][dv] K-major
  std::vector<std::vector<double>> checkpoints;  // per position: [HV][dk][dv]
};

// Runs one form over every value head of `p`. Inputs are read as `In`.
template <class Rule, hc::state_layout L, int DK, int DV, class In>
run_result run_form(const problem& p, form f, int chunk, const std::vector<std::int64_t>& ckpts = {}) {
  REQUIRE(p.dk == DK);
  REQUIRE(p.dv == DV);
  const auto q = hctest::to_io<In>(p.q), k = hctest::to_io<In>(p.k), v = hctest::to_io<In>(p.v);
  run_result r;
  r.o.assign(static_cast<std::size_t>(p.T) * p.HV * DV, -7.0f);
  constexpr std::int64_t n = static_cast<std::int64_t>(DK) * DV;
  std::vector<float> ck_states(ckpts.size() * static_cast<std::size_t>(n));
  r.checkpoints.assign(ckpts.size(), std::vector<double>(static_cast<std::size_t>(p.HV) * n));
  for (int hv = 0; hv < p.HV; ++hv) {
    const int h = hv / (p.HV / p.H);
    std::vector<float> s(static_cast<std::size_t>(n));
    hctest::store_state(L, DK, DV, hctest::initial_state(p, hv), s.data());
    hc::head_input<In> in;
    in.q = q.data() + h * DK;
    in.k = k.data() + h * DK;
    in.v = v.data() + hv * DV;
    in.q_stride = in.k_stride = static_cast<std::int64_t>(p.H) * DK;
    in.v_stride = static_cast<std::int64_t>(p.HV) * DV;
    in.log_decay = p.g.data() + hv;
    in.decay_stride = p.HV;
    in.beta = p.beta.data() + hv;
    in.beta_stride = p.HV;
    in.length = p.T;
    hc::head_output<float> out{r.o.data() + hv * DV, static_cast<std::int64_t>(p.HV) * DV};
    const hc::checkpoint_sink sink{ckpts.data(), static_cast<int>(ckpts.size()), ck_states.data(), n};
    const hc::state_ref<L, DK, DV> sr{s.data()};
    switch (f) {
      case form::recurrent: hc::recurrent_head<Rule>(in, out, sr, p.opt, 0, sink); break;
      case form::chunkwise: hc::chunkwise_head<Rule>(in, out, sr, p.opt, chunk, 0, sink); break;
      case form::parallel: hc::parallel_head<Rule>(in, out, sr, p.opt); break;
    }
    const auto fin = hctest::load_state(L, DK, DV, s.data());
    r.state.insert(r.state.end(), fin.begin(), fin.end());
    for (std::size_t c = 0; c < ckpts.size(); ++c) {
      const auto st = hctest::load_state(L, DK, DV, ck_states.data() + c * n);
      std::copy(st.begin(), st.end(), r.checkpoints[c].begin() + hv * n);
    }
  }
  return r;
}

struct reference_result {
  std::vector<double> o, state;
  std::vector<std::vector<double>> checkpoints;
};

reference_result run_reference(const problem& p, bool delta, const std::vector<std::int64_t>& ckpts = {}) {
  reference_result r;
  r.o.assign(static_cast<std::size_t>(p.T) * p.HV * p.dv, 0.0);
  const std::size_t n = static_cast<std::size_t>(p.dk) * p.dv;
  r.checkpoints.assign(ckpts.size(), std::vector<double>(p.HV * n));
  for (int hv = 0; hv < p.HV; ++hv) {
    auto s = hctest::initial_state(p, hv);
    int t = 0;
    for (std::size_t c = 0; c < ckpts.size(); ++c) {
      hctest::reference_run(p, delta, hv, s, r.o, t, static_cast<int>(ckpts[c]));
      t = static_cast<int>(ckpts[c]);
      std::copy(s.begin(), s.end(), r.checkpoints[c].begin() + static_cast<std::ptrdiff_t>(hv * n));
    }
    hctest::reference_run(p, delta, hv, s, r.o, t, p.T);
    r.state.insert(r.state.end(), s.begin(), s.end());
  }
  return r;
}

// Checks recurrent, chunkwise (and parallel for short T) against the oracle.
template <class Rule, hc::state_layout L, int DK, int DV, class In>
void check_forms(problem p, int chunk, double tol_recurrent, double tol_chunk, bool parallel) {
  hctest::round_inputs<In>(p);
  const bool delta = Rule::delta;
  std::vector<std::int64_t> ckpts;
  if (p.T > chunk + 3) ckpts = {chunk, chunk + 3};  // at a boundary and inside the next chunk
  ckpts.push_back(p.T);
  const auto ref = run_reference(p, delta, ckpts);
  CAPTURE(p.T);
  CAPTURE(chunk);
  const auto rec = run_form<Rule, L, DK, DV, In>(p, form::recurrent, chunk, ckpts);
  CHECK(hctest::rel_rms(rec.o, ref.o) <= tol_recurrent);
  CHECK(hctest::rel_rms(rec.state, ref.state) <= tol_recurrent);
  const auto chk = run_form<Rule, L, DK, DV, In>(p, form::chunkwise, chunk, ckpts);
  CHECK(hctest::rel_rms(chk.o, ref.o) <= tol_chunk);
  CHECK(hctest::rel_rms(chk.state, ref.state) <= tol_chunk);
  for (std::size_t c = 0; c < ckpts.size(); ++c) {
    CAPTURE(ckpts[c]);
    CHECK(hctest::rel_rms(rec.checkpoints[c], ref.checkpoints[c]) <= tol_recurrent);
    CHECK(hctest::rel_rms(chk.checkpoints[c], ref.checkpoints[c]) <= tol_chunk);
  }
  if (parallel) {
    const auto par = run_form<Rule, L, DK, DV, In>(p, form::parallel, chunk);
    CHECK(hctest::rel_rms(par.o, ref.o) <= tol_chunk);
    CHECK(hctest::rel_rms(par.state, ref.state) <= tol_chunk);
  }
}

constexpr auto K = hc::state_layout::k_major;
constexpr auto V = hc::state_layout::v_major;

}  // namespace

TEST_CASE("linear attention: recurrent, chunkwise, parallel match fp64 (rel RMS <= 1e-3)") {
  SUBCASE("no decay, d 64, T 75, chunk 16, fp32") {
    check_forms<hc::linear_rule, K, 64, 64, float>(hctest::make_problem(1, 75, 2, 2, 64, 64, 0, 0, false), 16, 1e-3,
                                                   1e-3, true);
  }
  SUBCASE("scalar decay, d 60, T 63, chunk 32, bf16, V-major") {
    check_forms<hc::linear_rule, V, 60, 60, hc::bfloat16_t>(hctest::make_problem(2, 63, 1, 2, 60, 60, 1.0, 0.5, false),
                                                             32, 1e-3, 1e-3, true);
  }
  SUBCASE("scalar decay, d 100, T 1000, chunk 64, fp16, normalised q/k") {
    check_forms<hc::linear_rule, K, 100, 100, hc::half_t>(hctest::make_problem(3, 1000, 1, 1, 100, 100, 10.0, 0.5, true),
                                                           64, 1e-3, 1e-3, false);
  }
}

TEST_CASE("gated deltanet: recurrent <= 2e-3, chunkwise <= 5e-3 against fp64") {
  SUBCASE("Qwen3-Next heads (H 16, HV 32, d 128), T 40, chunk 16, bf16, V-major") {
    check_forms<hc::delta_rule, V, 128, 128, hc::bfloat16_t>(
        hctest::make_problem(10, 40, 16, 32, 128, 128, 1.0, 0.5, true), 16, 2e-3, 5e-3, false);
  }
  SUBCASE("d 128, T 1000, GVA 2, chunk 64, gates / 0.1, K-major") {
    check_forms<hc::delta_rule, K, 128, 128, float>(hctest::make_problem(11, 1000, 1, 2, 128, 128, 0.1, 0.5, true), 64,
                                                    2e-3, 5e-3, false);
  }
  SUBCASE("d 60, T 63, GVA 1, chunk 16, gates / 0.01 (strong decay)") {
    check_forms<hc::delta_rule, V, 60, 60, float>(hctest::make_problem(12, 63, 2, 2, 60, 60, 0.01, 0.5, true), 16, 2e-3,
                                                  5e-3, true);
  }
  SUBCASE("d 100, T 75, GVA 4, chunk 32, gates / 10, fp16") {
    check_forms<hc::delta_rule, V, 100, 100, hc::half_t>(hctest::make_problem(13, 75, 1, 4, 100, 100, 10.0, 0.5, true),
                                                          32, 2e-3, 5e-3, true);
  }
  SUBCASE("d 64, T 75, all gates zero (no decay), chunk 32") {
    check_forms<hc::delta_rule, K, 64, 64, float>(hctest::make_problem(14, 75, 1, 2, 64, 64, 1.0, 1.0, true), 32, 2e-3,
                                                  5e-3, true);
  }
}

TEST_CASE("state layouts: K-major and V-major agree (<= 1e-4)") {
  auto p = hctest::make_problem(20, 50, 1, 2, 60, 60, 1.0, 0.5, true);
  const auto a = run_form<hc::delta_rule, K, 60, 60, float>(p, form::chunkwise, 16);
  const auto b = run_form<hc::delta_rule, V, 60, 60, float>(p, form::chunkwise, 16);
  CHECK(hctest::rel_rms(a.o, b.o) <= 1e-4);
  CHECK(hctest::rel_rms(a.state, b.state) <= 1e-4);
  float cells[15] = {};
  hc::state_ref<K, 3, 5> sk{cells};
  hc::state_ref<V, 3, 5> sv{cells};
  CHECK(&sk(2, 4) - cells == 2 * 5 + 4);  // S[i][c] at i*d_v + c
  CHECK(&sv(2, 4) - cells == 4 * 3 + 2);  // S[i][c] at c*d_k + i
}

TEST_CASE("checkpoints: unaligned prefill start, every position of a chunk, plan validation") {
  // Prefill starts at absolute position 5 (a prefix hit); chunk 16: first chunk [5, 16).
  auto p = hctest::make_problem(30, 40, 1, 1, 64, 64, 1.0, 0.3, true);
  std::vector<std::int64_t> abs_pos;
  for (std::int64_t a = 5; a <= 45; ++a) abs_pos.push_back(a);
  const auto ref = run_reference(p, true, [&] {
    std::vector<std::int64_t> rel;
    for (auto a : abs_pos) rel.push_back(a - 5);
    return rel;
  }());
  const auto q = p.q, k = p.k, v = p.v;
  constexpr std::int64_t n = 64 * 64;
  std::vector<float> s(n), ck(abs_pos.size() * n), o(static_cast<std::size_t>(p.T) * 64);
  hctest::store_state(V, 64, 64, hctest::initial_state(p, 0), s.data());
  hc::head_input<float> in{q.data(), k.data(), v.data(), 64, 64, 64, p.g.data(), 1, p.beta.data(), 1, p.T};
  hc::chunkwise_head<hc::delta_rule>(in, hc::head_output<float>{o.data(), 64}, hc::state_ref<V, 64, 64>{s.data()}, p.opt,
                                     16, 5, hc::checkpoint_sink{abs_pos.data(), static_cast<int>(abs_pos.size()), ck.data(), n});
  for (std::size_t c = 0; c < abs_pos.size(); ++c) {
    CAPTURE(abs_pos[c]);
    CHECK(hctest::rel_rms(hctest::load_state(V, 64, 64, ck.data() + c * n), ref.checkpoints[c]) <= 5e-3);
  }
  CHECK(hctest::rel_rms(o, ref.o) <= 5e-3);

  struct site {
    std::int64_t position, chunk_boundary, roll_forward;
  };
  const site good[] = {{5, 5, 0}, {12, 5, 7}, {16, 16, 0}, {37, 32, 5}, {45, 32, 13}};
  CHECK_NOTHROW(hc::validate_checkpoint_sites(good, 5, 5, 40, 16));
  const site unsorted[] = {{16, 16, 0}, {12, 5, 7}};
  CHECK_THROWS_AS(hc::validate_checkpoint_sites(unsorted, 2, 5, 40, 16), hybridcache::invalid_argument);
  const site outside[] = {{46, 32, 14}};
  CHECK_THROWS_AS(hc::validate_checkpoint_sites(outside, 1, 5, 40, 16), hybridcache::invalid_argument);
  const site wrong_boundary[] = {{37, 16, 21}};
  CHECK_THROWS_AS(hc::validate_checkpoint_sites(wrong_boundary, 1, 5, 40, 16), hybridcache::invalid_argument);

  // The prefix cache's plan type is accepted as is.
  hybridcache::prefix::checkpoint_plan plan;
  plan.prefill_start = 5;
  plan.chunk = 16;
  plan.sites = {{12, 5, 7}, {32, 32, 0}, {45, 32, 13}};
  CHECK(hc::checkpoint_positions(plan, 40, 16) == std::vector<std::int64_t>{12, 32, 45});
  CHECK_THROWS_AS(hc::checkpoint_positions(plan, 40, 32), hybridcache::invalid_argument);
  plan.sites[1].roll_forward = 3;
  CHECK_THROWS_AS(hc::checkpoint_positions(plan, 40, 16), hybridcache::invalid_argument);
}

TEST_CASE("Qwen3-Next gating and q/k preparation") {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (int i = 0; i < 1000; ++i) {
    const float a_log = 0.5f * n01(rng), dt_bias = n01(rng), a = 4.0f * n01(rng), b = 3.0f * n01(rng);
    const double x = static_cast<double>(a) + dt_bias;
    const double sp = x > 20 ? x : std::log1p(std::exp(x));
    const double g = -std::exp(static_cast<double>(a_log)) * sp;
    CHECK(hc::qwen3_next_log_decay(a_log, a, dt_bias) == doctest::Approx(g).epsilon(1e-5));
    CHECK(hc::qwen3_next_beta(b) == doctest::Approx(1.0 / (1.0 + std::exp(-static_cast<double>(b)))).epsilon(1e-6));
  }
  CHECK(hc::softplus(25.0f) == 25.0f);  // threshold 20
  CHECK(hc::key_head_of(31, 16, 32) == 15);
  CHECK(hc::key_head_of(1, 16, 32) == 0);
  const auto opt = hc::qwen3_next_qk(128);
  CHECK(opt.l2_normalize);
  CHECK(opt.scale == doctest::Approx(1.0 / std::sqrt(128.0)));
  std::vector<float> raw(128, 0.5f);
  float x[128];
  hc::load_prepared<128>(raw.data(), opt, false, x, hc::serial_group{});
  CHECK(x[0] == doctest::Approx(0.5 / std::sqrt(128 * 0.25 + 1e-6)));
}

TEST_CASE("batched chunked prefill (the kernel's program) over packed sequences with checkpoints") {
  // Sequences of 75 and 40 tokens (the second starts at absolute position 5), one skipped entry.
  constexpr int d = 64, H = 2, HV = 4;
  constexpr std::int64_t n = static_cast<std::int64_t>(d) * d;
  const auto p0 = hctest::make_problem(40, 75, H, HV, d, d, 1.0, 0.3, true);
  const auto p1 = hctest::make_problem(41, 40, H, HV, d, d, 0.1, 0.3, true);
  const std::vector<std::int64_t> cu{0, 75, 75 + 3, 75 + 3 + 40}, starts{0, 0, 5};
  const std::vector<std::int32_t> slots{1, -1, 0};
  const std::vector<std::int64_t> ck_off{0, 3, 3, 6}, ck_pos{32, 39, 75, 5, 21, 45};
  std::vector<float> q, k, v, g, beta;
  for (const problem* p : {&p0, &p1}) {
    q.insert(q.end(), p->q.begin(), p->q.end());
    k.insert(k.end(), p->k.begin(), p->k.end());
    v.insert(v.end(), p->v.begin(), p->v.end());
    g.insert(g.end(), p->g.begin(), p->g.end());
    beta.insert(beta.end(), p->beta.begin(), p->beta.end());
    if (p == &p0) {  // the skipped sequence's 3 tokens: garbage that must not matter
      q.insert(q.end(), 3 * H * d, 9.0f);
      k.insert(k.end(), 3 * H * d, 9.0f);
      v.insert(v.end(), 3 * HV * d, 9.0f);
      g.insert(g.end(), 3 * HV, -1.0f);
      beta.insert(beta.end(), 3 * HV, 0.5f);
    }
  }
  std::vector<float> states(2 * HV * n), ck(ck_pos.size() * HV * n, -1.0f), o(cu.back() * HV * d, -3.0f);
  for (int hv = 0; hv < HV; ++hv) {
    hctest::store_state(V, d, d, hctest::initial_state(p0, hv), states.data() + (1 * HV + hv) * n);
    hctest::store_state(V, d, d, hctest::initial_state(p1, hv), states.data() + (0 * HV + hv) * n);
  }
  hc::prefill_io<float, float> io;
  io.num_seqs = 3;
  io.num_k_heads = H;
  io.num_v_heads = HV;
  io.chunk = 16;
  io.cu_seqlens = cu.data();
  io.start_positions = starts.data();
  io.slots = slots.data();
  io.q = q.data();
  io.k = k.data();
  io.v = v.data();
  io.log_decay = g.data();
  io.beta = beta.data();
  io.o = o.data();
  io.states = states.data();
  io.checkpoint_offsets = ck_off.data();
  io.checkpoint_positions = ck_pos.data();
  io.checkpoint_states = ck.data();
  io.qk = p0.opt;
  hc::chunked_prefill_host<hc::delta_rule, V, d, d>(io);

  const auto ref0 = run_reference(p0, true, {32, 39, 75});
  const auto ref1 = run_reference(p1, true, {0, 16, 40});  // absolute 5, 21, 45
  const std::vector<float> o0(o.begin(), o.begin() + 75 * HV * d), o1(o.begin() + 78 * HV * d, o.end());
  CHECK(hctest::rel_rms(o0, ref0.o) <= 5e-3);
  CHECK(hctest::rel_rms(o1, ref1.o) <= 5e-3);
  for (int i = 75 * HV * d; i < 78 * HV * d; ++i) REQUIRE(o[i] == -3.0f);  // skipped sequence untouched
  std::vector<double> fin0, fin1;
  for (int hv = 0; hv < HV; ++hv) {
    const auto a = hctest::load_state(V, d, d, states.data() + (1 * HV + hv) * n);
    const auto b = hctest::load_state(V, d, d, states.data() + (0 * HV + hv) * n);
    fin0.insert(fin0.end(), a.begin(), a.end());
    fin1.insert(fin1.end(), b.begin(), b.end());
  }
  CHECK(hctest::rel_rms(fin0, ref0.state) <= 5e-3);
  CHECK(hctest::rel_rms(fin1, ref1.state) <= 5e-3);
  for (int c = 0; c < 6; ++c) {
    CAPTURE(ck_pos[c]);
    std::vector<double> got;
    for (int hv = 0; hv < HV; ++hv) {
      const auto s = hctest::load_state(V, d, d, ck.data() + (c * HV + hv) * n);
      got.insert(got.end(), s.begin(), s.end());
    }
    CHECK(hctest::rel_rms(got, c < 3 ? ref0.checkpoints[c] : ref1.checkpoints[c - 3]) <= 5e-3);
  }
}
