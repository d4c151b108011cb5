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
  const auto per_draft = rb::verify_per_draft_states(s, 256, 4), kvb = rb::verify_kvbuffer(s, 256, 8, 4);
  CHECK(per_draft.bytes / kvb.bytes > 4.0);  // the anchor's 4.57x at m = 8 (bf16 u there)
}
