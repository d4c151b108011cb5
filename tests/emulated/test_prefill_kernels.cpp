// The chunked-prefill kernels (chunk_prepare: every chunk at once; chunk_scan: the state pass)
// executed by the CTA emulator on packed sequences with tails, an unaligned start, a skipped
// slot, grouped heads, d = 60 and 64, checkpoints at arbitrary positions and g = -inf, against
// the fp64 recurrence at the anchors' tolerances (GDN chunk 5e-3, linear attention 1e-3), with
// 16-bit inputs on the tensor-core path (mma_fragments.hpp, emulated: K K^T and Q K^T for bf16
// and fp16, K S and Q S for bf16) and on the fp32 path; and
// the shared-memory bank count of the chunk programs for every chunk size.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "emulated_kernels.hpp"
#include "hybridcache/attention/kernel_bodies.hpp"
#include "hybridcache/attention/linear_attention_forms.hpp"
#include "reference.hpp"

namespace hc = hybridcache::attention;
namespace emu = hctest::emu;

namespace {

template <class Rule, hc::state_layout L, int D, class In>
void prefill_case(int chunk, double tol, bool resets, hc::chunk_math math = hc::chunk_math::tensor_cores) {
  constexpr int H = 1, HV = 2;
  constexpr std::int64_t n = static_cast<std::int64_t>(D) * D;
  // Sequences of 37 tokens (start 0), 4 (skipped), 29 (starting at absolute 5: a short first chunk).
  auto p0 = hctest::make_problem(40, 37, H, HV, D, D, 1.0, 0.3, true);
  auto p1 = hctest::make_problem(41, 29, H, HV, D, D, 0.1, 0.3, true);
  if (resets) {  // alpha = 0 inside a chunk, at a chunk's first token, at a sequence's first token
    for (int hv = 0; hv < HV; ++hv) {
      p0.g[static_cast<std::size_t>(5 * HV + hv)] = -std::numeric_limits<float>::infinity();
      p0.g[static_cast<std::size_t>(chunk * HV + hv)] = -std::numeric_limits<float>::infinity();
    }
    p1.g[static_cast<std::size_t>(0 * HV + 1)] = -std::numeric_limits<float>::infinity();
    p1.g[static_cast<std::size_t>(20 * HV + 2)] = -std::numeric_limits<float>::infinity();
  }
  hctest::round_inputs<In>(p0);
  hctest::round_inputs<In>(p1);
  const std::vector<std::int64_t> cu{0, 37, 41, 70}, starts{0, 0, 5};
  const std::vector<std::int32_t> slots{1, -1, 0};
  // Checkpoints: seq 0 at its start, a boundary, inside a chunk, its end; seq 2 at its start,
  // inside, at an absolute boundary, its end.
  const std::vector<std::int64_t> ck_off{0, 4, 4, 8}, ck_pos{0, chunk, chunk + 7, 37, 5, 9, 2 * chunk, 34};
  std::vector<float> q, k, v, g, beta;
  for (const hctest::problem* p : {&p0, &p1}) {
    q.insert(q.end(), p->q.begin(), p->q.end());
    k.insert(k.end(), p->k.begin(), p->k.end());
    v.insert(v.end(), p->v.begin(), p->v.end());
    g.insert(g.end(), p->g.begin(), p->g.end());
    beta.insert(beta.end(), p->beta.begin(), p->beta.end());
    if (p == &p0) {  // the skipped sequence's 4 tokens
      q.insert(q.end(), 4 * H * D, 9.0f);
      k.insert(k.end(), 4 * H * D, 9.0f);
      v.insert(v.end(), 4 * HV * D, 9.0f);
      g.insert(g.end(), 4 * HV, -1.0f);
      beta.insert(beta.end(), 4 * HV, 0.5f);
    }
  }
  const auto qi = hctest::to_io<In>(q), ki = hctest::to_io<In>(k), vi = hctest::to_io<In>(v);
  std::vector<float> states(2 * HV * n), ck(ck_pos.size() * HV * n, -1.0f), o(70 * HV * D, -3.0f), u(70 * HV * D, -3.0f);
  for (int hv = 0; hv < HV; ++hv) {
    hctest::store_state(L, D, D, hctest::initial_state(p0, hv), states.data() + (1 * HV + hv) * n);
    hctest::store_state(L, D, D, hctest::initial_state(p1, hv), states.data() + (0 * HV + hv) * n);
  }
  const auto states_before = states;
  std::vector<float> workspace(static_cast<std::size_t>(hc::prefill_workspace_floats(70, 3, HV, chunk)),
                               std::numeric_limits<float>::quiet_NaN());
  hc::prefill_io<In, float> io;
  io.num_seqs = 3;
  io.num_k_heads = H;
  io.num_v_heads = HV;
  io.chunk = chunk;
  io.cu_seqlens = cu.data();
  io.start_positions = starts.data();
  io.slots = slots.data();
  io.q = qi.data();
  io.k = ki.data();
  io.v = vi.data();
  io.log_decay = g.data();
  io.beta = beta.data();
  io.o = o.data();
  io.states = states.data();
  io.checkpoint_offsets = ck_off.data();
  io.checkpoint_positions = ck_pos.data();
  io.checkpoint_states = ck.data();
  io.u_out = u.data();
  io.workspace = workspace.data();
  io.qk = p0.opt;
  io.math = math;
  hctest::emulate("chunk_prepare", hc::chunk_prepare_shape<Rule, D, In>(70, 3, HV, chunk), [&](emu::lane& t) {
    hc::kernel_bodies::chunk_prepare<emu::lane, Rule, L, D, D>(t, io);
  });
  hctest::emulate("chunk_scan", hc::chunk_scan_shape<Rule, L, D, D, In, float>(3, HV, chunk), [&](emu::lane& t) {
    hc::kernel_bodies::chunk_scan<emu::lane, Rule, L, D, D>(t, io);
  });

  // fp64 reference; the skipped sequence and its state are untouched.
  auto run_ref = [&](const hctest::problem& p, const std::vector<std::int64_t>& rel) {
    std::vector<double> out(static_cast<std::size_t>(p.T) * HV * D);
    std::vector<std::vector<double>> cks(rel.size());
    std::vector<double> fin;
    for (int hv = 0; hv < HV; ++hv) {
      auto s = hctest::initial_state(p, hv);
      int t = 0;
      for (std::size_t c = 0; c < rel.size(); ++c) {
        hctest::reference_run(p, Rule::delta, hv, s, out, t, static_cast<int>(rel[c]));
        t = static_cast<int>(rel[c]);
        cks[c].insert(cks[c].end(), s.begin(), s.end());
      }
      hctest::reference_run(p, Rule::delta, hv, s, out, t, p.T);
      fin.insert(fin.end(), s.begin(), s.end());
    }
    return std::tuple{out, cks, fin};
  };
  const auto [o0, ck0, fin0] = run_ref(p0, {0, chunk, chunk + 7, 37});
  const auto [o1, ck1, fin1] = run_ref(p1, {0, 4, 2 * chunk - 5, 29});
  const double err_o0 = hctest::rel_rms(std::vector<float>(o.begin(), o.begin() + 37 * HV * D), o0);
  const double err_o1 = hctest::rel_rms(std::vector<float>(o.begin() + 41 * HV * D, o.end()), o1);
  CHECK(err_o0 <= tol);
  CHECK(err_o1 <= tol);
  for (int i = 37 * HV * D; i < 41 * HV * D; ++i) REQUIRE(o[i] == -3.0f);
  auto heads = [&](const float* base) {
    std::vector<double> out;
    for (int hv = 0; hv < HV; ++hv) {
      const auto s = hctest::load_state(L, D, D, base + hv * n);
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  };
  const double err_s0 = hctest::rel_rms(heads(states.data() + HV * n), fin0);
  const double err_s1 = hctest::rel_rms(heads(states.data()), fin1);
  CHECK(err_s0 <= tol);
  CHECK(err_s1 <= tol);
  MESSAGE(std::string(hc::gram_on_tensor_cores<In>(math) ? "tensor cores" : "fp32") << " path, rel-RMS vs fp64: o " << err_o0
          << " / " << err_o1 << ", final state " << err_s0 << " / " << err_s1 << " (tolerance " << tol << ")");
  for (int c = 0; c < 8; ++c) {
    CAPTURE(ck_pos[c]);
    CHECK(hctest::rel_rms(heads(ck.data() + c * HV * n), c < 4 ? ck0[c] : ck1[c - 4]) <= tol);
  }

  // The host driver runs the same programs with one thread: the same numbers up to the order
  // of the warp scan's additions.
  std::vector<float> o_host(o.size(), -3.0f), u_host(u.size(), -3.0f), ck_host(ck.size(), -1.0f), states_host = states_before;
  auto hio = io;
  hio.o = o_host.data();
  hio.u_out = u_host.data();
  hio.checkpoint_states = ck_host.data();
  hio.states = states_host.data();
  hio.workspace = nullptr;
  hc::chunked_prefill_host<Rule, L, D, D>(hio);
  const double host_o = hctest::rel_rms(o, o_host), host_s = hctest::rel_rms(states, states_host);
  CHECK(host_o <= 1e-5);
  CHECK(hctest::rel_rms(u, u_host) <= 1e-5);
  CHECK(host_s <= 1e-5);
  CHECK(hctest::rel_rms(ck, ck_host) <= 1e-5);
  MESSAGE("kernels vs the host programs (fp32 path): o " << host_o << ", states " << host_s);
}

}  // namespace

TEST_CASE("emulated chunk_prepare + chunk_scan: packed sequences, checkpoints anywhere, GQA, tails") {
  SUBCASE("GDN, V-major, d 60, chunk 16, fp32") { prefill_case<hc::delta_rule, hc::state_layout::v_major, 60, float>(16, 5e-3, false); }
  SUBCASE("GDN, K-major, d 64, chunk 16, bf16, g = -inf resets") {
    prefill_case<hc::delta_rule, hc::state_layout::k_major, 64, hc::bfloat16_t>(16, 5e-3, true);
  }
  SUBCASE("GDN, K-major, d 64, chunk 16, bf16, the fp32 path (chunk_math::fp32)") {
    prefill_case<hc::delta_rule, hc::state_layout::k_major, 64, hc::bfloat16_t>(16, 5e-3, true, hc::chunk_math::fp32);
  }
  SUBCASE("GDN, V-major, d 64, chunk 17 (a second row tile of one row), fp16, tensor cores") {
    prefill_case<hc::delta_rule, hc::state_layout::v_major, 64, hc::half_t>(17, 5e-3, false);
  }
  SUBCASE("GDN, V-major, d 60 (key tiles past d_k read zeros), chunk 16, bf16, tensor cores") {
    prefill_case<hc::delta_rule, hc::state_layout::v_major, 60, hc::bfloat16_t>(16, 5e-3, false);
  }
  SUBCASE("linear attention, K-major, d 64, chunk 8, bf16, tensor cores, g = -inf resets") {
    prefill_case<hc::linear_rule, hc::state_layout::k_major, 64, hc::bfloat16_t>(8, 1e-3, true);
  }
  SUBCASE("linear attention, V-major, d 64, chunk 8, fp16, g = -inf resets") {
    prefill_case<hc::linear_rule, hc::state_layout::v_major, 64, hc::half_t>(8, 1e-3, true);
  }
}

TEST_CASE("chunk programs: <= 2-way shared-memory bank conflicts for every chunk size; unpadded rows are 32-way") {
  for (int dk : {60, 64, 100, 128, 256})
    for (int eb : {2, 4})
      for (int c = 1; c <= 64; ++c)
        for (int len : {1, c / 2 + 1, c - 1, c}) {
          if (len < 1 || len > c) continue;
          CAPTURE(dk);
          CAPTURE(eb);
          CAPTURE(c);
          CAPTURE(len);
          REQUIRE(hc::detail::chunk_bank_ways(c, len, dk, eb, 2) <= 2);
        }
  CHECK(hc::detail::chunk_bank_ways(64, 64, 128, 4, 128) <= 2);  // every element step
  CHECK(hc::detail::chunk_bank_ways(64, 64, 128, 2, 128) <= 2);
  // The layout before the padding (row stride C = 64 floats, d_k = 128): every lane of a warp
  // reading T[r][j] for 32 rows r hits one bank.
  CHECK(hc::detail::chunk_bank_ways(64, 64, 128, 4, 2, 64, 128) == 32);
}
