// Scheduler (priority groups, shuffled window, dry run), prefetch rules, layer-wise
// pipeline timeline and event ring, quality-aware sparsification.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "hybridcache/model/presets.hpp"
#include "hybridcache/tiered/layer_pipeline.hpp"
#include "hybridcache/tiered/prefetch.hpp"
#include "hybridcache/tiered/scheduler.hpp"
#include "hybridcache/tiered/sparsify.hpp"

using namespace hybridcache;
using namespace hybridcache::tiered;

TEST_CASE("classify: CaR's three groups") {
  CHECK(classify(512, 0) == request_group::reuse_in_hbm);
  CHECK(classify(512, 4096) == request_group::reuse_in_hbm);
  CHECK(classify(0, 0) == request_group::no_history);
  CHECK(classify(0, 1) == request_group::reuse_from_lower);
}

TEST_CASE("car queue: groups order the backlog, the window is shuffled deterministically") {
  auto run = [](std::uint64_t seed) {
    car_request_queue q({.window = 4, .seed = seed, .max_bypass = 1000});
    const request_group g[] = {request_group::reuse_from_lower, request_group::no_history, request_group::reuse_in_hbm,
                               request_group::reuse_from_lower, request_group::reuse_in_hbm, request_group::no_history};
    for (std::uint64_t i = 0; i < 6; ++i) REQUIRE(q.push(i, g[i]).has_value());
    CHECK(q.push(3, request_group::no_history).error() == errc::invalid_argument);
    std::vector<std::uint64_t> order;
    const auto entered = q.refill();
    CHECK(std::set<std::uint64_t>(entered.begin(), entered.end()) == std::set<std::uint64_t>{2, 4, 1, 5});
    while (auto id = q.pop()) order.push_back(*id);
    return order;
  };
  const auto a = run(1), b = run(1), c = run(99);
  CHECK(a == b);  // deterministic
  REQUIRE(a.size() == 6);
  // The first window holds the two HBM-reuse and the two no-history requests, in some
  // shuffled order; the lower-tier-only requests come last.
  CHECK(std::set<std::uint64_t>(a.begin(), a.begin() + 4) == std::set<std::uint64_t>{1, 2, 4, 5});
  CHECK(std::set<std::uint64_t>(a.begin() + 4, a.end()) == std::set<std::uint64_t>{0, 3});
  bool differs = false;
  for (std::uint64_t s = 2; s < 40 && !differs; ++s) differs = run(s) != a;
  CHECK(differs);  // the window really is shuffled
  (void)c;
}

TEST_CASE("car queue: nothing starves under a stream of higher-priority arrivals") {
  car_request_queue q({.window = 4, .seed = 3, .max_bypass = 16});
  REQUIRE(q.push(0, request_group::reuse_from_lower).has_value());
  std::uint64_t next = 1;
  int pops = 0;
  bool served = false;
  while (!served && pops < 1000) {
    for (int k = 0; k < 3; ++k) REQUIRE(q.push(next++, request_group::reuse_in_hbm).has_value());
    const auto id = q.pop();
    REQUIRE(id);
    served = *id == 0;
    ++pops;
  }
  CHECK(served);
  CHECK(pops <= 16 + 2 * 4);  // bypass limit + the window it waits behind + its own window
  // Without the anti-starvation rule it would wait forever: with max_bypass huge it is
  // not served within the same horizon.
  car_request_queue greedy({.window = 4, .seed = 3, .max_bypass = 1'000'000});
  REQUIRE(greedy.push(0, request_group::reuse_from_lower).has_value());
  for (next = 1; next <= 8; ++next) REQUIRE(greedy.push(next, request_group::reuse_in_hbm).has_value());
  served = false;
  for (int p = 0; p < 200 && !served; ++p) {
    for (int k = 0; k < 3; ++k) REQUIRE(greedy.push(next++, request_group::reuse_in_hbm).has_value());
    served = *greedy.pop() == 0;
  }
  CHECK_FALSE(served);
  CHECK_THROWS_AS(car_request_queue({.window = 0}), invalid_argument);
}

