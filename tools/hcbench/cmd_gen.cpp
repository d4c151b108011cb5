// `hcbench gen`: write a synth-v1 trace (the Marconi reference's JSONL format) to a file.
//
//   hcbench gen --profile chat|agent --seed N --sessions N --session-gap-ms MS --out FILE
//
// Byte-identical to shared/fixtures/marconi/gen_trace.py for the same arguments (same
// sha256), so a trace can be handed to the reference simulator and to `hcbench replay`.
#include <cstdio>
#include <sstream>
#include <string>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/synth_v1.hpp>

#include "atomic_file.hpp"
#include "command.hpp"

namespace {

struct gen_cli {
  std::string profile = "chat";
  long long seed = 1;
  long long sessions = 100;
  long long gap_ms = 2000;
  std::string out;
};

void run(const gen_cli& o) {
  namespace sim = hybridcache::sim;
  // Bounded before anything is generated: the trace grows with --sessions, and arrival times
  // (sessions x gap) stay within the readers' 1e10 s cap.
  if (o.sessions < 1 || o.sessions > 1'000'000)
    throw hybridcache::invalid_argument("--sessions: expected 1..1000000, got " + std::to_string(o.sessions));
  if (o.gap_ms < 0 || o.gap_ms > 3'600'000)
    throw hybridcache::invalid_argument("--session-gap-ms: expected 0..3600000, got " + std::to_string(o.gap_ms));
  if (o.seed < 0) throw hybridcache::invalid_argument("--seed: expected a number >= 0, got " + std::to_string(o.seed));
  const auto requests = sim::generate_synth_v1({.profile = sim::parse_synth_profile(o.profile),
                                                .seed = static_cast<std::uint64_t>(o.seed),
                                                .sessions = o.sessions,
                                                .session_gap_ms = o.gap_ms});
  std::ostringstream text;
  sim::write_synth_v1_jsonl(text, requests);
  hcbench::write_file_atomic(o.out, text.str(), "--out");  // whole file or none
  long long in = 0, out = 0;
  for (const auto& r : requests) {
    in += static_cast<long long>(r.input.size());
    out += static_cast<long long>(r.output.size());
  }
  std::printf("%s: %zu requests, %lld input tokens, %lld output tokens\n", o.out.c_str(), requests.size(), in, out);
}

const bool registered = hcbench::register_command(
    {"gen", "write a synth-v1 trace (Marconi JSONL, identical to gen_trace.py)", [](CLI::App& sub) {
       static gen_cli o;
       sub.add_option("--profile", o.profile, "chat | agent (default chat)");
       sub.add_option("--seed", o.seed, "PRNG seed (default 1)");
       sub.add_option("--sessions", o.sessions, "number of sessions (default 100)");
       sub.add_option("--session-gap-ms", o.gap_ms, "session s starts at s * gap ms (default 2000)");
       sub.add_option("--out", o.out, "output JSONL file")->required();
       sub.callback([] { run(o); });
     }});

}  // namespace
