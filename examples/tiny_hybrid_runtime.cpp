// The request lifecycle end to end: a tiny hybrid model (2 Gated DeltaNet + 2 attention
// layers, fp32, random fixed weights) served through `request_lifecycle` over an asymmetric
// pool, and checked against the same model run with no cache at all.
//
// What the runtime below does, per request (docs/runtime.md, "A request, step by step"):
//   begin(prompt, {.output_tokens = 4})       match + pin, plan, reserve KV and checkpoint slots
//   resume_checkpoint -> working GDN states   copied out of the pool's SSM blocks (zero on a miss)
//   block_table per attention layer           K and V of every token live in the pool's pages:
//                                             token p in page table[p / 16], slot p % 16
//   chunked prefill [reusable, |prompt|)      chunked_prefill_host (the kernels' program), chunks
//                                             aligned to absolute multiples of 16, states emitted at
//                                             the plan's sites, written into the reserved slots
//   greedy decode                             recurrent_head per GDN head, attention through the
//                                             table; grow(ticket, 2) when decode passes the
//                                             reservation, then the block tables again
//   end state -> end slot; finish(sequence, sites + |sequence|)
// The uncached reference runs the same layer code from token 0 with a flat KV array and a zero
// state: chunked prefill of the whole prompt, then the same recurrent decode.
//
// Workload: 400 requests of branching multi-turn conversations. Every session starts with one
// shared system prompt; a request starts a session, continues one (its whole history is the
// prefix) or branches one at an earlier turn. Up to 4 requests are in flight at once, and each
// request touches only its own ticket's pages and checkpoint slots. The pool is small enough
// that the cache evicts and the pool moves capacity between its KV and SSM sides (both
// counted, both must be > 0).
//
// Threads (`--threads 4`): the requests of a batch are served by one thread each. What a
// threaded runtime must respect, and this one does: a page's address is valid only while no
// allocation can move it. The pool runs with compaction on, so when one side needs room the
// rebalancer moves live units out of a sparse chunk of the other side (the detail line
// counts them). The lifecycle's rule (docs/runtime.md, "Threads"): compute holds
// `requests.memory_read_lock()` (any number of requests at once) and resolves every address
// under it; the lifecycle calls that allocate or free (begin, grow, finish, abort) take that
// lock exclusively themselves, so compute releases it before calling them and, after taking
// it again, resolves its block tables and slots again. The cache's own lock (mutex_lock)
// serialises the lifecycle's bookkeeping. CI runs this mode under ThreadSanitizer (4
// threads, 160 requests); tests/prefix/test_lifecycle_contract.cpp runs begin concurrently
// with other threads' compute on a compacting pool.
//
// Exactness. Output tokens must be identical. Logits cannot be bit-identical on a hit: the
// cached run's prefix KV and resumed state were computed by earlier requests, whose chunks
// started at their own resume points and whose last tokens went through the recurrent
// (decode) form, while the uncached run computes the same prefix with chunks aligned from
// token 0. Chunkwise (UT transform, then a roll-forward) and recurrent forms are the same
// sums in a different order, so they agree to fp32 rounding, not bit for bit. Every logit
// vector of a request (after the prompt and after every decoded token) must therefore be
// within kTolerance of the uncached one, relative to the largest uncached logit; a miss
// (nothing reused) runs exactly the uncached sequence of operations and must be
// bit-identical. The maximum relative difference measured is printed.
//
// The host tier (`--host-tier BYTES`, default 256 KiB; 0 turns it off): the pool store gets
// a host tier of that many bytes (half KV pages, half checkpoint blocks). A leaf the cache evicts is demoted there (its KV
// pages and its checkpoint are copied to host memory); a later request whose prompt continues
// past the pool's match into demoted entries gets them back in begin, copied into its own
// reserved pages and a reserved checkpoint slot, and its prefill starts after them
// (plan.prefill_start). The runtime does nothing different: it reads KV through the block
// table and resumes from resume_checkpoint as for a pool hit. "host loads" counts those
// requests; the run fails unless it is > 0 and every output is still identical. With
// `--host-tier 0` there is no host tier and host loads is 0.
//
// Output: a detail line, then the summary line, e.g.
//   identical outputs: 400/400 requests; reused 61.2% of prompt tokens; host loads 37; evictions 512
// ("reused" counts the tokens a request did not compute: its pool hit, or its host hit).
// Exit status 1 unless every request matched (and the cache evicted, the pool rebalanced,
// every page went back to the pool at the end, and with a host tier, host loads > 0).
//
// `--sparsify-eval` (alone) runs something else: CaR's sparsification served for real on this
// model (section "--sparsify-eval" below, docs/tiered.md): calibration, sparsified demotion
// through a tiered_store, attention over the kept rows, quality against the dense cache.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <span>
#include <thread>
#include <vector>

#include <hybridcache/attention/linear_attention_forms.hpp>
#include <hybridcache/hybridcache.hpp>
#include <hybridcache/prefix/lifecycle.hpp>
#include <hybridcache/tiered/host_copy_engine.hpp>
#include <hybridcache/tiered/sparse_kv.hpp>

namespace {

namespace hc = hybridcache;
namespace la = hybridcache::attention;  // the attention/ forms (host + device code)
using hc::token_id;

// ---- shapes ------------------------------------------------------------------------------
constexpr int kVocab = 256;
constexpr int kD = 64;             // d_model
constexpr int kHeads = 2;          // attention query heads
constexpr int kKvHeads = 1;        // attention KV heads (GQA 2:1)
constexpr int kHeadDim = 32;
constexpr int kGdnHeads = 2;       // GDN key = value heads
constexpr int kDk = 32, kDv = 32;  // GDN head dims
constexpr int kChunk = 16;         // GDN scan chunk (= the plan's chunk)
constexpr int kTokensPerPage = 16;
constexpr int kLayers = 4;         // G A G A
constexpr int kAttnLayers = 2, kGdnLayers = 2;
constexpr int kSlotFloats = 2 * kKvHeads * kHeadDim;  // one token of one layer: K then V
constexpr int kStateFloats = kGdnHeads * kDk * kDv;   // one GDN layer's state
constexpr auto kLayout = la::state_layout::v_major;
using state_t = la::state_ref<kLayout, kDk, kDv>;

constexpr int kDefaultRequests = 400;
constexpr int kMaxInFlight = 4;
constexpr std::int64_t kReservedOutput = 4;  // decode tokens reserved at begin; grow past them
constexpr double kTolerance = 1e-5;          // max |cached - uncached| / max |uncached| per logit vector

bool is_attention(int layer) { return layer % 2 == 1; }

hc::model_spec tiny_spec() {
  hc::model_spec s;
  s.name = "tiny_hybrid_runtime";
  s.source = "examples/tiny_hybrid_runtime.cpp: 2 Gated DeltaNet + 2 attention layers, fp32";
  s.layers = hc::layer_pattern("RA", 2);
  s.d_model = kD;
  s.attention_heads = kHeads;
  s.kv_heads = kKvHeads;
  s.head_dim = kHeadDim;
  s.recurrent = hc::recurrent_family::gated_deltanet;
  s.gdn_key_heads = kGdnHeads;
  s.gdn_value_heads = kGdnHeads;
  s.gdn_key_dim = kDk;
  s.gdn_value_dim = kDv;
  s.kv_dtype_bytes = 4;
  s.state_dtype_bytes = 4;
  s.activation_dtype_bytes = 4;
  s.scan_chunk = kChunk;
  return s;
}

// ---- deterministic randomness --------------------------------------------------------------
struct prng {
  std::uint64_t s;
  std::uint64_t next() { return s = hc::splitmix64_mix(s + 0x9e3779b97f4a7c15ull); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  /// A weight: magnitude in [0.1, 1) x scale, random sign; never zero.
  float weight(float scale) {
    const double m = 0.1 + 0.9 * uniform();
    return static_cast<float>((next() & 1) ? m * scale : -m * scale);
  }
};

std::vector<float> random_matrix(prng& r, int rows, int cols, float scale) {
  std::vector<float> w(static_cast<std::size_t>(rows) * cols);
  for (auto& x : w) x = r.weight(scale);
  return w;
}

// ---- the model -------------------------------------------------------------------------------
struct layer_weights {
  std::vector<float> norm;           // [D] RMSNorm gain
  std::vector<float> wq, wk, wv;     // [D][out]
  std::vector<float> wa, wb;         // GDN gates [D][HV]
  std::array<float, kGdnHeads> a_log{}, dt_bias{};
  std::vector<float> wo;             // [in][D]
};

struct model {
  std::vector<float> embed;  // [V][D], tied with the output head
  std::vector<float> final_norm;
  std::array<layer_weights, kLayers> layers;

