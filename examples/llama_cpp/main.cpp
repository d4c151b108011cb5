// hybridcache-llama: llama.cpp serving hybrid models (Gated DeltaNet + attention, Mamba2 +
// attention) with hybridcache's prefix cache over their KV and recurrent states. See
// docs/llama_cpp.md.
//
//   hybridcache-llama replay --model M.gguf --trace T --format sharegpt|openai|tau-bench|swe-agent
//                            [--slots 4] [--tiers hbm=256MiB,host=1GiB] [--policy marconi]
//                            [--alpha auto] [--max-tokens 16] [--verify] [--json]
//                            [--per-request FILE]
//
// replay: every conversation of the trace becomes one request per assistant turn (the
// history before it as the prompt, rendered with the model's template); up to --slots
// requests run at once, one llama_decode batch across them; a conversation's next turn starts
// when its previous one ended, conversations taken round-robin. --verify runs every request
// again without the cache (a fresh sequence, prefilled from token 0) and requires identical
// greedy tokens. Prints a summary (or, with --json, one JSON object).
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
#include "conversations.hpp"
#include "engine.hpp"
#include "llama_session.hpp"

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

/// --tiers hbm=SIZE[,host=SIZE]: the pool and the host tier below it.
void parse_tiers(const std::string& spec, hcl::cache_options& o) {
  std::size_t at = 0;
  bool hbm = false;
  while (at <= spec.size()) {
    const std::size_t end = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, end - at);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) throw hc::invalid_argument("--tiers '" + spec + "': '" + item + "' is not NAME=SIZE");
    const std::string name = item.substr(0, eq);
    const auto bytes = static_cast<std::uint64_t>(hc::parse_byte_size_or_throw(item.substr(eq + 1), "--tiers " + name));
    if (name == "hbm") {
      o.hbm_bytes = bytes;
      hbm = true;
    } else if (name == "host") {
      o.host_bytes = bytes;
    } else {
      throw hc::invalid_argument("--tiers '" + spec + "': unknown tier '" + name + "' (known: hbm, host)");
    }
    at = end + 1;
  }
  if (!hbm) throw hc::invalid_argument("--tiers '" + spec + "': hbm=SIZE is required (the pool)");
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
  parse_tiers(o.tiers, o.cache);
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
  std::int64_t identical = 0, verified = 0, failed = 0;
  std::ofstream per;
  if (!o.per_request.empty()) {
    per.open(o.per_request);
    if (!per) throw hc::invalid_argument("--per-request '" + o.per_request + "': cannot write");
    per << "id,conversation,turn,prompt_tokens,reused_tokens,prefilled_tokens,host_loaded_tokens,cached,output_tokens,ttft_ms,total_ms,identical\n";
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
      in.prompt = model.chat_prompt(std::span(convs[c].messages).first(upto));
      in.max_tokens = o.max_tokens;
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
        const auto ref_tokens = hcl::run_uncached(*verify, 0, prompts[r.id], o.max_tokens);
        same = ref_tokens == r.tokens;
        ++verified;
        identical += same ? 1 : 0;
        if (!same)
          std::fprintf(stderr, "request %llu (conversation %zu, turn %zu): output differs from the uncached run (reused %lld of %lld)\n",
                       static_cast<unsigned long long>(r.id), ref.conversation, ref.turn,
                       static_cast<long long>(r.reused_tokens), static_cast<long long>(r.prompt_tokens));
        prompts.erase(r.id);
      }
      if (per)
        per << r.id << ',' << ref.conversation << ',' << ref.turn << ',' << r.prompt_tokens << ',' << r.reused_tokens << ','
            << r.prompt_tokens - r.reused_tokens << ',' << r.host_loaded_tokens << ',' << (r.cached ? 1 : 0) << ','
            << r.tokens.size() << ',' << r.ttft_ms << ',' << r.total_ms << ',' << (o.verify ? (same ? "1" : "0") : "") << '\n';
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::sort(ttft.begin(), ttft.end());
  const double p50 = ttft.empty() ? 0.0 : ttft[ttft.size() / 2];
  const auto st = engine->stats();
  if (o.json) {
    std::printf(
        "{\"requests\": %lld, \"prompt_tokens\": %lld, \"prefilled_tokens\": %lld, \"reused_tokens\": %lld, "
        "\"host_loads\": %lld, \"host_loaded_tokens\": %lld, \"disk_loads\": 0, \"evictions\": %lld, \"uncached\": %lld, "
        "\"failed\": %lld, \"verified\": %lld, \"outputs_identical\": %lld, \"ttft_p50_ms\": %.3f, \"wall_s\": %.3f, "
        "\"peak_rss_bytes\": %lld, \"restore_ms\": %.3f, \"snapshot_ms\": %.3f, \"capture_ms\": %.3f, "
        "\"bookkeeping_ms\": %.3f, \"decode_ms\": %.3f, \"cache\": \"%s\"}\n",
        static_cast<long long>(st.requests), static_cast<long long>(st.prompt_tokens), static_cast<long long>(st.prefilled_tokens),
        static_cast<long long>(st.reused_tokens), static_cast<long long>(st.host_loads), static_cast<long long>(st.host_loaded_tokens),
        static_cast<long long>(st.evictions), static_cast<long long>(st.uncached), static_cast<long long>(failed),
        static_cast<long long>(verified), static_cast<long long>(identical), p50, wall, static_cast<long long>(peak_rss_bytes()),
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
      std::printf("outputs identical to uncached: %lld/%lld\n", static_cast<long long>(identical), static_cast<long long>(verified));
    std::printf("TTFT p50 %.1f ms; wall %.2f s; llama_decode %.0f ms; restore %.1f ms (%lld), snapshots %.1f ms (%lld), "
                "capture %.1f ms, cache calls %.1f ms; peak RSS %.1f MiB\n",
                p50, wall, st.decode_ms, st.restore_ms, static_cast<long long>(st.restores), st.snapshot_ms,
                static_cast<long long>(st.snapshots), st.capture_ms, st.bookkeeping_ms,
                static_cast<double>(peak_rss_bytes()) / (1 << 20));
  }
  return failed == 0 && (!o.verify || identical == verified) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hybridcache-llama: llama.cpp with hybridcache's prefix cache over hybrid models' KV and recurrent states"};
  app.require_subcommand(1);
  replay_options r;
  auto* rp = app.add_subcommand("replay", "replay a conversation trace through the cached engine");
  rp->add_option("--model", r.model, "GGUF model (a hybrid: qwen35, nemotron_h, ...)")->required();
  rp->add_option("--trace", r.trace, "conversation trace")->required();
  rp->add_option("--format", r.format, "openai | tau-bench | swe-agent | sharegpt")->capture_default_str();
  rp->add_option("--conversations", r.conversations, "at most this many conversations");
  rp->add_option("--max-tokens", r.max_tokens, "tokens generated per request (greedy)")->capture_default_str()->check(CLI::Range(1, 4096));
  rp->add_option("--slots", r.context.slots, "requests computed at once")->capture_default_str()->check(CLI::Range(1, 64));
  rp->add_option("--threads", r.context.threads, "llama.cpp threads")->capture_default_str()->check(CLI::Range(1, 256));
  rp->add_option("--ctx", r.context.ctx_per_slot, "tokens per slot (prompt + output)")->capture_default_str()->check(CLI::Range(64, 1 << 20));
  rp->add_option("--tiers", r.tiers, "hbm=SIZE (the pool) [,host=SIZE (the host tier)]")->capture_default_str();
  rp->add_option("--tokens-per-page", r.cache.tokens_per_page, "tokens per KV page")->capture_default_str()->check(CLI::Range(1, 4096));
  rp->add_option("--policy", r.cache.policy, "marconi | sglang+ | vllm+")->capture_default_str();
  rp->add_option("--alpha", r.cache.alpha, "marconi: auto (the adaptive selector) or a FLOP weight")->capture_default_str();
  rp->add_flag("--no-flash-attn", [&](std::int64_t) { r.context.flash_attn = false; }, "V transposed (llama.cpp without flash attention)");
  rp->add_flag("--verify", r.verify, "run every request again uncached; outputs must be identical");
  rp->add_flag("--json", r.json, "one JSON object");
  rp->add_option("--per-request", r.per_request, "CSV of every request");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (rp->parsed()) return replay(r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hybridcache-llama: %s\n", e.what());
    return 2;
  }
  return 0;
}
