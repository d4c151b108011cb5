// The decode-time kernels (recurrent_step, kv_step, kv_commit, kv_buffer_append) executed by
// the CTA emulator — 4 warps x 32 lanes per CTA as real threads, butterfly shuffles, barriers,
// NaN-filled shared memory — on small Qwen3-Next-like shapes: grouped heads (HV = 2 H), d = 64
// (vector loads) and d = 60 (not a multiple of 32), skipped slots, KV-only requests, flushes,
// drafts, g = -inf. Outputs and states are compared with the fp64 recurrence
// (tests/kernels/reference.hpp) at the anchors' tolerances: GDN recurrent 2e-3, linear
// attention 1e-3 (relative RMS).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "emulated_kernels.hpp"
#include "hybridcache/attention/kernel_bodies.hpp"
#include "reference.hpp"

namespace hc = hybridcache::attention;
namespace emu = hctest::emu;

namespace {

constexpr float sentinel = -4242.0f;
constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// One step's inputs for `batch` entries of `n` tokens: q, k [b][n][H][dk], v [b][n][HV][dv],
// g, beta [b][n][HV]. Random and never zero; every `reset_every`-th (entry, token, head) gets
// g = -inf (alpha = 0), other g in [-1.5, 0) with some g = 0.
struct step_inputs {
  int batch = 0, n = 0;
  std::vector<float> q, k, v, g, beta;
};

step_inputs make_step(int batch, int n, int H, int HV, int dk, int dv, std::uint64_t seed, int reset_every = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), u01(0.0f, 1.0f);
  auto nz = [&] {
    const float x = u(rng);
    return std::fabs(x) < 1e-3f ? 0.5f : x;
  };
  step_inputs s;
  s.batch = batch;
  s.n = n;
  const std::size_t t = static_cast<std::size_t>(batch) * n;
  s.q.resize(t * H * dk);
  s.k.resize(t * H * dk);
  s.v.resize(t * HV * dv);
  s.g.resize(t * HV);
  s.beta.resize(t * HV);
  for (auto* x : {&s.q, &s.k, &s.v})
    for (auto& e : *x) e = nz();
  for (std::size_t i = 0; i < s.g.size(); ++i) {
    s.g[i] = i % 5 == 3 ? 0.0f : -1.5f * u01(rng);
    if (reset_every > 0 && i % static_cast<std::size_t>(reset_every) == 1) s.g[i] = neg_inf;
  }
  for (auto& e : s.beta) e = 0.05f + 0.9f * u01(rng);
  return s;
}

// The state pool and its fp64 twin (per slot and value head, K-major).
template <hc::state_layout L, int DK, int DV>
struct pool_world {
  int H, HV, slots;
  std::vector<float> pool;
  std::vector<std::vector<double>> ref;
  hc::qk_options opt;