  explicit model(std::uint64_t seed) {
    prng r{seed};
    embed = random_matrix(r, kVocab, kD, 1.0f);
    final_norm = random_matrix(r, 1, kD, 1.0f);
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(kD));
    for (int l = 0; l < kLayers; ++l) {
      auto& w = layers[static_cast<std::size_t>(l)];
      w.norm = random_matrix(r, 1, kD, 1.0f);
      if (is_attention(l)) {
        w.wq = random_matrix(r, kD, kHeads * kHeadDim, in_scale);
        w.wk = random_matrix(r, kD, kKvHeads * kHeadDim, in_scale);
        w.wv = random_matrix(r, kD, kKvHeads * kHeadDim, in_scale);
        w.wo = random_matrix(r, kHeads * kHeadDim, kD, 0.5f / std::sqrt(static_cast<float>(kHeads * kHeadDim)));
      } else {
        w.wq = random_matrix(r, kD, kGdnHeads * kDk, in_scale);
        w.wk = random_matrix(r, kD, kGdnHeads * kDk, in_scale);
        w.wv = random_matrix(r, kD, kGdnHeads * kDv, in_scale);
        w.wa = random_matrix(r, kD, kGdnHeads, in_scale);
        w.wb = random_matrix(r, kD, kGdnHeads, in_scale);
        for (int h = 0; h < kGdnHeads; ++h) {
          w.a_log[static_cast<std::size_t>(h)] = r.weight(1.0f);
          w.dt_bias[static_cast<std::size_t>(h)] = r.weight(1.0f);
        }
        w.wo = random_matrix(r, kGdnHeads * kDv, kD, 0.5f / std::sqrt(static_cast<float>(kGdnHeads * kDv)));
      }
    }
  }
};

/// y[j] = sum_i x[i] W[i][j], i in order (the one summation order of both runs).
void matvec(const float* x, const std::vector<float>& w, int in, int out, float* y) {
  for (int j = 0; j < out; ++j) y[j] = 0.0f;
  for (int i = 0; i < in; ++i) {
    const float xi = x[i];
    const float* row = w.data() + static_cast<std::size_t>(i) * out;
    for (int j = 0; j < out; ++j) y[j] += xi * row[j];
  }
}

void rms_norm(const float* x, const std::vector<float>& gain, float* y) {
  float ss = 0.0f;
  for (int i = 0; i < kD; ++i) ss += x[i] * x[i];
  const float f = 1.0f / std::sqrt(ss / kD + 1e-6f);
  for (int i = 0; i < kD; ++i) y[i] = x[i] * f * gain[static_cast<std::size_t>(i)];
}

/// Where a run keeps its KV: `slot(layer, p)` is token p's K (kHeadDim floats per KV head)
/// followed by its V. The cached run's slots are in the pool's pages, named by the block
/// table; the uncached run's are a flat array. The attention code is the same for both.
struct flat_kv {
  std::array<std::vector<float>, kAttnLayers> data;
  float* slot(int layer, std::int64_t p) {
    auto& d = data[static_cast<std::size_t>(layer)];
    if (d.size() < static_cast<std::size_t>(p + 1) * kSlotFloats) d.resize(static_cast<std::size_t>(p + 1) * kSlotFloats * 2);
    return d.data() + p * kSlotFloats;
  }
  float* write_slot(int layer, std::int64_t p) { return slot(layer, p); }
};

struct paged_kv {
  std::array<std::vector<float*>, kAttnLayers> pages;  // block b -> page address (resolved block table)
  /// Positions below this are the cache's (shared pages, read-only): their K/V is read from
  /// the table and what the model recomputes for them is dropped.
  std::int64_t write_from = 0;
  std::array<float, kSlotFloats> dropped{};
  float* write_slot(int layer, std::int64_t p) { return p < write_from ? dropped.data() : slot(layer, p); }
  float* slot(int layer, std::int64_t p) {
    const auto& t = pages[static_cast<std::size_t>(layer)];
    const auto b = static_cast<std::size_t>(p / kTokensPerPage);
    if (b >= t.size()) throw hc::invalid_argument("paged_kv: position past the block table");
    return t[b] + (p % kTokensPerPage) * kSlotFloats;
  }
};

/// Checkpoint output of a prefill: positions (absolute) and per GDN layer one
/// [count][HV][dk*dv] buffer (chunked_prefill_host's layout).
struct checkpoint_out {
  std::vector<std::int64_t> positions;
  std::array<std::vector<float>, kGdnLayers> states;
};

enum class gdn_form { chunked, recurrent };

/// A KV that attends itself (`--sparsify-eval`'s: it reads a sparsified entry's kept rows
/// through their block table, then its own tokens' slots) and one that wants each token's
/// attention output. flat_kv and paged_kv are neither: for them `forward` is unchanged.
template <class KV>
concept attends_itself = requires(KV& kv, const float* q, float* o) { kv.attend(0, std::int64_t{0}, q, 0, 1.0f, o); };
template <class KV>
concept observes_attention = requires(KV& kv, const float* o) { kv.observe(0, std::int64_t{0}, o); };

/// Runs tokens [a, b) of `seq` through the model with the KV of [0, a) in `kv` and the GDN
/// states after token a in `states` (updated to after b). Writes the K/V of [a, b) into `kv`,
/// the states at `ck.positions` into `ck.states` (chunked form only) and the logits after
/// token b - 1 into `logits`.
template <class KV>
void forward(const model& m, std::span<const token_id> seq, std::int64_t a, std::int64_t b, gdn_form form, KV& kv,
             std::array<std::vector<float>, kGdnLayers>& states, checkpoint_out* ck, std::vector<float>& logits) {
  const auto T = static_cast<int>(b - a);
  std::vector<float> x(static_cast<std::size_t>(T) * kD), h(static_cast<std::size_t>(T) * kD);
  for (int t = 0; t < T; ++t) {
    const auto tok = static_cast<std::size_t>(seq[static_cast<std::size_t>(a + t)]);
    std::copy_n(m.embed.data() + tok * kD, kD, x.data() + static_cast<std::size_t>(t) * kD);
  }
  std::vector<float> q, k, v, o, y(kD), ga, gb, g, beta, scores;
  int attn = 0, gdn = 0;
  for (int l = 0; l < kLayers; ++l) {
    const layer_weights& w = m.layers[static_cast<std::size_t>(l)];
    for (int t = 0; t < T; ++t) rms_norm(x.data() + t * kD, w.norm, h.data() + t * kD);
    if (is_attention(l)) {
      constexpr int QW = kHeads * kHeadDim, KW = kKvHeads * kHeadDim;
      q.assign(static_cast<std::size_t>(T) * QW, 0.0f);
      o.assign(static_cast<std::size_t>(T) * QW, 0.0f);
      for (int t = 0; t < T; ++t) {  // K and V of every new token go into its slot first
        float* s = kv.write_slot(attn, a + t);
        matvec(h.data() + t * kD, w.wq, kD, QW, q.data() + t * QW);
        matvec(h.data() + t * kD, w.wk, kD, KW, s);
        matvec(h.data() + t * kD, w.wv, kD, KW, s + KW);
      }
      const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
      for (int t = 0; t < T; ++t) {
        const std::int64_t pos = a + t;
        scores.resize(static_cast<std::size_t>(pos + 1));
        for (int hd = 0; hd < kHeads; ++hd) {
          const int kvh = hd / (kHeads / kKvHeads);
          const float* qh = q.data() + t * QW + hd * kHeadDim;
          if constexpr (attends_itself<KV>) {
            kv.attend(attn, pos, qh, kvh, scale, o.data() + t * QW + hd * kHeadDim);
            continue;
          }
          float mx = -INFINITY;
          for (std::int64_t p = 0; p <= pos; ++p) {  // reads every earlier token through the table
            const float* kp = kv.slot(attn, p) + kvh * kHeadDim;
            float d = 0.0f;
            for (int i = 0; i < kHeadDim; ++i) d += qh[i] * kp[i];
            scores[static_cast<std::size_t>(p)] = d * scale;
            mx = std::max(mx, d * scale);
          }
          float sum = 0.0f;
          for (std::int64_t p = 0; p <= pos; ++p) sum += scores[static_cast<std::size_t>(p)] = std::exp(scores[static_cast<std::size_t>(p)] - mx);
          float* oh = o.data() + t * QW + hd * kHeadDim;
          for (std::int64_t p = 0; p <= pos; ++p) {
            const float* vp = kv.slot(attn, p) + KW + kvh * kHeadDim;
            const float wgt = scores[static_cast<std::size_t>(p)] / sum;
            for (int i = 0; i < kHeadDim; ++i) oh[i] += wgt * vp[i];
          }
        }
        if constexpr (observes_attention<KV>) kv.observe(attn, pos, o.data() + t * QW);
        matvec(o.data() + t * QW, w.wo, QW, kD, y.data());
        for (int i = 0; i < kD; ++i) x[static_cast<std::size_t>(t * kD + i)] += y[static_cast<std::size_t>(i)];
      }
      ++attn;
    } else {
      constexpr int KW = kGdnHeads * kDk, VW = kGdnHeads * kDv;
      q.resize(static_cast<std::size_t>(T) * KW);
      k.resize(static_cast<std::size_t>(T) * KW);
      v.resize(static_cast<std::size_t>(T) * VW);
      o.assign(static_cast<std::size_t>(T) * VW, 0.0f);
      ga.resize(kGdnHeads);
      gb.resize(kGdnHeads);
      g.resize(static_cast<std::size_t>(T) * kGdnHeads);
      beta.resize(static_cast<std::size_t>(T) * kGdnHeads);
      for (int t = 0; t < T; ++t) {
        const float* ht = h.data() + t * kD;
        matvec(ht, w.wq, kD, KW, q.data() + t * KW);
        matvec(ht, w.wk, kD, KW, k.data() + t * KW);
        matvec(ht, w.wv, kD, VW, v.data() + t * VW);
        matvec(ht, w.wa, kD, kGdnHeads, ga.data());
        matvec(ht, w.wb, kD, kGdnHeads, gb.data());
        for (int hv = 0; hv < kGdnHeads; ++hv) {
          const auto i = static_cast<std::size_t>(t * kGdnHeads + hv);
          g[i] = la::qwen3_next_log_decay(w.a_log[static_cast<std::size_t>(hv)], ga[static_cast<std::size_t>(hv)],
                                          w.dt_bias[static_cast<std::size_t>(hv)]);
          beta[i] = la::qwen3_next_beta(gb[static_cast<std::size_t>(hv)]);
        }
      }
      float* state = states[static_cast<std::size_t>(gdn)].data();
      const la::qk_options qk = la::qwen3_next_qk(kDk);
      if (form == gdn_form::chunked) {
        const std::int64_t cu[2] = {0, T}, start[1] = {a};
        const std::int32_t slot[1] = {0};
        const std::int64_t count = ck ? static_cast<std::int64_t>(ck->positions.size()) : 0;
        const std::int64_t ck_off[2] = {0, count};
        la::prefill_io<float, float> io;
        io.num_seqs = 1;
        io.num_k_heads = kGdnHeads;
        io.num_v_heads = kGdnHeads;
        io.chunk = kChunk;
        io.cu_seqlens = cu;
        io.start_positions = start;
        io.slots = slot;
        io.q = q.data();
        io.k = k.data();
        io.v = v.data();
        io.log_decay = g.data();
        io.beta = beta.data();
        io.o = o.data();
        io.states = state;
        if (count > 0) {
          auto& out = ck->states[static_cast<std::size_t>(gdn)];
          out.assign(static_cast<std::size_t>(count * kStateFloats), 0.0f);
          io.checkpoint_offsets = ck_off;
          io.checkpoint_positions = ck->positions.data();
          io.checkpoint_states = out.data();
        }
        io.qk = qk;
        la::chunked_prefill_host<la::delta_rule, kLayout, kDk, kDv>(io);
      } else {
        for (int hv = 0; hv < kGdnHeads; ++hv) {
          la::head_input<float> in;
          in.q = q.data() + hv * kDk;
          in.k = k.data() + hv * kDk;
          in.v = v.data() + hv * kDv;
          in.q_stride = in.k_stride = KW;
          in.v_stride = VW;
          in.log_decay = g.data() + hv;
          in.decay_stride = kGdnHeads;
          in.beta = beta.data() + hv;
          in.beta_stride = kGdnHeads;
          in.length = T;
          la::recurrent_head<la::delta_rule>(in, la::head_output<float>{o.data() + hv * kDv, VW, nullptr, 0},
                                             state_t{state + hv * kDk * kDv}, qk, a);
        }
      }
      for (int t = 0; t < T; ++t) {
        matvec(o.data() + t * VW, w.wo, VW, kD, y.data());
        for (int i = 0; i < kD; ++i) x[static_cast<std::size_t>(t * kD + i)] += y[static_cast<std::size_t>(i)];
      }
      ++gdn;
    }
  }
  rms_norm(x.data() + (T - 1) * kD, m.final_norm, y.data());
  logits.assign(kVocab, 0.0f);
  for (int tok = 0; tok < kVocab; ++tok) {
    const float* e = m.embed.data() + static_cast<std::size_t>(tok) * kD;
    float s = 0.0f;
    for (int i = 0; i < kD; ++i) s += e[i] * y[static_cast<std::size_t>(i)];
    logits[static_cast<std::size_t>(tok)] = s;
  }
}

token_id argmax(const std::vector<float>& logits) {
  return static_cast<token_id>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

/// What a run produced: the decoded tokens and every logit vector (after the prompt, then
/// after each decoded token).
struct run_result {
  std::vector<token_id> output;
  std::vector<std::vector<float>> logits;
};

/// The reference: no cache, full chunked prefill from token 0, then recurrent decode.
run_result run_uncached(const model& m, std::span<const token_id> prompt, int decode) {
  run_result r;
  std::vector<token_id> seq(prompt.begin(), prompt.end());
  flat_kv kv;
  std::array<std::vector<float>, kGdnLayers> states;
  for (auto& s : states) s.assign(kStateFloats, 0.0f);
  std::vector<float> logits;
  forward(m, seq, 0, static_cast<std::int64_t>(seq.size()), gdn_form::chunked, kv, states, nullptr, logits);
  r.logits.push_back(logits);
  for (int i = 0; i < decode; ++i) {
    seq.push_back(argmax(logits));
    r.output.push_back(seq.back());
    const auto p = static_cast<std::int64_t>(seq.size()) - 1;
    forward(m, seq, p, p + 1, gdn_form::recurrent, kv, states, nullptr, logits);
    r.logits.push_back(logits);
  }
  return r;
}

// ---- the runtime ------------------------------------------------------------------------------
using pool_t = hc::memory::host_asymmetric_pool<hc::memory::threshold_rebalancer>;
using store_t = hc::stores::pool_state_store<pool_t>;
using cache_t = hc::prefix::prefix_cache<hc::cost_model, hc::prefix::judicious_admission, hc::prefix::lru_scorer, store_t,
                                         hc::prefix::mutex_lock>;
using lifecycle_t = hc::prefix::request_lifecycle<cache_t>;

struct runtime {
  const model& m;
  pool_t& pool;
  lifecycle_t& requests;
  std::atomic<std::int64_t> grows{0};

  float* address(hc::packed_handle h) const {
    auto p = pool.resolve(h);
    if (!p || *p == nullptr) throw hc::invalid_argument("tiny_hybrid_runtime: a handle the lifecycle gave does not resolve");
    return reinterpret_cast<float*>(*p);
  }

  /// The block tables of every attention layer, resolved to page addresses.
  void load_tables(hc::prefix::request_ticket t, paged_kv& kv) const {
    std::vector<hc::packed_handle> table;
    for (int l = 0; l < kAttnLayers; ++l) {
      if (!requests.block_table(t, l, table)) throw hc::invalid_argument("block_table refused a live ticket");
      auto& pages = kv.pages[static_cast<std::size_t>(l)];
      pages.clear();
      for (auto h : table) pages.push_back(address(h));
    }
  }

  /// Serves an admitted request: prefill from the resumed state, greedy decode, capture, finish.
  /// false when a grow was refused (the request was aborted and must be retried).
  bool serve(hc::prefix::request_ticket t, std::span<const token_id> prompt, int decode, run_result& out,
             std::vector<token_id>& sequence) {
    auto computing = requests.memory_read_lock();  // addresses stay valid while held
    const auto* s = *requests.state(t);
    // Prefill starts after the pool hit, or after the host hit begin loaded into the reservation.
    const std::int64_t from = s->plan.prefill_start, n = static_cast<std::int64_t>(prompt.size());
    if (from >= n) throw hc::invalid_argument("tiny_hybrid_runtime: a whole-prompt hit leaves no token to compute logits from");
    // Resume: the working GDN states start as the checkpoint's blocks (zero on a miss).
    std::array<std::vector<float>, kGdnLayers> states;
    const auto* resume = *requests.resume_checkpoint(t);
    for (int l = 0; l < kGdnLayers; ++l) {
      auto& st = states[static_cast<std::size_t>(l)];
      st.assign(kStateFloats, 0.0f);
      if (resume != nullptr) std::memcpy(st.data(), address(resume->blocks[static_cast<std::size_t>(l)]), kStateFloats * sizeof(float));
    }
    paged_kv kv;
    kv.write_from = s->kv_from;  // the tree holds [0, kv_from): read it, never write it
    load_tables(t, kv);
    // Prefill, emitting the states at the plan's sites into the reserved slots.
    checkpoint_out ck;
    ck.positions = la::checkpoint_positions(s->plan, n - from, kChunk);
    sequence.assign(prompt.begin(), prompt.end());
    std::vector<float> logits;
    forward(m, sequence, from, n, gdn_form::chunked, kv, states, &ck, logits);
    std::vector<std::int64_t> captured = ck.positions;
    for (std::size_t i = 0; i < ck.positions.size(); ++i)
      for (int l = 0; l < kGdnLayers; ++l)
        std::memcpy(address(s->checkpoints[i].handle.blocks[static_cast<std::size_t>(l)]),
                    ck.states[static_cast<std::size_t>(l)].data() + static_cast<std::ptrdiff_t>(i) * kStateFloats,
                    kStateFloats * sizeof(float));
    out.logits.push_back(logits);
    // Decode; past the reservation, grow (every earlier token is written) and reload the tables.
    for (int i = 0; i < decode; ++i) {
      sequence.push_back(argmax(logits));
      out.output.push_back(sequence.back());
      const auto p = static_cast<std::int64_t>(sequence.size()) - 1;
      s = *requests.state(t);
      if (p >= s->kv_from + s->reserved_tokens) {
        computing.unlock();  // grow takes the memory lock exclusively
        if (!requests.grow(t, 2)) {
          (void)requests.abort(t);
          return false;
        }
        ++grows;
        computing.lock();
        load_tables(t, kv);  // pages may have moved while the lock was free
      }
      forward(m, sequence, p, p + 1, gdn_form::recurrent, kv, states, nullptr, logits);
      out.logits.push_back(logits);
    }
    // The state after the whole sequence goes into the end slot (the last one).
    s = *requests.state(t);
    const auto& end_slot = s->checkpoints[s->plan.sites.size()];  // after the sites (a loaded slot may follow)
    for (int l = 0; l < kGdnLayers; ++l)
      std::memcpy(address(end_slot.handle.blocks[static_cast<std::size_t>(l)]), states[static_cast<std::size_t>(l)].data(),
                  kStateFloats * sizeof(float));
    captured.push_back(static_cast<std::int64_t>(sequence.size()));
    computing.unlock();  // finish takes the memory lock exclusively
    auto f = requests.finish(t, sequence, captured);
    if (!f) throw hc::invalid_argument("finish failed: " + f.message());
    return true;
  }
};

/// max_i |a_i - b_i| / max_i |b_i|
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

// ---- --sparsify-eval: CaR's sparsification served for real, and what it costs in quality ----
//
// Calibration: prompts of kCalTokens random tokens run through the model once; every
// attention row (one query head's softmax weights over its keys, >= 16 keys) adds its
// sparsity (weights below 1 % of the row maximum) to its layer's mean: the measured profile.
// Evaluation, per prompt: a prefix of kEvalPrefix tokens is prefilled into an entry of a
// tiered_store (HBM + host, pages of 16 tokens in a host_copy_engine's arenas), H2O scores
// accumulated on the way (the attention each position received). The dense reference
// demotes it whole (move_entry), loads it back and continues (kEvalSuffix new prompt tokens,
// then kEvalDecode greedy tokens) with the runtime's own attention loop through the block
// table. Each setting prefills the same prefix into a fresh entry, demotes it sparsified
// (move_sparsified: only the kept rows are copied; the host tier holds the packed pages),
// loads the packed entry back as it is and continues with the dense run's tokens (teacher
// forcing), attention reading the kept rows through the packed entry's block table
// (sparse_kv_view, attend_rows) and the new tokens' own slots. The GDN state at the prefix's
// end is the checkpoint, never sparsified. Two baseline settings keep as many random tokens
// (the same recent window) instead of H2O's heavy hitters: what the score buys.
constexpr int kCalPrompts = 8, kCalTokens = 192;
constexpr int kEvalPrompts = 24, kEvalPrefix = 160, kEvalSuffix = 16, kEvalDecode = 16;
constexpr std::int64_t kEvalRecentWindow = 8;
constexpr double kEvalLinkGbps = 50.0;  // the host tier's link (tier_config's default)

/// What an evaluation's attention saw: H2O scores per position, calibration rows, and each
/// computed token's attention output (all heads), per attention layer.
struct attention_record {
  std::array<std::vector<double>, kAttnLayers> accumulated;
  hc::tiered::sparsity_calibration* calibration = nullptr;
  std::array<std::vector<float>, kAttnLayers> outputs;
};

/// The evaluation's KV: [0, prefix_tokens) are a loaded entry's kept rows (`prefix`, none:
/// every position is this run's own), later tokens in this run's pages (`pages[l][p / 16]`).
struct eval_kv {
  const hc::tiered::sparse_kv_view* prefix = nullptr;
  std::int64_t prefix_tokens = 0;
  std::array<std::vector<float*>, kAttnLayers> pages;
  attention_record* rec = nullptr;
  std::vector<const float*> rows;
  std::vector<float> weights;

  float* slot(int layer, std::int64_t p) {
    const auto& t = pages[static_cast<std::size_t>(layer)];
    const auto b = static_cast<std::size_t>(p / kTokensPerPage);
    if (p < (prefix ? prefix_tokens : 0) || b >= t.size() || t[b] == nullptr) throw hc::invalid_argument("eval_kv: no slot for position");
    return t[b] + (p % kTokensPerPage) * kSlotFloats;
  }
  float* write_slot(int layer, std::int64_t p) { return slot(layer, p); }
  void attend(int layer, std::int64_t pos, const float* q, int kv_head, float scale, float* out) {
    const auto l = static_cast<std::size_t>(layer);
    rows.clear();
    if (prefix != nullptr)
      for (std::int64_t i = 0; i < prefix->kept(l); ++i) rows.push_back(reinterpret_cast<const float*>(prefix->row(l, i)));
    for (std::int64_t p = prefix ? prefix_tokens : 0; p <= pos; ++p) rows.push_back(slot(layer, p));
    weights.resize(rows.size());
    hc::tiered::attend_rows({q, kHeadDim}, rows, {.kv_heads = kKvHeads, .head_dim = kHeadDim}, kv_head, scale, {out, kHeadDim},
                            weights);
    if (rec == nullptr) return;
    if (rec->calibration != nullptr) rec->calibration->add_row(l, std::span<const float>(weights));
    if (prefix == nullptr) {  // H2O: the attention each position received, over heads and queries
      auto& acc = rec->accumulated[l];
      if (acc.size() < weights.size()) acc.resize(weights.size(), 0.0);
      for (std::size_t p = 0; p < weights.size(); ++p) acc[p] += weights[p];
    }
  }
  void observe(int layer, std::int64_t, const float* o) {
    if (rec != nullptr) rec->outputs[static_cast<std::size_t>(layer)].insert(rec->outputs[static_cast<std::size_t>(layer)].end(), o, o + kHeads * kHeadDim);
  }
};

/// The dense reference's KV: the runtime's own paged attention, recording each output.
struct observed_paged_kv : paged_kv {
  attention_record* rec = nullptr;
  void observe(int layer, std::int64_t, const float* o) {
    rec->outputs[static_cast<std::size_t>(layer)].insert(rec->outputs[static_cast<std::size_t>(layer)].end(), o, o + kHeads * kHeadDim);
  }
};

std::vector<token_id> random_tokens(prng& r, int n) {
  std::vector<token_id> v(static_cast<std::size_t>(n));
  for (auto& t : v) t = static_cast<token_id>(r.below(kVocab));
  return v;
}

/// Pages of this run's own tokens: `pages` pages per layer from `buffer` (grown to fit),
/// placed at block-table entries [first, first + pages).
void add_own_pages(std::array<std::vector<float*>, kAttnLayers>& table, std::vector<float>& buffer, std::int64_t first,
                   std::int64_t pages) {
  buffer.assign(static_cast<std::size_t>(kAttnLayers * pages * kTokensPerPage * kSlotFloats), 0.0f);
  for (int l = 0; l < kAttnLayers; ++l) {
    auto& t = table[static_cast<std::size_t>(l)];
    t.resize(static_cast<std::size_t>(first + pages), nullptr);
    for (std::int64_t b = 0; b < pages; ++b)
      t[static_cast<std::size_t>(first + b)] = buffer.data() + ((l * pages + b) * kTokensPerPage * kSlotFloats);
  }
}

/// A continuation after the prefix: the suffix prompt, then `decode` tokens (greedy, or the
/// given ones: teacher forcing). The logits after each step and the tokens fed.
struct continuation {
  std::vector<std::vector<float>> logits;
  std::vector<token_id> sequence;
};
template <class KV>
continuation continue_after(const model& m, std::vector<token_id> sequence, std::span<const token_id> forced, KV& kv,
                            std::array<std::vector<float>, kGdnLayers> states) {
  continuation c;
  std::vector<float> logits;
  forward(m, sequence, kEvalPrefix, static_cast<std::int64_t>(sequence.size()), gdn_form::chunked, kv, states, nullptr, logits);
  c.logits.push_back(logits);
  for (int i = 0; i < kEvalDecode; ++i) {
    sequence.push_back(forced.empty() ? argmax(logits) : forced[static_cast<std::size_t>(i)]);
    const auto p = static_cast<std::int64_t>(sequence.size()) - 1;
    forward(m, sequence, p, p + 1, gdn_form::recurrent, kv, states, nullptr, logits);
    c.logits.push_back(logits);
  }
  c.sequence = std::move(sequence);
  return c;
}

/// One setting's totals over the prompts.
struct sparsify_row {
  std::string name;
  std::vector<double> keep;  // per layer (the ratio asked; 1 - sparsity)
  bool random_tokens = false;  // the baseline: random tokens instead of H2O's heavy hitters (same window)
  std::int64_t kept_rows = 0, rows = 0, dense_bytes = 0, packed_bytes = 0, copied_bytes = 0, spans = 0, table_bytes = 0;
  std::array<double, kAttnLayers> err_num{}, err_den{};
  std::array<double, kAttnLayers> err_max{};
  std::int64_t agree = 0, predictions = 0, identical_prompts = 0, bit_identical = 0;
  double max_logit_rel = 0.0;
  bool bytes_ok = true;
};

struct eval_setup {
  const model& m;
  hc::tiered::tiered_store<>& store;
  hc::tiered::host_copy_engine& engine;
  std::uint64_t next_id = 1;
};

/// Prefills the prefix into a new HBM entry of the store (layer-major pages); returns its id,
/// the GDN states after it and the H2O scores.
hc::entry_id prefill_entry(eval_setup& e, std::span<const token_id> prefix, std::array<std::vector<float>, kGdnLayers>& states,
                           attention_record& rec) {
  const std::int64_t per_layer = kEvalPrefix / kTokensPerPage, page = e.engine.page_bytes();
  const hc::entry_id id = hc::make_entry_id(e.next_id++);
  if (!e.store.insert(id, kAttnLayers * per_layer * page, hc::hbm_tier)) throw hc::invalid_argument("eval: HBM insert failed");
  const auto row = e.store.find(id);
  eval_kv kv;
  kv.rec = &rec;
  for (int l = 0; l < kAttnLayers; ++l)
    for (std::int64_t b = 0; b < per_layer; ++b)
      kv.pages[static_cast<std::size_t>(l)].push_back(
          reinterpret_cast<float*>(e.engine.base(hc::hbm_tier) + static_cast<std::int64_t>(row->copies.front().pages.page(l * per_layer + b)) * page));
  for (auto& s : states) s.assign(kStateFloats, 0.0f);
  std::vector<float> logits;
  forward(e.m, prefix, 0, kEvalPrefix, gdn_form::chunked, kv, states, nullptr, logits);
  return id;
}

/// The dense reference of one prompt: its prefix demoted whole and loaded back, then the
/// continuation through the runtime's own attention loop (greedy).
struct dense_reference {
  continuation c;
  attention_record rec;
  std::int64_t host_bytes = 0;
};

dense_reference run_dense(eval_setup& e, const std::vector<token_id>& prompt) {
  namespace ht = hc::tiered;
  dense_reference d;
  std::array<std::vector<float>, kGdnLayers> states;
  attention_record pre;
  const auto id = prefill_entry(e, std::span(prompt).first(kEvalPrefix), states, pre);
  const std::int64_t host0 = e.store.usage(hc::tier_id{1}).used_bytes, per_layer = kEvalPrefix / kTokensPerPage;
  if (!ht::move_entry(e.store, e.engine, id, hc::tier_id{1})) throw hc::invalid_argument("eval: dense demotion failed");
  d.host_bytes = e.store.usage(hc::tier_id{1}).used_bytes - host0;
  if (!ht::move_entry(e.store, e.engine, id, hc::hbm_tier)) throw hc::invalid_argument("eval: dense load failed");
  const auto row = e.store.find(id);
  observed_paged_kv kv;
  kv.rec = &d.rec;
  for (int l = 0; l < kAttnLayers; ++l)
    for (std::int64_t b = 0; b < per_layer; ++b)
      kv.pages[static_cast<std::size_t>(l)].push_back(reinterpret_cast<float*>(
          e.engine.base(hc::hbm_tier) + static_cast<std::int64_t>(row->copies.front().pages.page(l * per_layer + b)) * e.engine.page_bytes()));
  std::vector<float> own;
  add_own_pages(kv.pages, own, per_layer, 3);
  d.c = continue_after(e.m, prompt, {}, kv, states);
  (void)e.store.erase(id);
  return d;
}

/// One prompt under one setting: the prefix prefilled again, demoted sparsified, loaded back
/// packed, the continuation teacher-forced on the dense run's tokens; adds to `row`.
void run_sparse(eval_setup& e, const std::vector<token_id>& prompt, const dense_reference& d, sparsify_row& row) {
  namespace ht = hc::tiered;
  std::array<std::vector<float>, kGdnLayers> states;
  attention_record pre;
  const auto id = prefill_entry(e, std::span(prompt).first(kEvalPrefix), states, pre);
  const ht::sparse_kv_shape shape{.layers = kAttnLayers, .tokens = kEvalPrefix, .tokens_per_page = kTokensPerPage,
                                  .row_bytes = kSlotFloats * static_cast<std::int64_t>(sizeof(float))};
  std::vector<std::vector<double>> acc(pre.accumulated.begin(), pre.accumulated.end());
  prng pick{0x5e1ec7u + e.next_id};
  if (row.random_tokens)
    for (auto& a : acc)
      for (auto& x : a) x = pick.uniform();
  const auto table = ht::select_sparse_kv(shape, row.keep, acc, {.recent_window = kEvalRecentWindow});
  const std::int64_t host0 = e.store.usage(hc::tier_id{1}).used_bytes;
  (void)e.engine.take_stats();
  if (!ht::move_sparsified(e.store, e.engine, id, hc::tier_id{1}, table)) throw hc::invalid_argument("eval: sparsified demotion failed");
  const auto copied = e.engine.take_stats();
  std::int64_t kept = 0;
  for (int l = 0; l < kAttnLayers; ++l) kept += table.kept(static_cast<std::size_t>(l));
  const std::int64_t host_bytes = e.store.usage(hc::tier_id{1}).used_bytes - host0;
  row.bytes_ok = row.bytes_ok && host_bytes == table.packed_bytes() && copied.bytes == kept * shape.row_bytes;
  row.kept_rows += kept;
  row.rows += kAttnLayers * kEvalPrefix;
  row.dense_bytes += d.host_bytes;
  row.packed_bytes += host_bytes;
  row.copied_bytes += copied.bytes;
  row.spans += copied.transfers;
  row.table_bytes += table.table_bytes();
  if (!ht::move_entry(e.store, e.engine, id, hc::hbm_tier)) throw hc::invalid_argument("eval: packed load failed");
  const auto home = e.store.find(id);
  const ht::sparse_kv_view view(table, ht::page_addresses(e.engine.base(hc::hbm_tier), e.engine.page_bytes(), home->copies.front().pages));
  eval_kv kv;
  attention_record rec;
  kv.prefix = &view;
  kv.prefix_tokens = kEvalPrefix;
  kv.rec = &rec;
  std::vector<float> own;
  for (auto& t : kv.pages) t.assign(kEvalPrefix / kTokensPerPage, nullptr);  // the prefix is read through the view
  add_own_pages(kv.pages, own, kEvalPrefix / kTokensPerPage, 3);
  const auto forced = std::span(d.c.sequence).subspan(prompt.size());
  const continuation c = continue_after(e.m, prompt, forced, kv, states);
  (void)e.store.erase(id);
  // Quality against the dense reference.
  bool all_agree = true;
  for (std::size_t i = 0; i < c.logits.size(); ++i) {
    const bool same = argmax(c.logits[i]) == argmax(d.c.logits[i]);
    row.agree += same ? 1 : 0;
    all_agree = all_agree && same;
    row.max_logit_rel = std::max(row.max_logit_rel, rel_diff(c.logits[i], d.c.logits[i]));
  }
  row.predictions += static_cast<std::int64_t>(c.logits.size());
  row.identical_prompts += all_agree ? 1 : 0;
  row.bit_identical += c.logits == d.c.logits && rec.outputs == d.rec.outputs ? 1 : 0;
  for (std::size_t l = 0; l < kAttnLayers; ++l) {
    double num = 0.0, den = 0.0;
    const auto& a = rec.outputs[l];
    const auto& b = d.rec.outputs[l];
    if (a.size() != b.size()) throw hc::invalid_argument("eval: attention outputs differ in count");
    for (std::size_t i = 0; i < a.size(); ++i) {
      num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      den += static_cast<double>(b[i]) * b[i];
    }
    row.err_num[l] += num;
    row.err_den[l] += den;
    row.err_max[l] = std::max(row.err_max[l], den > 0 ? std::sqrt(num / den) : 0.0);
  }
}

/// The measured profile: every attention row of the calibration prompts.
hc::tiered::sparsity_profile calibrate(const model& m, std::array<std::int64_t, kAttnLayers>& rows) {
  hc::tiered::sparsity_calibration cal(kAttnLayers);
  prng r{0xca11'b4a7'e5u};
  for (int i = 0; i < kCalPrompts; ++i) {
    const auto prompt = random_tokens(r, kCalTokens);
    eval_kv kv;
    attention_record rec;
    rec.calibration = &cal;
    kv.rec = &rec;
    std::vector<float> own;
    add_own_pages(kv.pages, own, 0, kCalTokens / kTokensPerPage);
    std::array<std::vector<float>, kGdnLayers> states;
    for (auto& s : states) s.assign(kStateFloats, 0.0f);
    std::vector<float> logits;
    forward(m, prompt, 0, kCalTokens, gdn_form::chunked, kv, states, nullptr, logits);
  }
  for (std::size_t l = 0; l < kAttnLayers; ++l) rows[l] = cal.rows(l);
  return cal.profile();
}

void print_sparsify_row(const sparsify_row& r, int prompts) {
  const double saved = 1.0 - static_cast<double>(r.packed_bytes) / static_cast<double>(r.dense_bytes);
  const double saved_us = static_cast<double>(r.dense_bytes - r.packed_bytes) / prompts / (kEvalLinkGbps * 1e3);
  std::printf("  %-26s keep", r.name.c_str());
  for (double k : r.keep) std::printf(" %.3f", k);
  std::printf(" | kept %5.1f%% of rows | host bytes/entry %6lld -> %6lld (-%4.1f%%, %.2f us less at %.0f GB/s), %5.1f copies/demotion |"
              " attn out rel err",
              100.0 * static_cast<double>(r.kept_rows) / static_cast<double>(r.rows), static_cast<long long>(r.dense_bytes / prompts),
              static_cast<long long>(r.packed_bytes / prompts), 100.0 * saved, saved_us, kEvalLinkGbps,
              static_cast<double>(r.spans) / prompts);
  for (std::size_t l = 0; l < kAttnLayers; ++l)
    std::printf(" L%zu %.4f (max %.4f)", l, r.err_den[l] > 0 ? std::sqrt(r.err_num[l] / r.err_den[l]) : 0.0, r.err_max[l]);
  std::printf(" | next-token agreement %5.1f%% (%lld/%lld), %d/%d continuations identical, %lld bit-identical, max logit rel diff %.3g%s\n",
              100.0 * static_cast<double>(r.agree) / static_cast<double>(r.predictions), static_cast<long long>(r.agree),
              static_cast<long long>(r.predictions), static_cast<int>(r.identical_prompts), prompts,
              static_cast<long long>(r.bit_identical), r.max_logit_rel, r.bytes_ok ? "" : " | BYTES WRONG");
}

bool sparsify_eval_of(const model& m, const char* label) {
  namespace ht = hc::tiered;
  const hc::cost_model spec(tiny_spec());
  const std::int64_t page = hc::memory::kv_page_bytes(spec, kTokensPerPage);
  const std::vector<ht::tier_config> tiers{{.kind = ht::tier_kind::hbm, .capacity_bytes = 64 * page},
                                           {.kind = ht::tier_kind::host, .capacity_bytes = 64 * page, .link_gbps = kEvalLinkGbps}};
  ht::tiered_store<> store(tiers, page);
  ht::host_copy_engine engine(tiers, page, {.measure_bandwidth = false});
  eval_setup e{m, store, engine};
  std::array<std::int64_t, kAttnLayers> cal_rows{};
  const auto profile = calibrate(m, cal_rows);
  const auto car = ht::sparsity_profile::car_linear(kAttnLayers);
  std::vector<sparsify_row> rows;
  auto add = [&](std::string name, std::vector<double> keep) { rows.push_back({.name = std::move(name), .keep = std::move(keep)}); };
  add("dense (keep 100%)", {1.0, 1.0});
  add("keep 50%", {0.5, 0.5});
  add("keep 25%", {0.25, 0.25});
  add("keep 10%", {0.10, 0.10});
  add("keep 50%, random tokens", {0.5, 0.5});
  rows.back().random_tokens = true;
  add("keep 25%, random tokens", {0.25, 0.25});
  rows.back().random_tokens = true;
  add("measured profile", {profile.keep_ratio(0), profile.keep_ratio(1)});
  add("CaR linear 60%->95% sparse", {car.keep_ratio(0), car.keep_ratio(1)});
  prng r{0xe7a1'5eedu};
  for (int i = 0; i < kEvalPrompts; ++i) {
    const auto prompt = random_tokens(r, kEvalPrefix + kEvalSuffix);
    const dense_reference d = run_dense(e, prompt);
    for (auto& row : rows) run_sparse(e, prompt, d, row);
  }
  std::printf("sparsify-eval, %s: %d prompts of %d prefix tokens (demoted to the host tier, loaded back), then %d prompt and %d decoded "
              "tokens; H2O selection with a recent window of %lld\n",
              label, kEvalPrompts, kEvalPrefix, kEvalSuffix, kEvalDecode, static_cast<long long>(kEvalRecentWindow));
  std::printf("calibration: %d prompts x %d tokens, %lld / %lld attention rows; measured sparsity (weights < 1%% of the row max) "
              "L0 %.3f L1 %.3f\n",
              kCalPrompts, kCalTokens, static_cast<long long>(cal_rows[0]), static_cast<long long>(cal_rows[1]), profile.sparsity[0],
              profile.sparsity[1]);
  for (const auto& row : rows) print_sparsify_row(row, kEvalPrompts);
  bool ok = rows.front().bit_identical == kEvalPrompts;
  for (const auto& row : rows) ok = ok && row.bytes_ok;
  std::printf("sparsify-eval, %s: %s\n", label,
              ok ? "keep 100% is bit-identical to the dense cache; every packed entry held and copied exactly its kept rows"
                 : "FAILED (keep 100% differs from the dense cache, or a packed entry's bytes are wrong)");
  return ok;
}

/// The runtime's model, whose random weights give nearly uniform attention (the measured
/// profile keeps every token), and the same model with its attention query weights scaled
/// by kPeakedQueryScale: peaked attention, as a trained model's heads have (CaR measures
/// 60-95 % sparsity), so the measured profile drops tokens. The rest of the model is the same.
constexpr float kPeakedQueryScale = 16.0f;
int run_sparsify_eval() {
  const model m(0x5eed'7417'4b1du);  // the runtime's weights
  model peaked = m;
  for (int l = 0; l < kLayers; ++l)
    if (is_attention(l))
      for (auto& w : peaked.layers[static_cast<std::size_t>(l)].wq) w *= kPeakedQueryScale;
  const bool a = sparsify_eval_of(m, "the runtime's model");
  const bool b = sparsify_eval_of(peaked, "query weights x16 (peaked attention)");
  return a && b ? 0 : 1;
}

// ---- the workload -------------------------------------------------------------------------------
struct session {
  std::vector<token_id> history;        // everything said so far (prompts and outputs)
  std::vector<std::int64_t> turn_ends;  // history length after each turn
};

struct request {
  std::vector<token_id> prompt;
  int decode = 0;
  int session = -1;    // the session it continues (-1: a new one)
  bool branch = false; // continues a copy of the session cut at an earlier turn
};

}  // namespace

struct run_options {
  int threads = 1;
  int requests = kDefaultRequests;
  long host_tier_bytes = 256 << 10;  // 0: no host tier
};

static int run(const run_options& options) {
  const int kRequests = options.requests;
  const auto t0 = std::chrono::steady_clock::now();
  const hc::cost_model spec(tiny_spec());
  const model m(0x5eed'7417'4b1du);

  // 1 MiB shared by KV pages (16 tokens x 256 B) and checkpoint blocks (one GDN layer's state,
  // 8 KiB), in 32 KiB chunks that the threshold rebalancer moves between the two sides.
  pool_t pool({.capacity_bytes = std::uint64_t{1} << 20, .kv_page_bytes = hc::memory::kv_page_bytes(spec, kTokensPerPage),
               .ssm_block_bytes = hc::memory::checkpoint_block_bytes(spec), .granularity_bytes = 32 << 10,
               .compaction = true},
              hc::memory::threshold_rebalancer({.threshold_low = 0.02, .threshold_high = 0.10, .migration_batch_size = 8,
                                                .min_rebalance_interval_ops = 0, .size_to_demand = true}));
  if (pool.stats(hc::pool_kind::kv).unit_bytes != kTokensPerPage * kSlotFloats * sizeof(float) ||
      pool.stats(hc::pool_kind::ssm).unit_bytes != kStateFloats * sizeof(float)) {
    std::printf("unexpected unit sizes\n");
    return 1;
  }
  int identical = 0, bit_identical = 0, misses = 0, served = 0, retries = 0;
  double max_rel = 0.0;
  std::int64_t prompt_tokens = 0, reused_tokens = 0, evictions = 0;
  std::uint64_t rebalances = 0, units_moved = 0;
  hc::stores::host_tier_counters host_counters;
  std::int64_t grows = 0, sites_captured = 0, rolled_forward = 0;
  {
    // The host tier: half its bytes for KV pages, half for checkpoint blocks.
    const auto page_bytes = static_cast<long>(pool.stats(hc::pool_kind::kv).unit_bytes);
    const auto block_bytes = static_cast<long>(pool.stats(hc::pool_kind::ssm).unit_bytes);
    const hc::stores::host_tier_config host{.kv_pages = options.host_tier_bytes / 2 / page_bytes,
                                            .checkpoint_blocks = options.host_tier_bytes / 2 / block_bytes};
    cache_t cache(spec, store_t(pool, spec, {.tokens_per_page = kTokensPerPage, .host_tier = host}), hc::prefix::lru_scorer{});
    lifecycle_t requests(cache);
    runtime rt{m, pool, requests};

    prng wl{42};
    auto words = [&](int n) {
      std::vector<token_id> v(static_cast<std::size_t>(n));
      for (auto& t : v) t = static_cast<token_id>(wl.below(kVocab));
      return v;
    };
    const std::vector<token_id> system_prompt = words(40);
    std::vector<session> sessions;
    auto make_request = [&] {
      request r;
      r.decode = 3 + wl.below(6);  // 3..8 tokens: many pass the 4 reserved and grow
      const double u = wl.uniform();
      if (sessions.empty() || u < 0.15) {
        r.prompt = system_prompt;
      } else {
        // Mostly recent sessions (a chat service's working set), sometimes an old one.
        const int n = static_cast<int>(sessions.size());
        r.session = wl.uniform() < 0.8 ? n - 1 - wl.below(std::min(n, 6)) : wl.below(n);
        const session& s = sessions[static_cast<std::size_t>(r.session)];
        std::int64_t cut = static_cast<std::int64_t>(s.history.size());
        if (u < 0.35 && s.turn_ends.size() > 1) {  // branch at an earlier turn
          r.branch = true;
          cut = s.turn_ends[static_cast<std::size_t>(wl.below(static_cast<int>(s.turn_ends.size()) - 1))];
        }
        if (cut > 220) {  // long enough: start over from the system prompt
          r.session = -1;
          r.branch = false;
          cut = static_cast<std::int64_t>(system_prompt.size());
          r.prompt = system_prompt;
        } else {
          r.prompt.assign(s.history.begin(), s.history.begin() + static_cast<std::ptrdiff_t>(cut));
        }
      }
      const auto msg = words(8 + wl.below(25));
      r.prompt.insert(r.prompt.end(), msg.begin(), msg.end());
      return r;
    };

    std::vector<request> pending;
    while (served < kRequests) {
      // Admit up to kMaxInFlight requests, then serve them one after another.
      std::vector<std::pair<hc::prefix::request_ticket, request>> batch;
      while (static_cast<int>(batch.size()) < kMaxInFlight && served + static_cast<int>(batch.size()) < kRequests) {
        request r = pending.empty() ? make_request() : pending.back();
        auto t = requests.begin(r.prompt, {.output_tokens = kReservedOutput});
        if (!t) {
          if (t.error() != hc::errc::out_of_capacity || batch.empty()) {
            std::printf("begin refused with nothing in flight: %s\n", t.message().c_str());
            return 1;
          }
          if (pending.empty()) pending.push_back(std::move(r));
          break;
        }
        if (!pending.empty()) pending.pop_back();
        batch.emplace_back(*t, std::move(r));
      }
      // Serve the batch: one thread per request with --threads > 1, else one after another.
      struct served_request {
        std::int64_t reused = 0;
        bool ok = false;
        run_result cached;
        std::vector<token_id> sequence;
        std::exception_ptr error;
      };
      std::vector<served_request> results(batch.size());
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const auto* s = *requests.state(batch[i].first);
        results[i].reused = s->plan.prefill_start;  // the pool hit, or the host hit loaded at begin
        for (const auto& site : s->plan.sites) {
          ++sites_captured;
          rolled_forward += site.roll_forward > 0 ? 1 : 0;
        }
      }
      auto serve_one = [&](std::size_t i) {
        try {
          results[i].ok = rt.serve(batch[i].first, batch[i].second.prompt, batch[i].second.decode, results[i].cached,
                                   results[i].sequence);
        } catch (...) {
          results[i].error = std::current_exception();
        }
      };
      if (options.threads > 1) {
        std::vector<std::thread> workers;
        for (std::size_t i = 0; i < batch.size(); ++i) workers.emplace_back(serve_one, i);
        for (auto& w : workers) w.join();
      } else {
        for (std::size_t i = 0; i < batch.size(); ++i) serve_one(i);
      }
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (results[i].error) std::rethrow_exception(results[i].error);
        request& r = batch[i].second;
        const std::int64_t reused = results[i].reused;
        run_result& cached = results[i].cached;
        std::vector<token_id>& sequence = results[i].sequence;
        if (!results[i].ok) {
          ++retries;
          pending.push_back(r);
          continue;
        }
        ++served;
        prompt_tokens += static_cast<std::int64_t>(r.prompt.size());
        reused_tokens += reused;
        misses += reused == 0 ? 1 : 0;
        // The same request with no cache at all.
        const run_result ref = run_uncached(m, r.prompt, r.decode);
        bool same = cached.output == ref.output && cached.logits.size() == ref.logits.size();
        bool bits = same;
        double worst = 0.0;
        for (std::size_t i = 0; same && i < ref.logits.size(); ++i) {
          worst = std::max(worst, rel_diff(cached.logits[i], ref.logits[i]));
          bits = bits && cached.logits[i] == ref.logits[i];
        }
        max_rel = std::max(max_rel, worst);
        same = same && worst <= kTolerance && (reused > 0 || bits);
        identical += same ? 1 : 0;
        bit_identical += bits ? 1 : 0;
        if (!same)
          std::printf("request %d: MISMATCH (reused %lld of %zu prompt tokens, max relative logit difference %.3g)\n",
                      served, static_cast<long long>(reused), r.prompt.size(), worst);
        // The conversation goes on from what the cached run said.
        session next;
        if (r.session >= 0) {
          const session& base = sessions[static_cast<std::size_t>(r.session)];
          next.turn_ends = base.turn_ends;
          while (!next.turn_ends.empty() && next.turn_ends.back() > static_cast<std::int64_t>(r.prompt.size())) next.turn_ends.pop_back();
        }
        next.history = sequence;
        next.turn_ends.push_back(static_cast<std::int64_t>(sequence.size()));
        if (r.session >= 0 && !r.branch) sessions[static_cast<std::size_t>(r.session)] = std::move(next);
        else sessions.push_back(std::move(next));
      }
    }
    evictions = cache.counters().evictions;
    rebalances = pool.counters().rebalances;
    units_moved = pool.counters().units_moved;
    grows = rt.grows.load();
    host_counters = cache.store().host_counters();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("details: %d misses, %d requests with bit-identical logits, max relative logit difference %.3g (tolerance %.0e), "
              "%lld states captured at planned sites (%lld mid-chunk, rolled forward), %llu rebalances (%llu live units moved), %lld grows, %d retried, "
              "%llu pool handles left, %.1f s\n",
              misses, bit_identical, max_rel, kTolerance, static_cast<long long>(sites_captured),
              static_cast<long long>(rolled_forward), static_cast<unsigned long long>(rebalances),
              static_cast<unsigned long long>(units_moved),
              static_cast<long long>(grows), retries, static_cast<unsigned long long>(pool.live_handles()), seconds);
  if (options.host_tier_bytes > 0)
    std::printf("host tier: %ld bytes, %lld leaves demoted (%lld dropped), %lld host entries evicted, %lld tokens and %lld "
                "checkpoints loaded back\n",
                options.host_tier_bytes, static_cast<long long>(host_counters.demotions),
                static_cast<long long>(host_counters.demotions_dropped), static_cast<long long>(host_counters.host_evictions),
                static_cast<long long>(host_counters.tokens_loaded), static_cast<long long>(host_counters.checkpoints_loaded));
  std::printf("identical outputs: %d/%d requests; reused %.1f%% of prompt tokens; host loads %lld; evictions %lld\n", identical,
              served, 100.0 * static_cast<double>(reused_tokens) / static_cast<double>(prompt_tokens),
              static_cast<long long>(host_counters.loads), static_cast<long long>(evictions));
  const bool host_ok = options.host_tier_bytes == 0 || (host_counters.loads > 0 && host_counters.demotions > 0);
  const bool ok = identical == served && served == kRequests && evictions > 0 && rebalances > 0 && pool.live_handles() == 0 &&
                  host_ok;
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--sparsify-eval") {  // its own program: docs/tiered.md
    try {
      return run_sparsify_eval();
    } catch (const std::exception& e) {
      std::printf("tiny_hybrid_runtime --sparsify-eval: %s\n", e.what());
      return 1;
    }
  }
  run_options options;
  for (int i = 1; i < argc; ++i) {  // --threads N (1..16), --requests N (1..100000), --host-tier BYTES (0..1 GiB)
    const std::string arg = argv[i];
    long host_bytes = 0;
    long* host_target = arg == "--host-tier" ? &host_bytes : nullptr;
    int* target = arg == "--threads" ? &options.threads : arg == "--requests" ? &options.requests : nullptr;
    if (host_target != nullptr) {
      char* end = nullptr;
      const long v = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : -1;
      if (end == nullptr || *end != '\0' || end == argv[i + 1] || v < 0 || v > (1L << 30)) {
        std::fprintf(stderr, "tiny_hybrid_runtime: --host-tier takes a byte count in 0..1073741824 (got '%s')\n",
                     i + 1 < argc ? argv[i + 1] : "");
        return 2;
      }
      options.host_tier_bytes = v;
      ++i;
      continue;
    }
    const int hi = arg == "--threads" ? 16 : 100000;
    char* end = nullptr;
    const long v = (target != nullptr && i + 1 < argc) ? std::strtol(argv[i + 1], &end, 10) : 0;
    if (target == nullptr || end == nullptr || *end != '\0' || end == argv[i + 1] || v < 1 || v > hi) {
      std::fprintf(stderr,
                   "tiny_hybrid_runtime: usage: [--threads 1..16] [--requests 1..100000] [--host-tier BYTES] (bad argument '%s')\n",
                   argv[i]);
      return 2;
    }
    *target = static_cast<int>(v);
    ++i;
  }
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::printf("tiny_hybrid_runtime: %s\n", e.what());
    return 1;
  }
}
