// FLOP formulas at L = 1, 1000, 32768 against values computed by hand, the marginal
// (saved) form, efficiencies, and the prefill-time models.
#include <doctest/doctest.h>

#include <cmath>
#include <utility>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/model/prefill_time.hpp>
#include <hybridcache/model/presets.hpp>

using namespace hybridcache;

// D = 4096, N = 128:
//   F_a(L) = 8·L·D² + 4·L²·D;  8·D² = 134,217,728; 4·D = 16,384
//   F_r(L) = L·(12·D² + 16·D·N + 10·D) = L·(201,326,592 + 8,388,608 + 40,960) = L·209,756,160
//   F_m(L) = 16·L·D² = L·268,435,456
TEST_CASE("per-layer FLOPs of marconi_7b at L = 1, 1000, 32768") {
  const cost_model m(presets::marconi_7b());
  CHECK(m.attention_flops(1) == 134'217'728 + 16'384);
  CHECK(m.attention_flops(1000) == 134'217'728'000 + 16'384'000'000);
  CHECK(m.attention_flops(32768) == 4'398'046'511'104 + 17'592'186'044'416);
  CHECK(m.recurrent_flops(1) == 209'756'160);
  CHECK(m.recurrent_flops(1000) == 209'756'160'000);
  CHECK(m.recurrent_flops(32768) == 6'873'289'850'880);
  CHECK(m.mlp_flops(1) == 268'435'456);
  CHECK(m.mlp_flops(1000) == 268'435'456'000);
  CHECK(m.mlp_flops(32768) == 8'796'093'022'208);
  // whole model: 4 attention + 24 recurrent + 28 MLP
  CHECK(m.prefill_flops(1) == 13'087'277'056);
  CHECK(m.prefill_flops(1000) == 13'152'747'520'000);
  CHECK(m.prefill_flops(32768) == 499'210'491'265'024);
  CHECK(m.hit_flops(1000) == m.prefill_flops(1000));
}

// D = 2048, N = 128: 8·D² = 33,554,432; 4·D = 8,192; F_r per token = 54,546,432; F_m = 67,108,864·L
TEST_CASE("FLOPs of qwen3_next_80b_a3b at L = 1, 1000, 32768") {
  const cost_model m(presets::qwen3_next_80b_a3b());
  CHECK(m.attention_flops(1) == 33'562'624);
  CHECK(m.attention_flops(1000) == 41'746'432'000);
  CHECK(m.attention_flops(32768) == 9'895'604'649'984);
  CHECK(m.recurrent_flops(1000) == 54'546'432'000);
  CHECK(m.mlp_flops(32768) == 2'199'023'255'552);
  CHECK(m.prefill_flops(1) == 5'587'648'512);
  CHECK(m.prefill_flops(1000) == 5'685'854'208'000);
  CHECK(m.prefill_flops(32768) == 288'645'961'482'240);
}

TEST_CASE("saved FLOPs are the marginal cost of a node's own tokens") {
  const cost_model m(presets::marconi_7b());
  // A node spanning (1000, 32768]: attention pays F_a(L) - F_a(p); recurrent and MLP are
  // linear in the 31,768 own tokens. The MLP term subtracts MLP FLOPs, not attention's.
  const std::int64_t own = 32768 - 1000;
  const std::int64_t expected = 4 * (m.attention_flops(32768) - m.attention_flops(1000)) +
                                24 * m.recurrent_flops(own) + 28 * m.mlp_flops(own);
  CHECK(m.saved_flops(1000, 32768) == expected);
  CHECK(m.saved_flops(0, 1000) == m.prefill_flops(1000));
  // saved(p, L) + prefill(p) == prefill(L): reusing the whole path saves everything.
  CHECK(m.saved_flops(1000, 32768) + m.prefill_flops(1000) == m.prefill_flops(32768));
  CHECK(m.saved_flops(500, 500) == 0);
}

TEST_CASE("FLOP efficiency uses the node's own bytes") {
  const cost_model m(presets::marconi_7b());
  const double eff_prefix = m.flop_efficiency(1000);
  CHECK(eff_prefix == doctest::Approx(13'152'747'520'000.0 / (26'787'840.0 + 1000.0 * 65'536.0)));
  const double eff_node = m.node_flop_efficiency(1000, 1100);
  CHECK(eff_node == doctest::Approx(static_cast<double>(m.saved_flops(1000, 1100)) /
                                    (26'787'840.0 + 100.0 * 65'536.0)));
  const double eff_kv_only = m.node_flop_efficiency(1000, 1100, /*has_checkpoint=*/false);
  CHECK(eff_kv_only > eff_node);
  // Attention's quadratic term makes long contexts more valuable per byte.
  CHECK(m.flop_efficiency(32768) > m.flop_efficiency(8192));
  CHECK(m.flop_efficiency(8192) > m.flop_efficiency(1024));
}

TEST_CASE("overflow is reported, not wrapped") {
  const cost_model m(presets::marconi_7b());
  CHECK_THROWS_AS((void)m.prefill_flops(std::int64_t{1} << 40), overflow_error);
  CHECK_THROWS_AS((void)m.kv_bytes(std::int64_t{1} << 50), overflow_error);
}

TEST_CASE("prefill-time models") {
  const marconi_reference_ttft ref;
  // 10 · (1.781358 + 0.00529644 · 16,050) at 16,000 tokens
  CHECK(ref.prefill_ms(16000) == doctest::Approx(10.0 * (1.781358 + 0.00529644 * 16050.0)));
  CHECK(ref.prefill_ms(16000) == doctest::Approx(867.9).epsilon(0.001));
  CHECK(ref.prefill_ms(0) == doctest::Approx(10.0 * (1.781358 + 0.00529644 * 50.0)));
  CHECK(ref.prefill_ms(49) == ref.prefill_ms(0));
  CHECK(ref.prefill_ms(100000) == ref.prefill_ms(31950));
  const linear_prefill_time lin;
  CHECK(lin.prefill_ms(0) == 0.0);
  CHECK(lin.prefill_ms(1000) == doctest::Approx(17.81358 + 52.9644));
}

TEST_CASE("flop_prefill_time: the cost model's FLOPs over a throughput fitted to the Jamba line") {
  const cost_model jamba(presets::jamba_1_5_mini());
  const flop_prefill_time f(jamba);
  const linear_prefill_time line{};
  // The default throughput is the least-squares fit of Jamba's FLOPs to the 4xA100 line over
  // its profiled lengths; recompute it here from the cost model.
  long double ff = 0, fy = 0;
  for (std::int64_t L = 50; L <= 31950; L += 50) {
    const auto F = static_cast<long double>(jamba.prefill_flops(L));
    ff += F * F;
    fy += F * static_cast<long double>(line.per_token_ms * static_cast<double>(L));
  }
  CHECK(static_cast<double>(ff / fy) / 1e9 == doctest::Approx(flop_prefill_time::jamba_4xa100_tflops).epsilon(1e-6));
  for (std::int64_t L = 512; L <= 31950; L += 512) {
    CAPTURE(L);
    CHECK(std::abs(f.prefill_ms(L) / line.prefill_ms(L) - 1.0) < 0.10);
  }
  CHECK(f.prefill_ms(0) == 0.0);
  CHECK(f.prefill_ms(1000, 0) == 0.0);
  CHECK(f.prefill_ms(5) == f.prefill_ms(0, 5));

  // By hand for llama2_7b (32 attention + 32 MLP layers, D = 4096): new tokens n after a
  // cached prefix p cost 32·(8nD² + 4((p+n)² − p²)D + 16nD²) FLOPs.
  const cost_model llama(presets::llama2_7b());
  const flop_prefill_time g(llama, 100.0, 5.0);  // 100 TFLOP/s, 5 ms fixed
  const double D = 4096;
  for (const auto& [p, n] : {std::pair<double, double>{0, 1000}, {8000, 300}, {30000, 2048}}) {
    const double flops = 32 * (8 * n * D * D + 4 * ((p + n) * (p + n) - p * p) * D + 16 * n * D * D);
    CHECK(g.prefill_ms(static_cast<std::int64_t>(p), static_cast<std::int64_t>(n)) ==
          doctest::Approx(5.0 + flops / 1e11).epsilon(1e-12));
  }
  // A cached prefix makes new tokens dearer for attention, not for a pure recurrent model.
  CHECK(g.prefill_ms(20000, 512) > g.prefill_ms(0, 512));
  const flop_prefill_time ssm{cost_model(presets::mamba2_1b3_pure())};
  CHECK(ssm.prefill_ms(20000, 512) == ssm.prefill_ms(0, 512));
  CHECK(prefill_ms_after(line, 20000, 512) == line.prefill_ms(512));  // not prefix-aware: ignored
  CHECK(prefill_ms_after(g, 20000, 512) == g.prefill_ms(20000, 512));
  CHECK_THROWS_AS(flop_prefill_time(llama, 0.0), invalid_argument);
  CHECK_THROWS_AS(flop_prefill_time(llama, 100.0, -1.0), invalid_argument);
}
