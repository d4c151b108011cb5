// The roofline model of bench/roofline.hpp reproduces the anchors' table
// (shared/anchors/linear_attention.md §4: Qwen3-Next, bf16 I/O and gates, H100 3.35 TB/s,
// H200 4.8 TB/s) and tells memory-bound decode from compute-bound prefill.
#include <doctest/doctest.h>

#include "../../bench/roofline.hpp"

namespace rb = hybridcache::bench;

TEST_CASE("roofline: decode times of the anchors' table (recurrent and KVBuffer B = 16)") {
  rb::layer_shape anchor;  // the anchor counts bf16 o, bf16 a/b, bf16 buffered u, fp32 g + beta per buffered token
  anchor.out_bytes = 2;
  anchor.gate_bytes = 4;
  anchor.buffered_value_bytes = 2;
  anchor.buffered_gate_bytes = 8;
  CHECK(rb::token_io_bytes(anchor) == doctest::Approx(24704));
  CHECK(rb::recurrent_decode(anchor, 1).bytes == doctest::Approx(4194304 + 24704));
  const struct {
    int batch;
    double h100_rec, h100_kvb, h200_rec, h200_kvb;
  } table[] = {{64, 80.6, 45.1, 56.3, 31.5}, {128, 161, 90, 113, 63}, {256, 322, 180, 225, 126}, {512, 645, 361, 450, 252}};
  for (const auto& t : table) {
    CAPTURE(t.batch);
    const auto rec = rb::recurrent_decode(anchor, t.batch), kvb = rb::kvbuffer_decode(anchor, t.batch, 16);
    CHECK(rb::memory_bound(rec, rb::h100_sxm));
    CHECK(rb::memory_bound(kvb, rb::h200));
    CHECK(rb::roofline_seconds(rec, rb::h100_sxm) * 1e6 == doctest::Approx(t.h100_rec).epsilon(0.006));
    CHECK(rb::roofline_seconds(kvb, rb::h100_sxm) * 1e6 == doctest::Approx(t.h100_kvb).epsilon(0.006));
    CHECK(rb::roofline_seconds(rec, rb::h200) * 1e6 == doctest::Approx(t.h200_rec).epsilon(0.006));
    CHECK(rb::roofline_seconds(kvb, rb::h200) * 1e6 == doctest::Approx(t.h200_kvb).epsilon(0.006));
  }
  // GVA-aware KVBuffer bytes per sequence and layer (anchor: 2,359,552 B).
  CHECK(rb::kvbuffer_decode(anchor, 1, 16).bytes == doctest::Approx(2359552));
  // Arithmetic intensity of decode ~0.87 FLOP/B: memory-bound by > 15x on both devices.
  const auto w = rb::recurrent_decode(anchor, 64);
  CHECK(w.flops / w.bytes == doctest::Approx(0.87).epsilon(0.05));
}

TEST_CASE("roofline: chunked prefill without tensor cores is FP32-bound; verification saves state writes") {
  const rb::layer_shape s;
  const auto p = rb::chunked_prefill(s, 1, 8192, 64);
  CHECK_FALSE(rb::memory_bound(p, rb::h100_sxm));
  CHECK(p.flops / p.bytes > 20.0);  // past H100's FP32 ridge (66.9 TFLOP/s / 3.35 TB/s = 20 FLOP/B)
  // On tensor cores the same prefill is memory-bound: its products at the dense BF16 peak take
  // less than its bytes at HBM bandwidth. Hand count: per (chunk, head) 2 x 64^2 x 128 + 128 x
  // (6 x 64 x 128 + 2 x 64^2) = 8,388,608 tensor FLOPs, x 4,096 pairs = 34.4 GFLOP -> 34.7 us,
  // and 64^3 / 3 + 128^2 FP32 FLOPs -> 6.4 us; 8192 tokens x 33,024 B + 2 states of 2 MiB =
  // 274.7 MB -> 57.2 us on H200, 82.0 us on H100 SXM.
  const auto tc = rb::chunked_prefill_tensor_cores(s, 1, 8192, 64);
  CHECK(tc.bytes == p.bytes);
  CHECK(tc.bytes == doctest::Approx(8192.0 * 33024 + 2.0 * 4 * 32 * 128 * 128));
  CHECK(tc.tensor_flops == doctest::Approx(4096.0 * 8388608.0));
  CHECK(tc.fp32_flops == doctest::Approx(4096.0 * (64.0 * 64 * 64 / 3 + 128.0 * 128)));
  CHECK(rb::memory_bound(tc, rb::h200));
  CHECK(rb::roofline_seconds(tc, rb::h200) * 1e6 == doctest::Approx(57.2).epsilon(0.01));
  CHECK(rb::roofline_seconds(tc, rb::h100_sxm) * 1e6 == doctest::Approx(82.0).epsilon(0.01));
  CHECK(rb::roofline_seconds(p, rb::h200) / rb::roofline_seconds(tc, rb::h200) > 10.0);
  const auto per_draft = rb::verify_per_draft_states(s, 256, 4), kvb = rb::verify_kvbuffer(s, 256, 8, 4);
  CHECK(per_draft.bytes / kvb.bytes > 4.0);  // the anchor's 4.57x at m = 8 (bf16 u there)
}