TEST_CASE("car queue: regroup moves backlog requests; window members keep their place") {
  car_request_queue q({.window = 1, .seed = 1, .max_bypass = 100});
  REQUIRE(q.push(10, request_group::no_history).has_value());
  REQUIRE(q.push(11, request_group::reuse_from_lower).has_value());
  REQUIRE(q.push(12, request_group::reuse_from_lower).has_value());
  REQUIRE(q.regroup(12, request_group::reuse_in_hbm).has_value());  // its prefetch landed
  CHECK(*q.pop() == 12);
  CHECK(*q.pop() == 10);
  CHECK(q.regroup(10, request_group::reuse_in_hbm).error() == errc::not_found);
  CHECK(q.size() == 1);
  CHECK(*q.pop() == 11);
  CHECK(q.empty());
  CHECK_FALSE(q.pop());
}

TEST_CASE("dry run: fits now / after eviction / not now / never, without changing state") {
  const std::int64_t pg = 1024;
  tiered_store<> s({{.kind = tier_kind::hbm, .capacity_bytes = 8 * pg}, {.kind = tier_kind::host, .capacity_bytes = 16 * pg}}, pg);
  REQUIRE(s.insert(entry_id{1}, 2 * pg).has_value());          // HBM, evictable
  REQUIRE(s.insert(entry_id{2}, 2 * pg).has_value());          // HBM, will be pinned
  REQUIRE(s.insert(entry_id{3}, 3 * pg, tier_id{1}).has_value());  // host hit
  REQUIRE(s.pin(entry_id{2}).has_value());
  const entry_id none[] = {no_entry};
  const entry_id hits[] = {entry_id{2}, entry_id{3}};
  CHECK(dry_run(s, 4 * pg, std::span<const entry_id>(none, 0)) == fit_result::fits_now);
  CHECK(dry_run(s, 5 * pg, std::span<const entry_id>(none, 0)) == fit_result::fits_after_eviction);
  CHECK(dry_run(s, 1 * pg, hits) == fit_result::fits_now);              // 1 + 3 promoted = 4 free
  CHECK(dry_run(s, 3 * pg, hits) == fit_result::fits_after_eviction);   // 6 <= 4 free + 2 evictable
  CHECK(dry_run(s, 4 * pg, std::span<const entry_id>(hits, 1)) == fit_result::fits_now);
  CHECK(dry_run(s, 7 * pg, std::span<const entry_id>(none, 0)) == fit_result::does_not_fit_now);  // 2 is pinned
  CHECK(dry_run(s, 7 * pg, hits) == fit_result::never_fits);            // 7+3 > 8-2
  CHECK_THROWS_AS(require_fits(s, 9 * pg, std::span<const entry_id>(none, 0)), capacity_error);
  CHECK_NOTHROW(require_fits(s, 5 * pg, std::span<const entry_id>(none, 0)));
  CHECK_THROWS_AS((void)dry_run(s, -1, std::span<const entry_id>(none, 0)), invalid_argument);
  {  // a hit already being promoted holds its HBM pages as a reservation: not counted twice
    tiered_store<> t({{.kind = tier_kind::hbm, .capacity_bytes = 10 * pg}, {.kind = tier_kind::host, .capacity_bytes = 16 * pg}}, pg);
    REQUIRE(t.insert(entry_id{7}, 6 * pg, tier_id{1}));
    const entry_id hit[] = {entry_id{7}};
    CHECK(dry_run(t, 4 * pg, hit) == fit_result::fits_now);
    auto mv = t.prepare_move(entry_id{7}, hbm_tier);  // 6 of the 10 HBM pages reserved
    REQUIRE(mv);
    CHECK(dry_run(t, 4 * pg, hit) == fit_result::fits_now);
    CHECK(dry_run(t, 5 * pg, hit) == fit_result::does_not_fit_now);
    REQUIRE(t.complete_move(*mv, true));
    CHECK(dry_run(t, 4 * pg, hit) == fit_result::fits_now);
  }
  CHECK(s.usage(hbm_tier).used_bytes == 4 * pg);
  CHECK(s.find(entry_id{3})->tier() == tier_id{1});
  CHECK(s.find(entry_id{2})->copies.front().pins == 1);
  CHECK(s.check_invariants().empty());
}

TEST_CASE("prefetch room: the load and the request's reservation at or below the high watermark") {
  // 100 GB of HBM, 90 % watermark: 60 in use leaves 30 below the mark.
  static_assert(prefetch_has_room(60, 20, 10, 100, 0.9));
  static_assert(!prefetch_has_room(60, 21, 10, 100, 0.9));
  static_assert(!prefetch_has_room(60, 20, 11, 100, 0.9));  // the reservation counts
  static_assert(prefetch_has_room(60, 30, 10, 100, 1.0));   // no cleaner: the capacity
  static_assert(!prefetch_has_room(95, 1, 0, 100, 0.9));    // already above the mark
  CHECK(prefetch_has_room(0, 0, 0, 100, 0.9));
}

