// examples/llama_cpp/engine_impl.hpp
//
// The engine of engine.hpp for one cache type: slots, the scheduler, and the copies between
// llama.cpp's states and the pool. Included at the end of engine.hpp.
#pragma once

#include <cmath>
#include <numeric>

#include "engine.hpp"

namespace hybridcache_llama {

namespace detail {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// Greedy choice over a logit row (the first of equal maxima, as llama.cpp's greedy sampler).
inline llama_token argmax(const float* logits, std::int32_t n) {
  std::int32_t best = 0;
  for (std::int32_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

/// Log-softmax of `token`, the row's greedy choice (`argmax`: its logit is the row's maximum),
/// and of the `top` most likely tokens of the row (sums in double).
inline token_logprobs logprobs_of(const float* logits, std::int32_t n, llama_token token, std::int32_t top) {
  const float max = logits[token];
  double sum = 0;
  for (std::int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = static_cast<double>(max) + std::log(sum);
  token_logprobs out;
  out.logprob = static_cast<float>(logits[token] - log_z);
  // The best `top`, kept in a small vector sorted best first (top is at most a few dozen).
  auto better = [](const std::pair<llama_token, float>& a, const std::pair<llama_token, float>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  const auto k = static_cast<std::size_t>(std::min(top, n));
  out.top.reserve(k + 1);
  for (std::int32_t i = 0; i < n && k > 0; ++i) {
    const std::pair<llama_token, float> c{i, logits[i]};
    if (out.top.size() == k && !better(c, out.top.back())) continue;
    out.top.insert(std::upper_bound(out.top.begin(), out.top.end(), c, better), c);
    if (out.top.size() > k) out.top.pop_back();
  }
  for (auto& [id, v] : out.top) v = static_cast<float>(v - log_z);
  return out;
}

/// A llama_batch that owns its arrays (one sequence id per token).
class batch {
 public:
  explicit batch(std::int32_t capacity) : b_(llama_batch_init(capacity, 0, 1)), capacity_(capacity) {}
  ~batch() { llama_batch_free(b_); }
  batch(const batch&) = delete;
  batch& operator=(const batch&) = delete;
  void clear() noexcept { b_.n_tokens = 0; }
  /// Appends a token; returns its index (for llama_get_logits_ith).
  std::int32_t add(llama_token t, llama_pos pos, llama_seq_id seq, bool logits) noexcept {
    const std::int32_t i = b_.n_tokens++;
    b_.token[i] = t;
    b_.pos[i] = pos;
    b_.n_seq_id[i] = 1;
    b_.seq_id[i][0] = seq;
    b_.logits[i] = logits ? 1 : 0;
    return i;
  }
  [[nodiscard]] std::int32_t size() const noexcept { return b_.n_tokens; }
  [[nodiscard]] std::int32_t room() const noexcept { return capacity_ - b_.n_tokens; }
  [[nodiscard]] const llama_batch& get() const noexcept { return b_; }

 private:
  llama_batch b_;
  std::int32_t capacity_;
};

inline std::uint64_t align_block(std::uint64_t b) { return (b + 127) / 128 * 128; }

}  // namespace detail

inline uncached_result run_uncached(session& s, llama_seq_id seq, std::span<const llama_token> prompt, std::int32_t max_tokens) {
  llama_context* ctx = s.ctx();
  const std::int32_t n_vocab = llama_vocab_n_tokens(s.model().vocab());
  detail::batch b(static_cast<std::int32_t>(s.options().batch));
  uncached_result out;
  std::int32_t last = -1;
  for (std::size_t at = 0; at < prompt.size();) {
    b.clear();
    while (at < prompt.size() && b.room() > 0) {
      last = b.add(prompt[at], static_cast<llama_pos>(at), seq, at + 1 == prompt.size());
      ++at;
    }
    if (llama_decode(ctx, b.get()) != 0) throw hc::invalid_argument("llama_decode failed during an uncached prefill");
  }
  llama_pos pos = static_cast<llama_pos>(prompt.size());
  for (;;) {
    const float* logits = llama_get_logits_ith(ctx, last);
    out.logits.insert(out.logits.end(), logits, logits + n_vocab);
    const llama_token t = detail::argmax(logits, n_vocab);
    out.tokens.push_back(t);
    if (static_cast<std::int32_t>(out.tokens.size()) >= max_tokens || llama_vocab_is_eog(s.model().vocab(), t)) break;
    b.clear();
    last = b.add(t, pos++, seq, true);
    if (llama_decode(ctx, b.get()) != 0) throw hc::invalid_argument("llama_decode failed during an uncached decode");
  }
  llama_memory_seq_rm(s.memory(), seq, -1, -1);
  return out;
}

template <class Cache>
class cached_engine final : public engine {
 public:
  template <class Scorer>
  cached_engine(session& s, const hc::model_spec& spec, const cache_options& o, Scorer scorer, std::string name)
      : s_(s),
        model_(spec),
        opts_(o),
        name_(std::move(name)),
        lower_(open_lower_backend(o.shared)),
        pool_({.capacity_bytes = o.capacity_bytes,
               .kv_page_bytes = hc::memory::kv_page_bytes(model_, o.tokens_per_page),
               .ssm_block_bytes = hc::memory::checkpoint_block_bytes(model_),
               .granularity_bytes = hc::byte_count{2} << 20},
              hc::memory::threshold_rebalancer({.threshold_low = 0.02, .threshold_high = 0.10, .migration_batch_size = 8,
                                                .min_rebalance_interval_ops = 0, .size_to_demand = true})),
        cache_(model_, store_t(pool_, model_, {.tokens_per_page = o.tokens_per_page, .host_tier = host_tier(o)}), std::move(scorer)),
        requests_(cache_),
        slots_(s.options().slots),
        batch_(static_cast<std::int32_t>(s.options().batch)) {
    if (lower_) {
      if (o.weights_id.empty()) throw hc::invalid_argument("engine: a shared tier needs the weights' identity (weights_id)");
      shared_ = lower_->make_shared_tier(hc::tiered::model_identity(spec, o.weights_id), s_.layout());
    }
    // One token's K and V rows of one layer fill one page slot exactly. (llama.cpp's state
    // format sizes rows as uint64; the library's byte amounts are byte_count.)
    const hc::byte_count slot_bytes = pool_.stats(hc::pool_kind::kv).unit_bytes / o.tokens_per_page;
    if (slot_bytes != static_cast<hc::byte_count>(s_.layout().kv.front().token_bytes()))
      throw hc::invalid_argument("engine: a page slot is " + std::to_string(slot_bytes) + " B but a token's K+V rows are " +
                                 std::to_string(s_.layout().kv.front().token_bytes()) + " B");
    for (std::size_t i = 0; i < slots_.size(); ++i) slots_[i].seq = static_cast<llama_seq_id>(i);
    n_vocab_ = llama_vocab_n_tokens(s_.model().vocab());
  }

  void submit(request_input r) override {
    if (r.prompt.empty()) throw hc::invalid_argument("request " + std::to_string(r.id) + ": empty prompt");
    if (r.max_tokens < 1) throw hc::invalid_argument("request " + std::to_string(r.id) + ": max_tokens must be >= 1");
    const auto limit = static_cast<std::int64_t>(s_.options().ctx_per_slot);
    if (static_cast<std::int64_t>(r.prompt.size()) + r.max_tokens > limit)
      throw hc::invalid_argument("request " + std::to_string(r.id) + ": prompt of " + std::to_string(r.prompt.size()) +
                                 " tokens + max_tokens " + std::to_string(r.max_tokens) + " exceeds the context of " +
                                 std::to_string(limit) + " tokens per slot");
    queue_.push_back(std::move(r));
  }

  [[nodiscard]] std::size_t pending() const override {
    std::size_t n = queue_.size();
    for (const auto& sl : slots_) n += sl.phase != slot_phase::idle ? 1 : 0;
    return n;
  }

  [[nodiscard]] engine_stats stats() const override {
    engine_stats out = stats_;
    out.evictions = cache_.counters().evictions;
    const auto& h = cache_.store().host_counters();
    out.host_loads = h.loads;
    out.host_loaded_tokens = h.tokens_loaded;
    out.host_corrupt_dropped = h.corrupt_dropped;
    out.moved_down = h.moved_down;
    out.brought_up = h.brought_up;
    out.storage_dropped = h.storage_dropped;
    if (shared_) {
      out.shared = shared_->counters();
      out.shared_kind = opts_.shared.kind == shared_tier_options::kind_t::disk ? "disk" : "redis";
    }
    return out;
  }

  [[nodiscard]] std::string describe() const override {
    return name_ + ", pool " + std::to_string(opts_.capacity_bytes >> 20) + " MiB (KV page " +
           std::to_string(pool_.stats(hc::pool_kind::kv).unit_bytes) + " B, state block " +
           std::to_string(pool_.stats(hc::pool_kind::ssm).unit_bytes) + " B), host tier " +
           std::to_string(opts_.host_capacity_bytes >> 20) + " MiB" +
           (shared_ ? std::string(spills() ? " over " : ", ") + shared_->describe() : std::string());
  }

  /// Waits for the shared tier's stores in flight (so another process finds them).
  void drain() override {
    if (shared_) shared_->drain();
  }
  [[nodiscard]] bool has_shared_tier() const override { return shared_ != nullptr; }

  void step(std::vector<request_output>& done) override {
    admit(done);
    batch_.clear();
    for (auto& sl : slots_) plan_work(sl);
    if (batch_.size() == 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = llama_decode(s_.ctx(), batch_.get());
    stats_.decode_ms += detail::ms_since(t0);
    for (auto& sl : slots_) {
      if (sl.phase == slot_phase::idle || sl.take == 0) continue;
      if (rc != 0) {
        fail(sl, "llama_decode failed (" + std::to_string(rc) + ")", done);
        continue;
      }
      advance(sl, done);
    }
  }

 private:
  enum class slot_phase : std::uint8_t { idle, prefill, decode };
  struct slot {
    llama_seq_id seq = 0;
    slot_phase phase = slot_phase::idle;
    request_input in;
    request_output out;
    std::optional<hc::prefix::request_ticket> ticket;  ///< none: computed uncached
    std::vector<llama_token> fed;                      ///< tokens fed so far (prompt, then outputs)
    std::int64_t cur = 0;                              ///< next position to feed
    std::vector<std::int64_t> cuts;                    ///< positions a batch must end at (sites, then |prompt|)
    std::size_t next_cut = 0;
    std::vector<std::int64_t> captured;                ///< sites whose snapshot was taken
    std::vector<std::int64_t> shared_at;               ///< positions kept in the shared tier (ascending)
    std::int64_t take = 0;                             ///< tokens in this step's batch
    std::int32_t logits_at = -1;
    std::chrono::steady_clock::time_point t0;
  };

  // The host tier: half its bytes for KV pages, half for checkpoint blocks.
  hc::stores::host_tier_config host_tier(const cache_options& o) const {
    if (o.host_capacity_bytes == 0) return {};
    const hc::byte_count page = hc::memory::kv_page_bytes(model_, o.tokens_per_page);
    const hc::byte_count block = hc::memory::checkpoint_block_bytes(model_);
    const std::int64_t rec = model_.recurrent_layers();
    hc::stores::host_tier_config h{.kv_pages = o.host_capacity_bytes / 2 / page,
                                   .checkpoint_blocks = o.host_capacity_bytes / 2 / block / rec * rec};
    if (h.kv_pages == 0 || h.checkpoint_blocks == 0)
      throw hc::invalid_argument("--tiers host=" + std::to_string(o.host_capacity_bytes) + " B holds no page or no checkpoint (a checkpoint is " +
                                 std::to_string(block * rec) + " B)");
    if (lower_) {  // the host tier's victims move down into the disk or Redis tier
      h.storage_tiers.push_back(lower_->storage_tier());
      h.storage_io.push_back(lower_->storage_io());
    }
    return h;
  }

  // Whether the host tier moves its victims into the backend below it.
  [[nodiscard]] bool spills() const { return lower_ && opts_.host_capacity_bytes > 0; }

  void admit(std::vector<request_output>& done) {
    for (auto& sl : slots_) {
      if (sl.phase != slot_phase::idle || queue_.empty()) continue;
      request_input& r = queue_.front();
      if (opts_.flip_host_every > 0 && ++admitted_ % opts_.flip_host_every == 0) flip_host_bytes();
      // The prompt's end is where the next turn leaves this sequence (its prompt carries the
      // reply as the client re-renders it), so a state is kept there (an application-directed
      // checkpoint). A prompt cached whole is begun without its last token: logits need at
      // least one token computed, and a recurrent state cannot be rewound.
      const auto n = static_cast<std::int64_t>(r.prompt.size());
      std::span<const llama_token> lifecycle_prompt(r.prompt);
      extra_.clear();
      for (const std::int64_t p : r.checkpoints)
        if (p >= 1 && p < n) extra_.push_back(p);
      extra_.push_back(n);
      const std::int64_t local = cache_.peek(r.prompt, r.salt).reusable_tokens;
      if (local >= n) {
        lifecycle_prompt = lifecycle_prompt.first(static_cast<std::size_t>(n - 1));
        extra_.pop_back();
      }

      const std::span<const std::int64_t> extra(extra_);
      const std::int64_t outputs = r.max_tokens + (static_cast<std::int64_t>(lifecycle_prompt.size()) < n ? 1 : 0);
      auto t = requests_.begin(lifecycle_prompt, {.output_tokens = outputs, .extra_checkpoints = extra, .salt = r.salt});
      if (!t && t.error() == hc::errc::out_of_capacity && requests_.in_flight() > 0) {
        ++stats_.waits;  // the slots in flight hold the room: wait for one to finish
        return;
      }
      start(sl, std::move(r));
      queue_.pop_front();
      if (!t) {
        if (t.error() != hc::errc::out_of_capacity) {
          fail(sl, "begin: " + t.message(), done);
          continue;
        }
        ++stats_.uncached;  // no cache of this size could hold it: compute it without the cache
        sl.out.cached = false;
        sl.cuts.assign(1, static_cast<std::int64_t>(sl.in.prompt.size()));
        sl.phase = slot_phase::prefill;
        continue;
      }
      sl.ticket = *t;
      // The shared tier, asked once the request is admitted, for positions beyond the memory
      // tiers' hit (host loads included).
      hit_.tokens = 0;
      if (const std::int64_t from = (*requests_.state(*sl.ticket))->plan.prefill_start; shared_ && from < n - 1) {
        shared_positions(sl.in, shared_at_);
        shared_at_.pop_back();  // not the prompt's end: logits need one token computed
        shared_->lookup(sl.in.prompt, sl.in.salt, shared_at_, from, hit_);
      }
      if (!restore(sl)) {
        fail(sl, "restore: llama.cpp refused the rebuilt state", done);
        continue;
      }
      sl.phase = slot_phase::prefill;
    }
  }

  // Fault injection (cache_options::flip_host_every): one byte of every 7th page of host
  // memory (pages of gcd(KV page, SSM block) bytes: the host tier's allocation unit).
  void flip_host_bytes() {
    const std::size_t unit = std::gcd(pool_.stats(hc::pool_kind::kv).unit_bytes, pool_.stats(hc::pool_kind::ssm).unit_bytes);
    auto mem = cache_.store().host_memory();
    for (std::size_t at = (admitted_ * 131) % unit; at < mem.size(); at += 7 * unit) mem[at] ^= std::byte{0x10};
  }

  void start(slot& sl, request_input&& r) {
    sl.in = std::move(r);
    sl.out = request_output{};
    sl.out.id = sl.in.id;
    sl.out.prompt_tokens = static_cast<std::int64_t>(sl.in.prompt.size());
    sl.ticket.reset();
    sl.fed.assign(sl.in.prompt.begin(), sl.in.prompt.end());
    sl.cur = 0;
    sl.cuts.clear();
    sl.next_cut = 0;
    sl.captured.clear();
    sl.shared_at.clear();
    sl.take = 0;
    sl.t0 = std::chrono::steady_clock::now();
    llama_memory_seq_rm(s_.memory(), sl.seq, -1, -1);
  }

  // Writes the hit back into the slot's sequence and sets up the cuts. False when llama.cpp
  // refuses the state (the request is then failed and its reservation given back).
  bool restore(slot& sl) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto* st = *requests_.state(*sl.ticket);
    const std::int64_t r = st->plan.prefill_start, n = static_cast<std::int64_t>(sl.in.prompt.size());
    sl.cur = r;
    for (const auto& site : st->plan.sites) sl.cuts.push_back(site.position);
    if (sl.cuts.empty() || sl.cuts.back() != n) sl.cuts.push_back(n);
    sl.out.reused_tokens = r;
    sl.out.host_loaded_tokens = st->loaded_at > 0 ? st->loaded_at - st->match.reusable_tokens : 0;
    if (shared_) add_shared_cuts(sl);
    if (hit_.tokens > r) return restore_shared(sl, r, t0);
    if (r == 0) return true;
    const auto* resume = *requests_.resume_checkpoint(*sl.ticket);
    if (resume == nullptr) return false;  // a hit always has its state
    load_tables(sl);
    const auto& layout = s_.layout();
    const std::int64_t P = opts_.tokens_per_page;
    std::vector<std::int32_t> ids(sl.in.prompt.begin(), sl.in.prompt.begin() + r);
    write_full_state(
        layout, layout.streams == 1 ? 0 : static_cast<std::uint32_t>(sl.seq), ids,
        [&](std::int64_t p, std::size_t l, std::byte* k, std::byte* v) {
          const std::byte* slot_bytes = page_address(tables_[l][static_cast<std::size_t>(p / P)]) +
                                        static_cast<std::uint64_t>(p % P) * layout.kv[l].token_bytes();
          std::memcpy(k, slot_bytes, layout.kv[l].k_row);
          std::memcpy(v, slot_bytes + layout.kv[l].k_row, layout.kv[l].v_row);
        },
        [&](std::size_t i, std::byte* conv, std::byte* ssm) {
          const std::byte* b = page_address(resume->blocks[i]);
          std::memcpy(conv, b, layout.rec[i].r_row);
          std::memcpy(ssm, b + layout.rec[i].r_row, layout.rec[i].s_row);
        },
        state_buf_);
    return set_sequence(sl, t0);
  }

  // The rebuilt state in state_buf_ into the slot's sequence; false when llama.cpp does not
  // take every byte.
  bool set_sequence(const slot& sl, std::chrono::steady_clock::time_point t0) {
    const std::size_t got = llama_state_seq_set_data_ext(s_.ctx(), reinterpret_cast<const std::uint8_t*>(state_buf_.data()),
                                                         state_buf_.size(), sl.seq, 0);
    ++stats_.restores;
    stats_.restore_ms += detail::ms_since(t0);
    return got == state_buf_.size();
  }

  // The positions a request keeps in the shared tier (ascending): the application's (message
  // boundaries), the prompt's end, and the position before it (an identical prompt elsewhere
  // then computes one token).
  static void shared_positions(const request_input& r, std::vector<std::int64_t>& out) {
    const auto n = static_cast<std::int64_t>(r.prompt.size());
    out.clear();
    for (const std::int64_t p : r.checkpoints)
      if (p >= 1 && p < n - 1) out.push_back(p);
    if (r.earlier_end >= 1 && r.earlier_end < n - 1) out.push_back(r.earlier_end);
    if (n >= 2) out.push_back(n - 1);
    out.push_back(n);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }

  bool is_shared_position(const slot& sl, std::int64_t p) const {
    return std::binary_search(sl.shared_at.begin(), sl.shared_at.end(), p);
  }

  // Prefill stops at every shared position beyond where it starts, so the state there can be
  // read whole.
  void add_shared_cuts(slot& sl) {
    shared_positions(sl.in, sl.shared_at);
    for (const std::int64_t p : sl.shared_at)
      if (p > sl.cur) sl.cuts.push_back(p);
    std::sort(sl.cuts.begin(), sl.cuts.end());
    sl.cuts.erase(std::unique(sl.cuts.begin(), sl.cuts.end()), sl.cuts.end());
  }

  // The shared tier's hit [0, b) (deeper than the memory tiers' r) written into the slot's
  // sequence as one rebuilt state; prefill resumes at b. Sites at or before b are not
  // captured (this request computes nothing there); rows [kv_from, b) reach the pool at
  // finish like computed ones.
  bool restore_shared(slot& sl, std::int64_t r, std::chrono::steady_clock::time_point t0) {
    const std::int64_t b = hit_.tokens;
    sl.cur = b;
    sl.cuts.erase(sl.cuts.begin(), std::upper_bound(sl.cuts.begin(), sl.cuts.end(), b));
    sl.out.reused_tokens = b;
    sl.out.shared_loaded_tokens = b - r;
    const auto& layout = s_.layout();
    // Offsets of each layer's rows within one token's KV row and within the checkpoint value.
    std::vector<std::uint64_t> off(layout.kv.size() + 1, 0), roff(layout.rec.size(), 0);
    for (std::size_t l = 0; l < layout.kv.size(); ++l) off[l + 1] = off[l] + layout.kv[l].k_row + layout.kv[l].v_row;
    for (std::size_t i = 1; i < layout.rec.size(); ++i) roff[i] = roff[i - 1] + layout.rec[i - 1].r_row + layout.rec[i - 1].s_row;
    std::vector<std::int32_t> ids(sl.in.prompt.begin(), sl.in.prompt.begin() + b);
    write_full_state(
        layout, layout.streams == 1 ? 0 : static_cast<std::uint32_t>(sl.seq), ids,
        [&](std::int64_t p, std::size_t l, std::byte* k, std::byte* v) {
          const std::byte* row = hit_.kv.data() + static_cast<std::uint64_t>(p) * off.back() + off[l];
          std::memcpy(k, row, layout.kv[l].k_row);
          std::memcpy(v, row + layout.kv[l].k_row, layout.kv[l].v_row);
        },
        [&](std::size_t i, std::byte* conv, std::byte* ssm) {
          std::memcpy(conv, hit_.rec.data() + roff[i], layout.rec[i].r_row);
          std::memcpy(ssm, hit_.rec.data() + roff[i] + layout.rec[i].r_row, layout.rec[i].s_row);
        },
        state_buf_);
    return set_sequence(sl, t0);
  }

  // The slot's sequence holds [0, p) with the state after p - 1: into the shared tier.
  void store_shared(slot& sl, std::int64_t p) {
    const std::size_t size = llama_state_seq_get_size_ext(s_.ctx(), sl.seq, 0);
    shared_buf_.resize(size);
    if (llama_state_seq_get_data_ext(s_.ctx(), reinterpret_cast<std::uint8_t*>(shared_buf_.data()), size, sl.seq, 0) != size)
      throw hc::invalid_argument("llama.cpp: a sequence state could not be read for the shared tier");
    read_full_state(shared_buf_, s_.layout(), /*learn=*/false, shared_view_);
    if (static_cast<std::int64_t>(shared_view_.pos.size()) != p || shared_view_.rec_pos != p - 1)
      throw hc::invalid_argument("shared tier: the sequence holds " + std::to_string(shared_view_.pos.size()) + " cells at position " +
                                 std::to_string(p));
    shared_->store(sl.fed, sl.in.salt, p, shared_view_);
  }

  void plan_work(slot& sl) {
    sl.take = 0;
    sl.logits_at = -1;
    if (sl.phase == slot_phase::idle || batch_.room() == 0) return;
    if (sl.phase == slot_phase::decode) {
      sl.logits_at = batch_.add(sl.fed.back(), static_cast<llama_pos>(sl.cur), sl.seq, true);
      sl.take = 1;
      return;
    }
    const std::int64_t cut = sl.cuts[sl.next_cut];
    const std::int64_t take = std::min<std::int64_t>(cut - sl.cur, batch_.room());
    const auto n = static_cast<std::int64_t>(sl.in.prompt.size());
    for (std::int64_t i = 0; i < take; ++i) {
      const std::int64_t p = sl.cur + i;
      const std::int32_t at = batch_.add(sl.fed[static_cast<std::size_t>(p)], static_cast<llama_pos>(p), sl.seq, p + 1 == n);
      if (p + 1 == n) sl.logits_at = at;
    }
    sl.take = take;
  }

  void advance(slot& sl, std::vector<request_output>& done) {
    if (sl.phase == slot_phase::prefill) {
      stats_.prefilled_tokens += sl.take;
      sl.cur += sl.take;
      if (sl.cur < sl.cuts[sl.next_cut]) return;
      const auto n = static_cast<std::int64_t>(sl.in.prompt.size());
      if (sl.ticket && is_site(sl, sl.cur)) snapshot_site(sl, sl.cur);
      if (shared_ && is_shared_position(sl, sl.cur)) store_shared(sl, sl.cur);
      ++sl.next_cut;
      if (sl.cur < n) return;
      sl.out.ttft_ms = detail::ms_since(sl.t0);
      sl.phase = slot_phase::decode;
    } else {
      ++sl.cur;
    }
    // Logits of the last fed token: the next output.
    const float* logits = llama_get_logits_ith(s_.ctx(), sl.logits_at);
    if (sl.in.keep_logits) sl.out.logits.insert(sl.out.logits.end(), logits, logits + n_vocab_);
    const llama_token t = detail::argmax(logits, n_vocab_);
    if (sl.in.top_logprobs >= 0) sl.out.logprobs.push_back(detail::logprobs_of(logits, n_vocab_, t, sl.in.top_logprobs));
    sl.out.tokens.push_back(t);
    if (static_cast<std::int32_t>(sl.out.tokens.size()) >= sl.in.max_tokens || llama_vocab_is_eog(s_.model().vocab(), t)) {
      complete(sl, done);
      return;
    }
    sl.fed.push_back(t);  // fed at the next step
  }

  bool is_site(const slot& sl, std::int64_t p) const {
    const auto* st = *requests_.state(*sl.ticket);
    for (const auto& site : st->plan.sites)
      if (site.position == p) return true;
    return false;
  }

  // The recurrent snapshot after position p (a batch just ended there) into p's slot.
  void snapshot_site(slot& sl, std::int64_t p) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto* st = *requests_.state(*sl.ticket);
    std::size_t i = 0;
    while (i < st->plan.sites.size() && st->plan.sites[i].position != p) ++i;
    read_snapshot_into(sl.seq, st->checkpoints[i].handle);
    sl.captured.push_back(p);
    ++stats_.snapshots;
    stats_.snapshot_ms += detail::ms_since(t0);
  }

  template <class Handle>
  void read_snapshot_into(llama_seq_id seq, const Handle& slot_handle) {
    const std::size_t size = llama_state_seq_get_size_ext(s_.ctx(), seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    state_buf_.resize(size);
    if (llama_state_seq_get_data_ext(s_.ctx(), reinterpret_cast<std::uint8_t*>(state_buf_.data()), size, seq,
                                     LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) != size)
      throw hc::invalid_argument("llama.cpp: a recurrent snapshot could not be read");
    read_snapshot(state_buf_, s_.layout(), view_);
    copy_recurrent(view_, slot_handle);
  }

  template <class Handle>
  void copy_recurrent(const full_state_view& v, const Handle& slot_handle) {
    const auto& layout = s_.layout();
    for (std::size_t i = 0; i < layout.rec.size(); ++i) {
      std::byte* b = page_address(slot_handle.blocks[i]);
      std::memcpy(b, v.r[i], layout.rec[i].r_row);
      std::memcpy(b + layout.rec[i].r_row, v.s[i], layout.rec[i].s_row);
    }
  }

  // The request ended: its new tokens' rows into the reservation, the final snapshot into the
  // end slot, finish; the slot's sequence is emptied.
  void complete(slot& sl, std::vector<request_output>& done) {
    if (sl.ticket) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string e = capture(sl);
      stats_.capture_ms += detail::ms_since(t0);
      if (!e.empty()) {
        fail(sl, e, done);
        return;
      }
    }
    sl.out.total_ms = detail::ms_since(sl.t0);
    ++stats_.requests;
    stats_.prompt_tokens += sl.out.prompt_tokens;
    stats_.reused_tokens += sl.out.reused_tokens;
    stats_.shared_loaded_tokens += sl.out.shared_loaded_tokens;
    done.push_back(std::move(sl.out));
    release(sl);
  }

  std::string capture(slot& sl) {
    const auto& layout = s_.layout();
    const std::int64_t len = sl.cur;  // every fed token has its KV and the state is after the last
    if (static_cast<std::int64_t>(sl.fed.size()) != len) return "capture: fed tokens and positions disagree";
    const std::size_t size = llama_state_seq_get_size_ext(s_.ctx(), sl.seq, 0);
    state_buf_.resize(size);
    if (llama_state_seq_get_data_ext(s_.ctx(), reinterpret_cast<std::uint8_t*>(state_buf_.data()), size, sl.seq, 0) != size)
      return "capture: the sequence state could not be read";
    read_full_state(state_buf_, s_.layout(), /*learn=*/false, view_);
    if (static_cast<std::int64_t>(view_.pos.size()) != len || view_.rec_pos != len - 1)
      return "capture: the sequence holds " + std::to_string(view_.pos.size()) + " cells, not the " + std::to_string(len) + " tokens fed";
    const auto* st = *requests_.state(*sl.ticket);
    load_tables(sl);
    const std::int64_t P = opts_.tokens_per_page;
    for (std::int64_t c = 0; c < len; ++c) {
      const std::int64_t p = view_.pos[static_cast<std::size_t>(c)];
      if (p < st->kv_from) continue;  // the tree holds it (read-only: shared pages)
      for (std::size_t l = 0; l < layout.kv.size(); ++l) {
        std::byte* dst = page_address(tables_[l][static_cast<std::size_t>(p / P)]) + static_cast<std::uint64_t>(p % P) * layout.kv[l].token_bytes();
        std::memcpy(dst, view_.k[l] + static_cast<std::uint64_t>(c) * layout.kv[l].k_row, layout.kv[l].k_row);
        copy_v_row(layout, view_, l, static_cast<std::size_t>(c), dst + layout.kv[l].k_row);
      }
    }
    // The state after the last fed token: into the end slot, or the site slot at len.
    if (std::find(sl.captured.begin(), sl.captured.end(), len) == sl.captured.end()) {
      copy_recurrent(view_, st->checkpoints[st->plan.sites.size()].handle);
      sl.captured.push_back(len);
    }
    std::sort(sl.captured.begin(), sl.captured.end());
    const auto b = std::chrono::steady_clock::now();
    auto f = requests_.finish(*sl.ticket, std::span<const llama_token>(sl.fed), sl.captured);
    stats_.bookkeeping_ms += detail::ms_since(b);
    sl.ticket.reset();
    if (!f) return "finish: " + f.message();
    return {};
  }

  void fail(slot& sl, const std::string& why, std::vector<request_output>& done) {
    sl.out.error = why;
    done.push_back(std::move(sl.out));
    release(sl);
  }

  void release(slot& sl) {
    if (sl.ticket) (void)requests_.abort(*sl.ticket);
    sl.ticket.reset();
    llama_memory_seq_rm(s_.memory(), sl.seq, -1, -1);
    sl.phase = slot_phase::idle;
    sl.take = 0;
  }

  void load_tables(const slot& sl) {
    tables_.resize(s_.layout().kv.size());
    for (std::size_t l = 0; l < tables_.size(); ++l)
      if (auto e = requests_.block_table(*sl.ticket, static_cast<std::int64_t>(l), tables_[l]); !e)
        throw hc::invalid_argument("block_table: " + e.message());
  }

  std::byte* page_address(hc::packed_handle h) const {
    auto p = pool_.resolve(h);
    if (!p || *p == nullptr) throw hc::invalid_argument("engine: a pool handle the cache gave does not resolve");
    return *p;
  }

  session& s_;
  hc::cost_model model_;
  cache_options opts_;
  std::string name_;
  std::unique_ptr<lower_backend> lower_;  // disk or Redis below the host tier (none: nullptr); outlives cache_ and shared_
  pool_t pool_;
  Cache cache_;
  hc::prefix::request_lifecycle<Cache> requests_;
  std::vector<slot> slots_;
  detail::batch batch_;
  std::deque<request_input> queue_;
  engine_stats stats_;
  std::int32_t n_vocab_ = 0;
  std::vector<std::byte> state_buf_;
  full_state_view view_;
  std::vector<std::vector<hc::packed_handle>> tables_;
  std::vector<std::int64_t> extra_;  // admit's application-directed checkpoints
  std::unique_ptr<shared_tier> shared_;   // below the host tier (none: nullptr)
  shared_hit hit_;                        // admit's shared-tier hit, restored at once
  std::vector<std::int64_t> shared_at_;   // admit's candidate positions
  std::vector<std::byte> shared_buf_;     // a sequence state read for a store
  full_state_view shared_view_;
  std::size_t admitted_ = 0;          // requests taken from the queue (fault injection)
};

inline std::unique_ptr<engine> make_engine(session& s, const cache_options& o) {
  const hc::model_spec spec = s.make_spec();
  const hc::cost_model m(spec);
  if (o.policy == "sglang+")
    return std::make_unique<cached_engine<hc::compose::sglang_cache<store_t>>>(s, spec, o, hc::prefix::lru_scorer{}, "sglang+");
  if (o.policy == "vllm+")
    return std::make_unique<cached_engine<hc::compose::vllm_cache<store_t>>>(s, spec, o, hc::prefix::lru_scorer{}, "vllm+");
  if (o.policy != "marconi") throw hc::invalid_argument("--policy '" + o.policy + "' (known: marconi, sglang+, vllm+)");
  if (o.alpha == "auto")
    return std::make_unique<cached_engine<hc::compose::marconi_adaptive_cache<store_t>>>(
        s, spec, o, hc::compose::make_marconi_adaptive_scorer(m), "marconi (adaptive selector)");
  std::size_t used = 0;
  double alpha = 0;
  try {
    alpha = std::stod(o.alpha, &used);
  } catch (...) {
    used = 0;
  }
  if (used != o.alpha.size() || !std::isfinite(alpha) || alpha < 0)
    throw hc::invalid_argument("--alpha '" + o.alpha + "': auto or a FLOP weight >= 0");
  return std::make_unique<cached_engine<hc::compose::marconi_cache<store_t>>>(
      s, spec, o, hc::prefix::flop_aware_scorer(m, {.alpha = alpha}), "marconi (alpha " + o.alpha + ")");
}

}  // namespace hybridcache_llama
