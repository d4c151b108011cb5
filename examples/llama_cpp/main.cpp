// hybridcache-llama: llama.cpp serving hybrid models (Gated DeltaNet + attention, Mamba2 +
// attention) with hybridcache's prefix cache over their KV and recurrent states. See
// docs/llama_cpp.md.
//
//   hybridcache-llama replay --model M.gguf --trace T --format sharegpt|openai|tau-bench|swe-agent
//                            [--slots 4] [--tiers hbm=256MiB,host=1GiB] [--policy marconi]
//                            [--alpha auto] [--max-tokens 16] [--verify] [--json]
//                            [--per-request FILE]
//
//   hybridcache-llama serve --model M.gguf [--host 127.0.0.1] [--port 8080] [--api-key KEY]...
//                           [--slots 4] [--tiers ...] [--policy ...]
//
// serve: llama-server's POST /v1/chat/completions and /completion, GET /health and /metrics
// (server.hpp), so a client of llama-server can be pointed at it unchanged.
//
// replay: every conversation of the trace becomes one request per assistant turn (the
// history before it as the prompt, rendered with the model's template); up to --slots
// requests run at once, one llama_decode batch across them; a conversation's next turn starts
// when its previous one ended, conversations taken round-robin. --verify runs every request
// again without the cache (a fresh sequence, prefilled from token 0) and requires every logit
// row within verify.hpp's bound of the uncached run's (a token may differ only at a near tie:
// llama.cpp's CPU kernels are not batch-invariant). Prints a summary (or, with --json, one
// JSON object).
#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "hybridcache/core/byte_size.hpp"
#include "hybridcache/tiered/tier.hpp"
#include "conversations.hpp"
#include "engine.hpp"
#include "llama_session.hpp"
#include "server.hpp"
#include "verify.hpp"

namespace hcl = hybridcache_llama;
namespace hc = hybridcache;

namespace {

std::int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

/// --tiers in the library's grammar (tiered/tier.hpp): hbm=SIZE (the pool), then optionally
/// host=SIZE (the pool store's host tier), then one of disk@DIR=SIZE or redis@HOST:PORT=SIZE
/// (the shared tier). Anything the program would not use is an error, never ignored.
void parse_tiers(const std::string& spec, const std::string& model_path, hcl::cache_options& o) {
  namespace ht = hc::tiered;
  const auto tiers = ht::parse_tiers(spec, 1);
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    const auto& t = tiers[i];
    const std::string who = "--tiers '" + spec + "': tier " + std::to_string(i) + " (" + std::string(ht::to_string(t.kind)) + ")";
    if (t.link_gbps_given || t.latency_given)
      throw hc::invalid_argument(who + ": :gbps= and :lat_us= describe a modelled link; this program copies real bytes");
    if (t.numa_node != -1) throw hc::invalid_argument(who + ": NUMA binding is not supported here");
    switch (t.kind) {
      case ht::tier_kind::hbm: o.capacity_bytes = t.capacity_bytes; break;
      case ht::tier_kind::host:
        if (o.host_capacity_bytes != 0) throw hc::invalid_argument(who + ": one host tier at most");
        o.host_capacity_bytes = t.capacity_bytes;
        break;
      case ht::tier_kind::disk:
      case ht::tier_kind::redis:
        if (o.shared.kind != hcl::shared_tier_options::kind_t::none)
          throw hc::invalid_argument(who + ": one shared tier at most (disk or redis)");
        o.shared = {.kind = t.kind == ht::tier_kind::disk ? hcl::shared_tier_options::kind_t::disk : hcl::shared_tier_options::kind_t::redis,
                    .location = t.location,
                    .capacity_bytes = t.capacity_bytes};
        break;
      default: throw hc::invalid_argument(who + ": not a tier this program has (hbm, host, disk, redis)");
    }
  }
  if (o.shared.kind != hcl::shared_tier_options::kind_t::none) o.weights_id = hcl::weights_identity(model_path);
}

struct replay_options {
  std::string model, trace, format = "sharegpt", tiers = "hbm=256MiB", per_request;
  hcl::cache_options cache;
  hcl::context_options context;
  std::size_t conversations = 1u << 20;
  std::int32_t max_tokens = 16;
  bool verify = false, json = false;
};

struct request_ref {
  std::size_t conversation = 0, turn = 0;
};