TEST_CASE("deadline prefetch: CaR's formula, pinned arithmetic") {
  const running_request run[] = {{.timer_ms = 100.0, .predicted_tokens = 50.0}, {.timer_ms = 0.0, .predicted_tokens = 200.0}};
  prefetch_context c{.now_ms = 120.0, .tpot_ms = 2.0, .running = run, .bytes = 50e6, .bandwidth_bytes_per_ms = 1e6};
  // remaining: 2*50 - 20 = 80 ms; 2*200 - 120 = 280 ms -> min 80; transfer 50 ms.
  CHECK(deadline_prefetch::min_remaining_ms(c) == doctest::Approx(80.0));
  CHECK(deadline_prefetch::transfer_ms(c) == doctest::Approx(50.0));
  CHECK_FALSE(deadline_prefetch{}.should_fetch(c));
  CHECK(deadline_prefetch::fire_time(c) == doctest::Approx(150.0));  // 200 - 50
  c.latency_ms = 30.0;  // a slow source's fixed time adds to the transfer: fire 30 ms earlier
  CHECK(deadline_prefetch::transfer_ms(c) == doctest::Approx(80.0));
  CHECK(deadline_prefetch::fire_time(c) == doctest::Approx(120.0));
  c.latency_ms = 0.0;
  c.now_ms = 150.0;
  CHECK(deadline_prefetch{}.should_fetch(c));
  c.now_ms = 149.9;
  CHECK_FALSE(deadline_prefetch{}.should_fetch(c));
  c.running = {};
  CHECK(deadline_prefetch{}.should_fetch(c));  // idle GPU
  CHECK(deadline_prefetch::fire_time(c) == 149.9);
  // Threshold rule.
  c.lower_hit_tokens = 255;
  CHECK_FALSE(threshold_prefetch{}.should_fetch(c));
  c.lower_hit_tokens = 256;
  CHECK(threshold_prefetch{}.should_fetch(c));
  CHECK_FALSE(no_prefetch{}.should_fetch(c));
  // Running-mean predictor.
  running_mean_predictor p{.prior = 100.0};
  CHECK(p.predict(10) == 100.0);
  p.observe(10, 30);
  p.observe(10, 50);
  CHECK(p.predict(1000) == 40.0);
}

TEST_CASE("pipeline timeline: layer l waits only for layer l's data") {
  const std::vector<double> load(4, 1.0), compute(4, 2.0);
  const auto p = pipeline_timeline(load, compute);
  // load ends 1,2,3,4; compute: [1,3],[3,5],[5,7],[7,9]
  CHECK(p.finish_ms == doctest::Approx(9.0));
  CHECK(p.exposed_load_ms == doctest::Approx(1.0));
  CHECK(p.hidden_fraction() == doctest::Approx(0.75));
  const auto s = pipeline_timeline(load, compute, 0.0, 0.0, false);
  CHECK(s.finish_ms == doctest::Approx(12.0));
  CHECK(s.hidden_fraction() == doctest::Approx(0.0));
  // Load slower than compute: the loads dominate.
  const std::vector<double> slow(4, 3.0), fast(4, 1.0);
  CHECK(pipeline_timeline(slow, fast).finish_ms == doctest::Approx(13.0));
  // A prefetch that started 10 ms earlier hides everything.
  CHECK(pipeline_timeline(slow, fast, 10.0, 0.0).exposed_load_ms == doctest::Approx(0.0));
  CHECK_THROWS_AS((void)pipeline_timeline(load, std::span<const double>(fast).subspan(0, 2)), invalid_argument);
  // Reference check on random inputs: an explicit event simulation.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.0, 3.0);
  for (int t = 0; t < 200; ++t) {
    const int n = 1 + static_cast<int>(rng() % 12);
    std::vector<double> L(n), C(n);
    for (int i = 0; i < n; ++i) L[i] = u(rng), C[i] = u(rng);
    const double ls = u(rng), cs = u(rng);
    double t_load = ls, t_comp = cs;
    for (int i = 0; i < n; ++i) {
      t_load += L[i];
      t_comp = std::max(t_comp, t_load) + C[i];
    }
    CHECK(pipeline_timeline(L, C, cs, ls).finish_ms == doctest::Approx(t_comp));
  }
}