  pool_world(int h, int hv, int num_slots, std::uint64_t seed) : H(h), HV(hv), slots(num_slots) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    pool.resize(static_cast<std::size_t>(slots) * HV * DK * DV);
    for (auto& x : pool) x = u(rng);
    for (int i = 0; i < slots * HV; ++i) ref.push_back(hctest::load_state(L, DK, DV, pool.data() + state_offset(i)));
    opt = hc::qwen3_next_qk(DK);
  }
  [[nodiscard]] std::size_t state_offset(int slot_head) const { return static_cast<std::size_t>(slot_head) * DK * DV; }

  // Runs entry b's tokens [r0, r1) of `in` through the fp64 recurrence from `states` (one per
  // value head, advanced), writing outputs [b][r][hv][c] into `o`.
  void reference(const step_inputs& in, int b, int r0, int r1, bool delta, std::vector<std::vector<double>>& states,
                 std::vector<double>& o) const {
    hctest::problem p;
    p.T = in.n;
    p.H = H;
    p.HV = HV;
    p.dk = DK;
    p.dv = DV;
    p.opt = opt;
    auto slice = [&](const std::vector<float>& x, std::size_t per_token) {
      return std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(b * in.n * per_token),
                                x.begin() + static_cast<std::ptrdiff_t>((b + 1) * in.n * per_token));
    };
    p.q = slice(in.q, static_cast<std::size_t>(H) * DK);
    p.k = slice(in.k, static_cast<std::size_t>(H) * DK);
    p.v = slice(in.v, static_cast<std::size_t>(HV) * DV);
    p.g = slice(in.g, HV);
    p.beta = slice(in.beta, HV);
    std::vector<double> ob(static_cast<std::size_t>(in.n) * HV * DV);
    for (int hv = 0; hv < HV; ++hv) hctest::reference_run(p, delta, hv, states[hv], ob, r0, r1);
    for (int r = r0; r < r1; ++r)
      for (std::size_t i = 0; i < static_cast<std::size_t>(HV) * DV; ++i)
        o[(static_cast<std::size_t>(b) * in.n + r) * HV * DV + i] = ob[static_cast<std::size_t>(r) * HV * DV + i];
  }
  std::vector<std::vector<double>> heads(int slot) const {
    return {ref.begin() + slot * HV, ref.begin() + (slot + 1) * HV};
  }
  void set_heads(int slot, const std::vector<std::vector<double>>& s) {
    for (int hv = 0; hv < HV; ++hv) ref[static_cast<std::size_t>(slot * HV + hv)] = s[static_cast<std::size_t>(hv)];
  }
  // The pool's state of `slot` as fp64 K-major, all heads concatenated; and the reference's.
  std::vector<double> pool_state(int slot) const {
    std::vector<double> out;
    for (int hv = 0; hv < HV; ++hv) {
      const auto s = hctest::load_state(L, DK, DV, pool.data() + state_offset(slot * HV + hv));
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  }
  std::vector<double> ref_state(int slot) const {
    std::vector<double> out;
    for (int hv = 0; hv < HV; ++hv) out.insert(out.end(), ref[static_cast<std::size_t>(slot * HV + hv)].begin(),
                                                ref[static_cast<std::size_t>(slot * HV + hv)].end());
    return out;
  }
};

// Outputs of the active entries only (skipped entries must keep the sentinel: checked apart).
std::vector<double> active_part(const std::vector<float>& o, const std::vector<std::int32_t>& slots, std::size_t per_entry) {
  std::vector<double> out;
  for (std::size_t b = 0; b < slots.size(); ++b)
    if (slots[b] >= 0) out.insert(out.end(), o.begin() + static_cast<std::ptrdiff_t>(b * per_entry),
                                  o.begin() + static_cast<std::ptrdiff_t>((b + 1) * per_entry));
  return out;
}
std::vector<double> active_part(const std::vector<double>& o, const std::vector<std::int32_t>& slots, std::size_t per_entry) {
  std::vector<double> out;
  for (std::size_t b = 0; b < slots.size(); ++b)
    if (slots[b] >= 0) out.insert(out.end(), o.begin() + static_cast<std::ptrdiff_t>(b * per_entry),
                                  o.begin() + static_cast<std::ptrdiff_t>((b + 1) * per_entry));
  return out;
}
void check_skipped(const std::vector<float>& o, const std::vector<std::int32_t>& slots, std::size_t per_entry) {
  for (std::size_t b = 0; b < slots.size(); ++b)
    if (slots[b] < 0)
      for (std::size_t i = 0; i < per_entry; ++i) REQUIRE(o[b * per_entry + i] == sentinel);
}