int replay(replay_options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  parse_tiers(o.tiers, o.model, o.cache);
  hcl::loaded_model model(o.model);
  const auto convs = hcl::read_conversations(o.trace, o.format, o.conversations);
  if (convs.empty()) throw hc::invalid_argument("--trace '" + o.trace + "': no conversation with an assistant turn");
  hcl::session sess(model, o.context);
  auto engine = hcl::make_engine(sess, o.cache);
  std::unique_ptr<hcl::session> verify;
  if (o.verify) {
    hcl::context_options v = o.context;
    v.slots = 1;
    verify = std::make_unique<hcl::session>(model, v);
  }
  // Round-robin over conversations; a conversation's next turn waits for its previous one.
  std::vector<std::vector<std::size_t>> turns;
  for (const auto& c : convs) turns.push_back(c.turns());
  std::vector<std::size_t> next(convs.size(), 0);
  std::vector<bool> busy(convs.size(), false);
  std::map<std::uint64_t, request_ref> refs;
  std::map<std::uint64_t, std::vector<llama_token>> prompts;
  std::uint64_t id = 0;
  std::size_t rr = 0, total = 0;
  for (const auto& t : turns) total += t.size();
  std::vector<double> ttft;
  std::int64_t identical = 0, logits_identical = 0, near_ties = 0, verify_failures = 0, verified = 0, failed = 0;
  double max_deviation = 0;
  const std::int32_t n_vocab = llama_vocab_n_tokens(model.vocab());
  std::ofstream per;
  if (!o.per_request.empty()) {
    per.open(o.per_request);
    if (!per) throw hc::invalid_argument("--per-request '" + o.per_request + "': cannot write");
    per << "id,conversation,turn,prompt_tokens,reused_tokens,prefilled_tokens,host_loaded_tokens,shared_loaded_tokens,cached,output_tokens,"
           "ttft_ms,total_ms,identical\n";
  }
  std::vector<hcl::request_output> done;
  std::size_t finished = 0;
  while (finished < total) {
    // Keep every slot busy: the next ready conversation, round-robin.
    for (std::size_t tries = 0; engine->pending() < o.context.slots && tries < convs.size(); ++tries) {
      const std::size_t c = rr;
      rr = (rr + 1) % convs.size();
      if (busy[c] || next[c] >= turns[c].size()) continue;
      const std::size_t upto = turns[c][next[c]];
      hcl::request_input in;
      in.id = ++id;
      const auto msgs = std::span(convs[c].messages).first(upto);
      in.prompt = model.chat_prompt(msgs);
      in.checkpoints = model.message_boundaries(msgs, in.prompt);
      if (o.cache.shared.kind != hcl::shared_tier_options::kind_t::none) in.earlier_end = model.last_turn_start(msgs, in.prompt);
      in.max_tokens = o.max_tokens;
      in.keep_logits = o.verify;
      refs[in.id] = {c, next[c]};
      if (o.verify) prompts[in.id] = in.prompt;
      busy[c] = true;
      ++next[c];
      engine->submit(std::move(in));
      tries = 0;
    }
    done.clear();
    engine->step(done);
    for (auto& r : done) {
      ++finished;
      const request_ref ref = refs[r.id];
      busy[ref.conversation] = false;
      if (!r.error.empty()) {
        ++failed;
        std::fprintf(stderr, "request %llu (conversation %zu, turn %zu): %s\n", static_cast<unsigned long long>(r.id),
                     ref.conversation, ref.turn, r.error.c_str());
        continue;
      }
      ttft.push_back(r.ttft_ms);
      bool same = true;
      if (o.verify) {
        const auto ref_run = hcl::run_uncached(*verify, 0, prompts[r.id], o.max_tokens);
        const auto v = hcl::compare_with_reference(r.tokens, r.logits, ref_run.tokens, ref_run.logits, n_vocab);
        same = v.tokens_identical;
        ++verified;
        identical += v.tokens_identical ? 1 : 0;
        logits_identical += v.logits_identical && v.tokens_identical ? 1 : 0;
        near_ties += v.ok && !v.tokens_identical ? 1 : 0;
        verify_failures += v.ok ? 0 : 1;
        max_deviation = std::max(max_deviation, v.max_relative_deviation);
        if (!v.ok)
          std::fprintf(stderr, "request %llu (conversation %zu, turn %zu): differs from the uncached run: %s (reused %lld of %lld)\n",
                       static_cast<unsigned long long>(r.id), ref.conversation, ref.turn, v.why.c_str(),
                       static_cast<long long>(r.reused_tokens), static_cast<long long>(r.prompt_tokens));
        else if (!v.tokens_identical)
          std::fprintf(stderr, "request %llu (conversation %zu, turn %zu): output %d differs from the uncached run's, a near tie "
                       "(logits within %.2g of the largest; reused %lld of %lld)\n",
                       static_cast<unsigned long long>(r.id), ref.conversation, ref.turn, v.flip_at, v.max_relative_deviation,
                       static_cast<long long>(r.reused_tokens), static_cast<long long>(r.prompt_tokens));
        prompts.erase(r.id);
      }
      if (per)
        per << r.id << ',' << ref.conversation << ',' << ref.turn << ',' << r.prompt_tokens << ',' << r.reused_tokens << ','
            << r.prompt_tokens - r.reused_tokens << ',' << r.host_loaded_tokens << ',' << r.shared_loaded_tokens << ',' << (r.cached ? 1 : 0) << ','
            << r.tokens.size() << ',' << r.ttft_ms << ',' << r.total_ms << ',' << (o.verify ? (same ? "1" : "0") : "") << '\n';
    }
  }
  engine->drain();  // the shared tier's writes land before the run counts as done
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::sort(ttft.begin(), ttft.end());
  const double p50 = ttft.empty() ? 0.0 : ttft[ttft.size() / 2];
  const auto st = engine->stats();
  if (o.json) {
    std::printf(
        "{\"requests\": %lld, \"prompt_tokens\": %lld, \"prefilled_tokens\": %lld, \"reused_tokens\": %lld, "
        "\"host_loads\": %lld, \"host_loaded_tokens\": %lld, \"host_corrupt_dropped\": %lld, \"moved_down\": %lld, \"brought_up\": %lld, \"storage_dropped\": %lld, \"disk_loads\": %lld, \"redis_loads\": %lld, "
        "\"shared_lookups\": %lld, \"shared_loaded_tokens\": %lld, \"shared_stores\": %lld, \"shared_store_failures\": %lld, \"shared_dropped\": %lld, "
        "\"shared_lookup_ms\": %.3f, \"shared_store_ms\": %.3f, "
        "\"evictions\": %lld, \"uncached\": %lld, "
        "\"failed\": %lld, \"verified\": %lld, \"outputs_identical\": %lld, \"logits_identical\": %lld, \"near_ties\": %lld, \"verify_failures\": %lld, "
        "\"max_logit_deviation\": %.3g, \"ttft_p50_ms\": %.3f, \"wall_s\": %.3f, "
        "\"peak_rss_bytes\": %lld, \"restore_ms\": %.3f, \"snapshot_ms\": %.3f, \"capture_ms\": %.3f, "
        "\"bookkeeping_ms\": %.3f, \"decode_ms\": %.3f, \"cache\": \"%s\"}\n",
        static_cast<long long>(st.requests), static_cast<long long>(st.prompt_tokens), static_cast<long long>(st.prefilled_tokens),
        static_cast<long long>(st.reused_tokens), static_cast<long long>(st.host_loads), static_cast<long long>(st.host_loaded_tokens),
        static_cast<long long>(st.host_corrupt_dropped), static_cast<long long>(st.moved_down), static_cast<long long>(st.brought_up),
        static_cast<long long>(st.storage_dropped), static_cast<long long>(st.shared_kind == "disk" ? st.shared.loads : 0),
        static_cast<long long>(st.shared_kind == "redis" ? st.shared.loads : 0), static_cast<long long>(st.shared.lookups), static_cast<long long>(st.shared_loaded_tokens),
        static_cast<long long>(st.shared.stores), static_cast<long long>(st.shared.store_failures), static_cast<long long>(st.shared.dropped),
        st.shared.lookup_ms, st.shared.store_ms, static_cast<long long>(st.evictions), static_cast<long long>(st.uncached), static_cast<long long>(failed),
        static_cast<long long>(verified), static_cast<long long>(identical), static_cast<long long>(logits_identical), static_cast<long long>(near_ties),
        static_cast<long long>(verify_failures), max_deviation, p50, wall, static_cast<long long>(peak_rss_bytes()),
        st.restore_ms, st.snapshot_ms, st.capture_ms, st.bookkeeping_ms, st.decode_ms, engine->describe().c_str());
  } else {
    std::printf("%s\n", engine->describe().c_str());
    std::printf("requests %lld (%zu conversations): prompt tokens %lld, prefilled %lld, reused %lld (%.1f%%), host loads %lld "
                "(%lld tokens), evictions %lld, uncached %lld, failed %lld\n",
                static_cast<long long>(st.requests), convs.size(), static_cast<long long>(st.prompt_tokens),
                static_cast<long long>(st.prefilled_tokens), static_cast<long long>(st.reused_tokens),
                st.prompt_tokens > 0 ? 100.0 * static_cast<double>(st.reused_tokens) / static_cast<double>(st.prompt_tokens) : 0.0,
                static_cast<long long>(st.host_loads), static_cast<long long>(st.host_loaded_tokens),
                static_cast<long long>(st.evictions), static_cast<long long>(st.uncached), static_cast<long long>(failed));
    if (o.verify)
      std::printf("outputs identical to uncached: %lld/%lld (logits bit-identical %lld, near ties %lld, beyond the bound %lld; "
                  "largest logit deviation %.2g of the row's largest)\n",
                  static_cast<long long>(identical), static_cast<long long>(verified), static_cast<long long>(logits_identical),
                  static_cast<long long>(near_ties), static_cast<long long>(verify_failures), max_deviation);
    std::printf("TTFT p50 %.1f ms; wall %.2f s; llama_decode %.0f ms; restore %.1f ms (%lld), snapshots %.1f ms (%lld), "
                "capture %.1f ms, cache calls %.1f ms; peak RSS %.1f MiB\n",
                p50, wall, st.decode_ms, st.restore_ms, static_cast<long long>(st.restores), st.snapshot_ms,
                static_cast<long long>(st.snapshots), st.capture_ms, st.bookkeeping_ms,
                static_cast<double>(peak_rss_bytes()) / (1 << 20));
  }
  return failed == 0 && verify_failures == 0 ? 0 : 1;
}

