// The timed replay's real-bytes validation mode (sim/tiered_replay_real_bytes.hpp): the
// same replay with a copy engine that moves the bytes (memory tiers as host arenas, a disk
// tier through disk_backend) must make the same decisions, so its hits and loaded bytes
// equal the modelled run's; a wrong byte read from storage fails the copy (a counted
// miss), never reaches a request. The Redis tier's case is in
// tests/backends/test_redis_backend.cpp (it needs a server).
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "hybridcache/prefix/admission.hpp"
#include "hybridcache/prefix/lru_scorer.hpp"
#include "hybridcache/sim/tiered_replay_real_bytes.hpp"
#include "hybridcache/tiered/car_score.hpp"
#include "hybridcache/tiered/disk_backend.hpp"

#include "../support/temp_dir.hpp"
#include "../support/tiny_hybrid_model.hpp"
#include "real_bytes_support.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;
using namespace hybridcache::sim;

TEST_CASE("real bytes: a replay over hbm, host and a disk tier has the modelled run's hits and loaded bytes") {
  const cost_model m(test::tiny_hybrid_spec());
  const auto reqs = test::real_bytes::sessions(12, 8, 7);
  const test::temp_dir dir("hc_real_bytes");
  const auto o = test::real_bytes::options("hbm=1MB,host=400KB,disk@" + dir.str() + "=64MB:gbps=2:lat_us=100");
  const auto modelled = run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{},
                                                                        flop_prefill_time(m));
  REQUIRE(modelled.cascades > 0);  // entries went down to disk
  REQUIRE(modelled.host_hit_tokens > 0);
  CHECK(modelled.real.copies == 0);
  disk_backend<> disk({.directory = dir.str() + "/values", .capacity_bytes = std::int64_t{256} << 20});
  const auto real = run_tiered_replay_real_bytes<prefix::judicious_admission>(
      reqs, m, o, {tiered::storage_io_of(disk)}, prefix::lru_scorer{}, flop_prefill_time(m));
  CHECK(real.hbm_hit_tokens == modelled.hbm_hit_tokens);
  CHECK(real.host_hit_tokens == modelled.host_hit_tokens);
  CHECK(real.bytes_loaded == modelled.bytes_loaded);
  CHECK(real.bytes_offloaded == modelled.bytes_offloaded);
  CHECK(real.ttft_p50_ms == modelled.ttft_p50_ms);
  CHECK(real.real.failed_copies == 0);
  CHECK(real.copy_failures == 0);
  CHECK(real.real.verify_failures == 0);
  CHECK(real.real.storage_puts > 0);
  CHECK(real.real.storage_gets > 0);
  CHECK(real.real.produced_entries > 0);
  CHECK(real.real.bytes >= real.bytes_loaded);
  CHECK(real.real.verified_copies > 0);
}

TEST_CASE("real bytes: a wrong byte read from the disk tier fails that copy (a counted miss), never a load") {
  const cost_model m(test::tiny_hybrid_spec());
  const auto reqs = test::real_bytes::sessions(12, 8, 7);
  const test::temp_dir dir("hc_real_bytes");
  auto o = test::real_bytes::options("hbm=1MB,host=400KB,disk@" + dir.str() + "=64MB:gbps=2:lat_us=100");
  const auto modelled = run_tiered_replay<prefix::judicious_admission>(reqs, m, o, prefix::lru_scorer{},
                                                                        flop_prefill_time(m));
  disk_backend<> disk({.directory = dir.str() + "/values", .capacity_bytes = std::int64_t{256} << 20});
  std::int64_t flipped = 0;
  sim::real_bytes_engine_options flip;
  flip.read_hook = [&](std::span<std::byte> v) {  // after the backend's own check
    v[v.size() / 2] ^= std::byte{0x10};
    ++flipped;
  };
  const auto real = run_tiered_replay_real_bytes<prefix::judicious_admission>(
      reqs, m, o, {tiered::storage_io_of(disk)}, prefix::lru_scorer{}, flop_prefill_time(m), {}, std::move(flip));
  REQUIRE(flipped > 0);
  CHECK(real.real.verify_failures == flipped);
  CHECK(real.real.failed_copies == flipped);
  // The store saw each as a failed copy, as it sees an injected fault: the copy is dropped,
  // never adopted (the replay counted the hit when the request began, as it does for an
  // injected fault, so the hit counters stay those of the modelled run).
  CHECK(modelled.copy_failures == 0);
  CHECK(real.copy_failures == flipped);
  // Bad input: sparsification cannot be checked; a storage tier needs its backend.
  o.sparsify = sparsify_kind::profile;
  CHECK_THROWS_AS((void)run_tiered_replay_real_bytes<prefix::judicious_admission>(
                      reqs, m, o, {tiered::storage_io_of(disk)}, prefix::lru_scorer{}, flop_prefill_time(m)),
                  invalid_argument);
  o.sparsify = sparsify_kind::off;
  CHECK_THROWS_AS((void)run_tiered_replay_real_bytes<prefix::judicious_admission>(reqs, m, o, {}, prefix::lru_scorer{},
                                                                                  flop_prefill_time(m)),
                  invalid_argument);
}

TEST_CASE("real bytes: demotion car (CaR's score, mirrored below HBM) has the modelled run's hits and loaded bytes") {
  const cost_model m(test::tiny_hybrid_spec());
  const auto reqs = test::real_bytes::sessions(12, 8, 7);
  const test::temp_dir dir("hc_real_bytes");
  auto o = test::real_bytes::options("hbm=1MB,host=400KB,disk@" + dir.str() + "=64MB:gbps=2:lat_us=100");
  o.demotion = demotion_kind::car;
  car_score_board modelled_board, real_board;
  const auto modelled = run_tiered_replay<prefix::judicious_admission>(reqs, m, o, car_scorer(modelled_board),
                                                                        flop_prefill_time(m));
  REQUIRE(modelled.cascades > 0);
  REQUIRE(modelled.host_hit_tokens > 0);
  disk_backend<> disk({.directory = dir.str() + "/values", .capacity_bytes = std::int64_t{256} << 20});
  const auto real = run_tiered_replay_real_bytes<prefix::judicious_admission>(
      reqs, m, o, {tiered::storage_io_of(disk)}, car_scorer(real_board), flop_prefill_time(m));
  CHECK(real.hbm_hit_tokens == modelled.hbm_hit_tokens);
  CHECK(real.host_hit_tokens == modelled.host_hit_tokens);
  CHECK(real.bytes_loaded == modelled.bytes_loaded);
  CHECK(real.bytes_offloaded == modelled.bytes_offloaded);
  CHECK(real.ttft_p50_ms == modelled.ttft_p50_ms);
  CHECK(real.real.failed_copies == 0);
  CHECK(real.real.verify_failures == 0);
  CHECK(real.real.storage_gets > 0);
  CHECK(real.real.verified_copies > 0);
  CHECK(real_board.requests_in_flight() == 0);
}