TEST_CASE("layer event ring: per-layer waits, no early reuse of a set") {
  layer_event_ring ring(8, 2);
  auto a = ring.begin();
  REQUIRE(a.has_value());
  auto b = ring.begin();
  REQUIRE(b.has_value());
  CHECK(ring.begin().error() == errc::busy);  // both sets in use
  std::vector<int> order;
  std::mutex mu;
  std::thread loader([&] {
    for (int l = 0; l < 8; ++l) {
      {
        std::lock_guard lock(mu);
        order.push_back(100 + l);  // "copy" of layer l done
      }
      REQUIRE(ring.record(*a, l).has_value());
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  for (int l = 0; l < 8; ++l) {
    REQUIRE(ring.wait(*a, l).has_value());
    std::lock_guard lock(mu);
    CHECK(std::count(order.begin(), order.end(), 100 + l) == 1);  // its data is there
    order.push_back(l);
  }
  loader.join();
  // Consumer of layer l always ran after load of layer l.
  for (int l = 0; l < 8; ++l) {
    const auto pl = std::find(order.begin(), order.end(), 100 + l), pc = std::find(order.begin(), order.end(), l);
    CHECK(pl < pc);
  }
  CHECK(ring.end(*b).error() == errc::busy);  // b never loaded: cannot be reused early
  REQUIRE(ring.end(*a).has_value());
  auto c = ring.begin();
  REQUIRE(c.has_value());
  CHECK(*c == *a);
  CHECK(ring.record(*c, 8).error() == errc::invalid_argument);
  CHECK_THROWS_AS(layer_event_ring(0), invalid_argument);
}

namespace {
// fp64 synthetic attention: queries share a bias direction so some keys are attended by
// every query (heavy hitters); `temperature` sharpens deeper layers.
struct synthetic_layer {
  int T, d;
  std::vector<double> q, k, v;  // [T][d]
  double temperature;
  synthetic_layer(int T_, int d_, double temp, std::mt19937_64& rng) : T(T_), d(d_), temperature(temp) {
    std::normal_distribution<double> n(0.0, 1.0);
    std::vector<double> bias(static_cast<std::size_t>(d));
    for (auto& x : bias) x = n(rng);
    q.resize(static_cast<std::size_t>(T * d));
    k.resize(q.size());
    v.resize(q.size());
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < d; ++j) {
        q[static_cast<std::size_t>(t * d + j)] = bias[static_cast<std::size_t>(j)] + 0.5 * n(rng);
        k[static_cast<std::size_t>(t * d + j)] = n(rng);
        v[static_cast<std::size_t>(t * d + j)] = n(rng);
      }
  }
  // Softmax attention weights of query `qi` over keys [0, upto) restricted to `keep`.
  std::vector<double> weights(const double* qv, int upto, const std::vector<std::int32_t>* keep) const {
    std::vector<double> w(static_cast<std::size_t>(upto), 0.0);
    double mx = -1e300;
    auto score = [&](int t) {
      double s = 0;
      for (int j = 0; j < d; ++j) s += qv[j] * k[static_cast<std::size_t>(t * d + j)];
      return temperature * s / std::sqrt(static_cast<double>(d));
    };
    auto visit = [&](auto f) {
      if (keep) {
        for (auto t : *keep)
          if (t < upto) f(t);
      } else {
        for (int t = 0; t < upto; ++t) f(t);
      }
    };
    visit([&](int t) { mx = std::max(mx, w[static_cast<std::size_t>(t)] = score(t)); });
    double z = 0;
    std::vector<char> on(static_cast<std::size_t>(upto), 0);
    visit([&](int t) { on[static_cast<std::size_t>(t)] = 1; });
    for (int t = 0; t < upto; ++t) {
      w[static_cast<std::size_t>(t)] = on[static_cast<std::size_t>(t)] ? std::exp(w[static_cast<std::size_t>(t)] - mx) : 0.0;
      z += w[static_cast<std::size_t>(t)];
    }
    for (auto& x : w) x /= z;
    return w;
  }
  std::vector<double> output(const double* qv, int upto, const std::vector<std::int32_t>* keep) const {
    const auto w = weights(qv, upto, keep);
    std::vector<double> o(static_cast<std::size_t>(d), 0.0);
    for (int t = 0; t < upto; ++t)
      for (int j = 0; j < d; ++j) o[static_cast<std::size_t>(j)] += w[static_cast<std::size_t>(t)] * v[static_cast<std::size_t>(t * d + j)];
    return o;
  }
};
}  // namespace

TEST_CASE("sparsification: profile, H2O selection, bytes saved, output error (fp64 synthetic attention)") {
  // Profile arithmetic.
  const auto p = sparsity_profile::car_linear(4);
  CHECK(p.sparsity.front() == doctest::Approx(0.60));
  CHECK(p.sparsity.back() == doctest::Approx(0.95));
  CHECK(p.mean_keep() == doctest::Approx(1.0 - 0.775));
  CHECK(kept_tokens(p, 0, 1000) == 400);
  CHECK(kept_tokens(p, 3, 1000) == 50);
  CHECK(kept_tokens(p, 3, 100) == 32);  // the recent window is a floor
  CHECK(kept_tokens(p, 3, 10) == 10);
  CHECK_THROWS_AS((void)sparsity_profile::car_linear(0), invalid_argument);
  CHECK_THROWS_AS((void)sparsity_profile::from_measurements({0.5, 1.0}), invalid_argument);
  const double row[] = {1.0, 0.5, 0.009, 0.0, 0.011};
  CHECK(measure_row_sparsity(row) == doctest::Approx(0.4));

  // Selection: heavy hitters + recent window, ascending.
  const double acc[] = {5, 1, 9, 0, 7, 3, 2, 8};
  CHECK(select_tokens(acc, 4, 2) == std::vector<std::int32_t>{2, 4, 6, 7});
  CHECK(select_tokens(acc, 100, 2).size() == 8);
  CHECK(select_tokens(acc, 2, 5) == std::vector<std::int32_t>{6, 7});

  // Bytes: only attention KV shrinks, never the recurrent checkpoint.
  const cost_model jamba(presets::jamba_1_5_mini());
  const auto jp = sparsity_profile::car_linear(jamba.attention_layers());
  const std::int64_t T = 4096;
  const std::int64_t full = jamba.kv_bytes(T) + jamba.ssm_checkpoint_bytes();
  const std::int64_t sparse = sparsified_node_bytes(jamba, jp, T, true);
  CHECK(sparse - jamba.ssm_checkpoint_bytes() == sparsified_kv_bytes(jamba, jp, T));
  CHECK(sparsified_kv_bytes(jamba, jp, T) < jamba.kv_bytes(T) / 3);
  CHECK_THROWS_AS((void)sparsified_kv_bytes(jamba, sparsity_profile::car_linear(3), T), invalid_argument);
  MESSAGE("jamba_1_5_mini, 4096-token node: " << full << " B -> " << sparse << " B (KV "
                                               << jamba.kv_bytes(T) << " -> " << sparsified_kv_bytes(jamba, jp, T) << ")");

  // Synthetic model: 4 layers with rising temperature; measure the profile, keep tokens by
  // accumulated attention over the first T queries, then compare the next queries' outputs.
  const int Tn = 384, d = 32, future = 32;
  const double temps[] = {2.0, 3.0, 4.0, 6.0};
  std::vector<double> measured;
  std::mt19937_64 rng(7);
  for (int l = 0; l < 4; ++l) {
    std::mt19937_64 layer_rng(2024);  // same q/k/v in every layer; only the sharpness differs
    synthetic_layer L(Tn + future, d, temps[l], layer_rng);
    double sp = 0;
    std::vector<double> accum(static_cast<std::size_t>(Tn), 0.0);
    for (int qi = 0; qi < Tn; ++qi) {
      const auto w = L.weights(&L.q[static_cast<std::size_t>(qi * d)], qi + 1, nullptr);
      sp += measure_row_sparsity(w);
      for (int t = 0; t <= qi; ++t) accum[static_cast<std::size_t>(t)] += w[static_cast<std::size_t>(t)];
    }
    measured.push_back(sp / Tn);
    const double keep_ratio = 1.0 - measured.back();
    const auto keep = static_cast<std::int64_t>(std::ceil(keep_ratio * Tn));
    const auto h2o = select_tokens(accum, keep, 16);
    // Random selection with the same budget and recent window, for comparison.
    std::vector<std::int32_t> others(Tn - 16);
    std::iota(others.begin(), others.end(), 0);
    std::shuffle(others.begin(), others.end(), rng);
    std::vector<std::int32_t> rnd(others.begin(), others.begin() + (keep - 16));
    for (int t = Tn - 16; t < Tn; ++t) rnd.push_back(t);
    double err_h2o = 0, err_rnd = 0, norm = 0;
    for (int f = 0; f < future; ++f) {
      const double* qv = &L.q[static_cast<std::size_t>((Tn + f) * d)];
      const auto ref = L.output(qv, Tn, nullptr), a = L.output(qv, Tn, &h2o), b = L.output(qv, Tn, &rnd);
      for (int j = 0; j < d; ++j) {
        err_h2o += std::pow(a[j] - ref[j], 2);
        err_rnd += std::pow(b[j] - ref[j], 2);
        norm += ref[j] * ref[j];
      }
    }
    const double rel_h2o = std::sqrt(err_h2o / norm), rel_rnd = std::sqrt(err_rnd / norm);
    MESSAGE("layer " << l << ": sparsity " << measured.back() << ", keep " << keep << "/" << Tn << ", rel. output error H2O "
                     << rel_h2o << " vs random " << rel_rnd);
    CHECK(rel_h2o < 0.7 * rel_rnd);
  }
  // Sparsity rises with depth, as in CaR's Fig. 4.
  for (int l = 1; l < 4; ++l) CHECK(measured[l] > measured[l - 1]);
  const auto prof = sparsity_profile::from_measurements(measured);
  CHECK(prof.mean_keep() < 0.4);
  CHECK(measured.front() > 0.4);
  CHECK(measured.back() > 0.85);
}

TEST_CASE("car queue: only younger requests count as overtaking, so a deep backlog still follows the groups") {
  // A and B wait in the lowest group; C and D (best group) arrive later. B was overtaken by
  // C only once when D arrives, so D goes first; after E, B has been overtaken twice.
  car_request_queue q({.window = 1, .seed = 1, .max_bypass = 2});
  REQUIRE(q.push(1, request_group::reuse_from_lower));  // A
  REQUIRE(q.push(2, request_group::reuse_from_lower));  // B
  CHECK(*q.pop() == 1);
  REQUIRE(q.push(3, request_group::reuse_in_hbm));  // C
  CHECK(*q.pop() == 3);
  REQUIRE(q.push(4, request_group::reuse_in_hbm));  // D
  CHECK(*q.pop() == 4);
  REQUIRE(q.push(5, request_group::reuse_in_hbm));  // E
  CHECK(*q.pop() == 2);  // overtaken by C and D: max_bypass reached
  CHECK(*q.pop() == 5);

  // A backlog of 150 with one arrival per dispatch and random groups: the best group waits
  // far less than FCFS would make it (150 dispatches), and every request is served within
  // the bound (its older requests + max_bypass + two windows).
  car_request_queue deep({.window = 8, .seed = 1, .max_bypass = 64});
  std::mt19937 g(7);
  std::vector<std::pair<int, int>> info;  // id -> (group, push time)
  auto push = [&](int t) {
    const int gr = static_cast<int>(g() % 3);
    REQUIRE(deep.push(info.size(), static_cast<request_group>(gr)));
    info.emplace_back(gr, t);
  };
  for (int i = 0; i < 150; ++i) push(0);
  std::array<double, 3> wait{}, n{};
  int worst = 0;
  for (int t = 1; t <= 6000; ++t) {
    push(t);
    const auto id = deep.pop();
    REQUIRE(id);
    const auto [gr, at] = info[*id];
    worst = std::max(worst, t - at);
    if (t > 1000) {
      wait[static_cast<std::size_t>(gr)] += t - at;
      n[static_cast<std::size_t>(gr)] += 1;
    }
  }
  const double w0 = wait[0] / n[0], w1 = wait[1] / n[1], w2 = wait[2] / n[2];
  MESSAGE("mean wait in dispatches: reuse_in_hbm " << w0 << ", no_history " << w1 << ", reuse_from_lower " << w2
                                                   << "; worst " << worst);
  CHECK(w0 < 0.3 * 150);
  CHECK(w0 < w1);
  CHECK(w0 < w2);
  CHECK(worst <= 151 + 64 + 2 * 8);
}