/// JSON string literal of `s` (the server's escaper, valid UTF-8).
std::string quoted(const std::string& s) { return hcl::detail::json_string(s); }

struct requests_options {
  std::string model, trace, format = "sharegpt";
  std::size_t conversations = 1u << 20;
  std::size_t max_prompt_tokens = 0;  ///< a turn with a longer prompt ends its conversation (0: no limit)
};

// The requests of a trace in the order a sequential client sends them (conversations
// round-robin, one turn each per round), as JSON lines: messages, prompt tokens, and the
// prefill a prefix cache that keeps everything needs (the prompt less its longest common
// prefix with any earlier prompt, at least one token). The head-to-head client
// (scripts/llama_head_to_head.py) sends exactly these to both servers.
int list_requests(const requests_options& o) {
  hcl::loaded_model model(o.model);
  const auto convs = hcl::read_conversations(o.trace, o.format, o.conversations);
  std::vector<std::vector<std::size_t>> turns;
  std::size_t rounds = 0;
  for (const auto& c : convs) {
    turns.push_back(c.turns());
    rounds = std::max(rounds, turns.back().size());
  }
  std::vector<std::vector<llama_token>> seen;
  long long total = 0, bound = 0, id = 0;
  for (std::size_t round = 0; round < rounds; ++round) {
    for (std::size_t c = 0; c < convs.size(); ++c) {
      if (round >= turns[c].size()) continue;
      const auto msgs = std::span(convs[c].messages).first(turns[c][round]);
      const auto prompt = model.chat_prompt(msgs);
      if (o.max_prompt_tokens > 0 && prompt.size() > o.max_prompt_tokens) {
        turns[c].resize(round);  // longer than a slot holds: the conversation ends here
        continue;
      }
      std::size_t best = 0;
      for (const auto& p : seen) {
        std::size_t k = 0;
        const std::size_t m = std::min(p.size(), prompt.size());
        while (k < m && p[k] == prompt[k]) ++k;
        best = std::max(best, k);
      }
      const long long need = static_cast<long long>(prompt.size() - std::min(best, prompt.size() - 1));
      total += static_cast<long long>(prompt.size());
      bound += need;
      std::string line = "{\"id\": " + std::to_string(++id) + ", \"conversation\": " + std::to_string(c) + ", \"turn\": " +
                         std::to_string(round) + ", \"prompt_tokens\": " + std::to_string(prompt.size()) +
                         ", \"bound_prefill\": " + std::to_string(need) + ", \"messages\": [";
      for (std::size_t i = 0; i < msgs.size(); ++i)
        line += std::string(i ? ", " : "") + "{\"role\": " + quoted(msgs[i].first) + ", \"content\": " + quoted(msgs[i].second) + "}";
      std::printf("%s]}\n", line.c_str());
      seen.push_back(prompt);
    }
  }
  std::fprintf(stderr, "requests: %lld, prompt tokens %lld, keep-everything prefill bound %lld\n", id, total, bound);
  return 0;
}