template <class Rule, hc::state_layout L, int DK, int DV>
void recurrent_case(int n, bool per_draft_states, double tol) {
  constexpr int H = 1, HV = 2;
  pool_world<L, DK, DV> w(H, HV, 4, 7 + n);
  const std::vector<std::int32_t> slots{2, -1, 0};
  const int batch = 3;
  const auto in = make_step(batch, n, H, HV, DK, DV, 100 + n, 7);
  std::vector<float> o(static_cast<std::size_t>(batch) * n * HV * DV, sentinel);
  std::vector<float> inter(per_draft_states ? static_cast<std::size_t>(batch) * n * HV * DK * DV : 0, sentinel);
  const auto pool_before = w.pool;
  const hc::step_io<float, float> io{slots.data(), batch, n, H, HV, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                     in.beta.data(), o.data(), w.pool.data(), w.opt};
  const hc::recurrent_program<Rule, L, DK, DV, float, float> prog{io, per_draft_states ? inter.data() : nullptr};
  hctest::emulate("recurrent_step", hc::recurrent_step_shape(batch, HV),
                  [&](emu::lane& t) { hc::kernel_bodies::recurrent_step(t, prog); });

  std::vector<double> expect(o.size());
  const std::size_t per_entry = static_cast<std::size_t>(n) * HV * DV;
  for (int b = 0; b < batch; ++b) {
    if (slots[b] < 0) continue;
    auto st = w.heads(slots[b]);
    for (int r = 0; r < n; ++r) {
      w.reference(in, b, r, r + 1, Rule::delta, st, expect);
      if (per_draft_states) {  // the state after token r, per head
        std::vector<double> want, got;
        for (int hv = 0; hv < HV; ++hv) {
          want.insert(want.end(), st[hv].begin(), st[hv].end());
          const auto s = hctest::load_state(L, DK, DV, inter.data() + ((static_cast<std::size_t>(b) * n + r) * HV + hv) * DK * DV);
          got.insert(got.end(), s.begin(), s.end());
        }
        CHECK(hctest::rel_rms(got, want) <= tol);
      }
    }
    if (!per_draft_states) w.set_heads(slots[b], st);
  }
  CHECK(hctest::rel_rms(active_part(o, slots, per_entry), active_part(expect, slots, per_entry)) <= tol);
  check_skipped(o, slots, per_entry);
  if (per_draft_states) {
    CHECK(w.pool == pool_before);  // verification with per-draft states leaves the pool alone
  } else {
    for (int s : {0, 2}) CHECK(hctest::rel_rms(w.pool_state(s), w.ref_state(s)) <= tol);
    for (int s : {1, 3})  // slots nobody named: untouched, bit for bit
      CHECK(std::memcmp(w.pool.data() + w.state_offset(s * HV), pool_before.data() + w.state_offset(s * HV),
                        HV * DK * DV * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("emulated recurrent_step: decode and per-draft states, GQA, d 64 and 60, skipped slot, g = -inf") {
  SUBCASE("GDN, V-major, d 64 (64-bit vector loads), one token") { recurrent_case<hc::delta_rule, hc::state_layout::v_major, 64, 64>(1, false, 2e-3); }
  SUBCASE("GDN, V-major, d 60, 3 drafts with per-draft states") { recurrent_case<hc::delta_rule, hc::state_layout::v_major, 60, 60>(3, true, 2e-3); }
  SUBCASE("linear attention, K-major, d 60, 2 tokens") { recurrent_case<hc::linear_rule, hc::state_layout::k_major, 60, 60>(2, false, 1e-3); }
}

namespace {

// A KVBuffer world: host pool arrays for keys, values, decays, and the table.
template <int DK, int DV>
struct buffer_world {
  hc::kv_buffer_table table;
  int H, HV;
  std::vector<float> keys, values, decays;
  buffer_world(const hc::kv_buffer_config& cfg, int h, int hv) : table(cfg), H(h), HV(hv) {
    const std::size_t tokens = static_cast<std::size_t>(cfg.num_blocks) * cfg.block_tokens;
    keys.assign(tokens * H * DK, std::numeric_limits<float>::quiet_NaN());  // unwritten cells poison reads
    values.assign(tokens * HV * DV, std::numeric_limits<float>::quiet_NaN());
    decays.assign(tokens * HV, std::numeric_limits<float>::quiet_NaN());
  }
  hc::kv_buffer_ref<float, float> ref() {
    return {keys.data(), values.data(), decays.data(), table.block_table_data(), table.cursor_data(),
            table.state_valid_data(), table.config().block_tokens, table.max_blocks_per_slot(), H, HV, DK, DV};
  }
  [[nodiscard]] int max_total() const { return std::max(table.capacity(false), table.capacity(true)); }
};

// Emulated KVBuffer step (decode or verify) through the launcher's own program and shape.
template <class Rule, hc::state_layout L, int DK, int DV>
void emulate_kv_step(pool_world<L, DK, DV>& w, buffer_world<DK, DV>& bw, const std::vector<std::int32_t>& slots,
                     const step_inputs& in, std::vector<float>& o, bool decode) {
  bw.table.check_step(slots, in.n);
  const hc::step_io<float, float> io{slots.data(), in.batch, in.n, w.H, w.HV, in.q.data(), in.k.data(), in.v.data(),
                                     in.g.data(), in.beta.data(), o.data(), w.pool.data(), w.opt};
  using program = hc::kv_step_program<Rule, L, DK, DV, float, float, float>;
  const program prog{io, bw.ref(), bw.table.config().flush_interval, bw.table.config().kv_only_crossover, decode};
  hctest::emulate("kv_step", hc::kv_step_shape<program>(in.batch, w.HV, bw.max_total(), in.n),
                  [&](emu::lane& t) { hc::kernel_bodies::kv_step(t, prog); });
}

}  // namespace

TEST_CASE("emulated kv_step / kv_commit: flush cycles, a KV-only request crossing over, drafts, g = -inf") {
  constexpr int DK = 64, DV = 64, H = 1, HV = 2;
  constexpr auto L = hc::state_layout::v_major;
  // B = 3, drafts up to 3, KV-only crossover 4; blocks of 2 tokens (buffers span blocks).
  const hc::kv_buffer_config cfg{.num_slots = 4, .num_blocks = 24, .block_tokens = 2, .flush_interval = 3,
                                 .max_new_tokens = 3, .kv_only_crossover = 4};
  pool_world<L, DK, DV> w(H, HV, 4, 21);
  buffer_world<DK, DV> bw(cfg, H, HV);
  REQUIRE(bw.table.open(0, false));
  REQUIRE(bw.table.open(2, true));  // KV-only: no state yet (the pool's random bytes must not be read)
  for (auto& x : w.ref[2 * HV]) x = 0.0;
  for (auto& x : w.ref[2 * HV + 1]) x = 0.0;
  const std::vector<std::int32_t> slots{0, -1, 2};
  const std::size_t per_token = static_cast<std::size_t>(HV) * DV;
  std::uint64_t seed = 500;

  auto decode_step = [&](int reset_every) {
    const auto in = make_step(3, 1, H, HV, DK, DV, ++seed, reset_every);
    std::vector<float> o(3 * per_token, sentinel);
    emulate_kv_step<hc::delta_rule>(w, bw, slots, in, o, true);
    std::vector<double> expect(o.size());
    for (int b = 0; b < 3; ++b) {
      if (slots[b] < 0) continue;
      auto st = w.heads(slots[b]);
      w.reference(in, b, 0, 1, true, st, expect);
      w.set_heads(slots[b], st);
    }
    CHECK(hctest::rel_rms(active_part(o, slots, per_token), active_part(expect, slots, per_token)) <= 2e-3);
    check_skipped(o, slots, per_token);
    for (auto s : slots)
      if (s >= 0 && bw.table.advance(s, 1).fold) CHECK(hctest::rel_rms(w.pool_state(s), w.ref_state(s)) <= 2e-3);
  };
  for (int step = 0; step < 4; ++step) decode_step(step == 1 ? 3 : 0);  // step 1 resets some heads
  CHECK(bw.table.state_valid(2));  // crossed over at 4 tokens
  CHECK(bw.table.cursor(0) == 1);

  // Verify 3 drafts (outputs only, no state write), then commit accepted prefixes 2 / 3:
  // both fill the buffer and fold.
  const auto in = make_step(3, 3, H, HV, DK, DV, 900, 4);
  std::vector<float> o(3 * 3 * per_token, sentinel);
  const auto pool_before = w.pool;
  emulate_kv_step<hc::delta_rule>(w, bw, slots, in, o, false);
  CHECK(w.pool == pool_before);
  std::vector<double> expect(o.size());
  for (int b = 0; b < 3; ++b) {
    if (slots[b] < 0) continue;
    auto st = w.heads(slots[b]);  // a copy: verification changes nothing
    w.reference(in, b, 0, 3, true, st, expect);
  }
  CHECK(hctest::rel_rms(active_part(o, slots, 3 * per_token), active_part(expect, slots, 3 * per_token)) <= 2e-3);
  check_skipped(o, slots, 3 * per_token);

  const std::vector<std::int32_t> accepted{2, 0, 3};
  bw.table.check_step(slots, 3);
  using commit = hc::kv_commit_program<hc::delta_rule, L, DK, DV, float, float>;
  const commit prog{slots.data(), accepted.data(), H, HV, w.pool.data(), bw.ref(), w.opt,
                    cfg.flush_interval, cfg.kv_only_crossover};
  hctest::emulate("kv_commit", hc::kv_commit_shape<commit>(3, HV, bw.max_total()),
                  [&](emu::lane& t) { hc::kernel_bodies::kv_commit(t, prog); });
  for (int b = 0; b < 3; ++b) {
    if (slots[b] < 0) continue;
    auto st = w.heads(slots[b]);
    std::vector<double> scratch(expect.size());
    w.reference(in, b, 0, accepted[b], true, st, scratch);
    w.set_heads(slots[b], st);
    REQUIRE(bw.table.advance(slots[b], accepted[b]).fold);
    CHECK(hctest::rel_rms(w.pool_state(slots[b]), w.ref_state(slots[b])) <= 2e-3);
  }
  decode_step(0);  // decode goes on after the commit
}

TEST_CASE("emulated kv_step with B = 1 is bit-identical to emulated recurrent_step") {
  constexpr int DK = 64, DV = 64, H = 1, HV = 2;
  constexpr auto L = hc::state_layout::v_major;
  const hc::kv_buffer_config cfg{.num_slots = 2, .num_blocks = 4, .block_tokens = 1, .flush_interval = 1,
                                 .max_new_tokens = 1, .kv_only_crossover = 0};
  pool_world<L, DK, DV> a(H, HV, 2, 3), b(H, HV, 2, 3);
  buffer_world<DK, DV> bw(cfg, H, HV);
  REQUIRE(bw.table.open(1, false));
  const std::vector<std::int32_t> slots{1};
  const auto in = make_step(1, 1, H, HV, DK, DV, 77, 0);
  std::vector<float> oa(static_cast<std::size_t>(HV) * DV, sentinel), ob = oa;
  emulate_kv_step<hc::delta_rule>(a, bw, slots, in, oa, true);
  const hc::step_io<float, float> io{slots.data(), 1, 1, H, HV, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                     in.beta.data(), ob.data(), b.pool.data(), b.opt};
  const hc::recurrent_program<hc::delta_rule, L, DK, DV, float, float> rec{io, nullptr};
  hctest::emulate("recurrent_step", hc::recurrent_step_shape(1, HV), [&](emu::lane& t) { hc::kernel_bodies::recurrent_step(t, rec); });
  CHECK(std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.pool.data(), b.pool.data(), a.pool.size() * sizeof(float)) == 0);
}

TEST_CASE("emulated kv_commit past 65,535 entries: a 1-D grid, entries above 65,535 fold") {
  constexpr int DK = 64, DV = 64, H = 1, HV = 2;
  constexpr auto L = hc::state_layout::v_major;
  const hc::kv_buffer_config cfg{.num_slots = 3, .num_blocks = 12, .block_tokens = 2, .flush_interval = 3,
                                 .max_new_tokens = 3, .kv_only_crossover = 0};
  pool_world<L, DK, DV> w(H, HV, 3, 5), host = w;
  buffer_world<DK, DV> bw(cfg, H, HV);
  for (int s = 0; s < 3; ++s) REQUIRE(bw.table.open(s, false));
  // Fill the three buffers with 3 drafts each (host program: the kernels' own arithmetic).
  constexpr int batch = 70000;
  std::vector<std::int32_t> slots(batch, -1), accepted(batch, 0);
  const int entries[3] = {65535, 65536, 69999};
  for (int i = 0; i < 3; ++i) {
    slots[entries[i]] = i;
    accepted[entries[i]] = 3;  // fills B = 3: folds
  }
  const std::vector<std::int32_t> three{0, 1, 2};
  const auto in = make_step(3, 3, H, HV, DK, DV, 31, 0);
  std::vector<float> o(3 * 3 * HV * DV);
  const hc::step_io<float, float> io{three.data(), 3, 3, H, HV, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                     in.beta.data(), o.data(), w.pool.data(), w.opt};
  hc::kv_step_host<hc::delta_rule, L, DK, DV>(io, bw.ref(), cfg.flush_interval, cfg.kv_only_crossover, false);
  using commit = hc::kv_commit_program<hc::delta_rule, L, DK, DV, float, float>;
  const auto shape = hc::kv_commit_shape<commit>(batch, HV, bw.max_total());
  CHECK(shape.blocks == std::uint64_t{batch} * HV);  // one grid dimension: no 65,535 limit
  CHECK(emu::valid_launch({shape.blocks, shape.threads, shape.shared_bytes}));
  const commit prog{slots.data(), accepted.data(), H, HV, w.pool.data(), bw.ref(), w.opt, cfg.flush_interval, 0};
  emu::options only;
  only.only_blocks = [&](std::uint64_t blk) { return slots[blk / HV] >= 0; };
  hctest::emulate("kv_commit", shape, [&](emu::lane& t) { hc::kernel_bodies::kv_commit(t, prog); }, only);
  hc::kv_commit_host<hc::delta_rule, L, DK, DV>(three.data(), std::vector<std::int32_t>{3, 3, 3}.data(), 3, H, HV,
                                               host.pool.data(), bw.ref(), w.opt, cfg.flush_interval, 0);
  CHECK(hctest::rel_rms(w.pool, host.pool) <= 1e-5);
  CHECK(w.pool != std::vector<float>(w.pool.size(), 0.0f));
}

TEST_CASE("emulated kv_buffer_append fills a KV-only buffer exactly as the host append") {
  constexpr int DK = 60, DV = 64, H = 2, HV = 4;
  const hc::kv_buffer_config cfg{.num_slots = 2, .num_blocks = 16, .block_tokens = 4, .flush_interval = 4,
                                 .max_new_tokens = 1, .kv_only_crossover = 12};
  buffer_world<DK, DV> dev(cfg, H, HV), host(cfg, H, HV);
  REQUIRE(dev.table.open(1, true));
  REQUIRE(host.table.open(1, true));
  constexpr int tokens = 9;
  const auto in = make_step(tokens, 1, H, HV, DK, DV, 12, 4);
  std::vector<float> u(in.v);
  for (auto& x : u) x *= 0.5f;
  const auto ref = dev.ref();
  hctest::emulate("kv_buffer_append", hc::kv_buffer_append_shape(tokens, HV), [&](emu::lane& t) {
    hc::kernel_bodies::kv_buffer_append(t, ref, 1, tokens, in.k.data(), u.data(), in.g.data());
  });
  hc::kv_buffer_append_host(host.ref(), 1, tokens, in.k.data(), u.data(), in.g.data());
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;  // NaN cells compare as bits
  };
  CHECK(same(dev.keys, host.keys));
  CHECK(same(dev.values, host.values));
  CHECK(same(dev.decays, host.decays));
}