struct serve_options {
  std::string model, tiers = "hbm=256MiB";
  hcl::cache_options cache;
  hcl::context_options context;
  hcl::server_options server;
};

int serve(serve_options& o) {
  parse_tiers(o.tiers, o.model, o.cache);
  hcl::loaded_model model(o.model);
  hcl::session sess(model, o.context);
  auto engine = hcl::make_engine(sess, o.cache);
  o.server.max_tokens_limit = static_cast<std::int32_t>(std::min<std::uint32_t>(o.context.ctx_per_slot - 1, 1u << 20));
  hcl::server srv(model, *engine, o.server);
  srv.run();
  return 0;
}

/// The options every subcommand takes for the model, the context and the cache.
template <class Options>
void add_engine_options(CLI::App* c, Options& o) {
  c->add_option("--model", o.model, "GGUF model (a hybrid: qwen35, nemotron_h, ...)")->required();
  c->add_option("--slots", o.context.slots, "requests computed at once")->capture_default_str()->check(CLI::Range(1, 64));
  c->add_option("--threads", o.context.threads, "llama.cpp threads")->capture_default_str()->check(CLI::Range(1, 256));
  c->add_option("--ctx", o.context.ctx_per_slot, "tokens per slot (prompt + output)")->capture_default_str()->check(CLI::Range(64, 1 << 20));
  c->add_option("--tiers", o.tiers, "hbm=SIZE (the pool) [,host=SIZE (its host tier)] [,disk@DIR=SIZE | ,redis@HOST:PORT=SIZE (the shared tier)]")
      ->capture_default_str();
  c->add_option("--tokens-per-page", o.cache.tokens_per_page, "tokens per KV page")->capture_default_str()->check(CLI::Range(1, 4096));
  c->add_option("--policy", o.cache.policy, "marconi | sglang+ | vllm+")->capture_default_str();
  c->add_option("--alpha", o.cache.alpha, "marconi: auto (the adaptive selector) or a FLOP weight")->capture_default_str();
  c->add_flag("--no-flash-attn", [&o](std::int64_t) { o.context.flash_attn = false; }, "V transposed (llama.cpp without flash attention)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hybridcache-llama: llama.cpp with hybridcache's prefix cache over hybrid models' KV and recurrent states"};
  app.require_subcommand(1);
  replay_options r;
  auto* rp = app.add_subcommand("replay", "replay a conversation trace through the cached engine");
  add_engine_options(rp, r);
  rp->add_option("--trace", r.trace, "conversation trace")->required();
  rp->add_option("--format", r.format, "openai | tau-bench | swe-agent | sharegpt")->capture_default_str();
  rp->add_option("--conversations", r.conversations, "at most this many conversations");
  rp->add_option("--max-tokens", r.max_tokens, "tokens generated per request (greedy)")->capture_default_str()->check(CLI::Range(1, 4096));
  rp->add_flag("--verify", r.verify, "run every request again uncached; logits within 1e-2 of its (a token may differ only at a near tie)");
  rp->add_option("--fault-flip-host-every", r.cache.flip_host_every,
                 "tests: before every N-th request flip a byte of every 7th host page and block (detected, never loaded)")
      ->check(CLI::Range(0, 1 << 30));
  rp->add_flag("--json", r.json, "one JSON object");
  rp->add_option("--per-request", r.per_request, "CSV of every request");
  serve_options sv;
  auto* sp = app.add_subcommand("serve", "serve llama-server's HTTP API through the cached engine");
  add_engine_options(sp, sv);
  sp->add_option("--host", sv.server.host, "address to bind (loopback unless told otherwise)")->capture_default_str();
  sp->add_option("--port", sv.server.port, "port")->capture_default_str()->check(CLI::Range(1, 65535));
  sp->add_option("--api-key", sv.server.api_keys, "required as 'Authorization: Bearer KEY' (repeat for several; each is a cache namespace)");
  sp->add_option("--max-body", sv.server.max_body_bytes, "largest request body (bytes; larger: 413)")->capture_default_str();
  sp->add_option("--max-tokens", sv.server.default_max_tokens, "tokens generated when a request names none")->capture_default_str()->check(CLI::Range(1, 4096));
  requests_options rq;
  auto* qp = app.add_subcommand("requests", "print a trace's requests as the head-to-head client sends them (JSON lines)");
  qp->add_option("--model", rq.model, "GGUF model (its template and tokenizer)")->required();
  qp->add_option("--trace", rq.trace, "conversation trace")->required();
  qp->add_option("--format", rq.format, "openai | tau-bench | swe-agent | sharegpt")->capture_default_str();
  qp->add_option("--conversations", rq.conversations, "at most this many conversations");
  qp->add_option("--max-prompt-tokens", rq.max_prompt_tokens, "end a conversation at its first longer prompt (0: no limit)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (rp->parsed()) return replay(r);
    if (sp->parsed()) return serve(sv);
    if (qp->parsed()) return list_requests(rq);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hybridcache-llama: %s\n", e.what());
    return 2;
  }
  return 0;
}
