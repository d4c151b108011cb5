// `hcbench gen`: write a synth-v1 trace (the Marconi reference's JSONL format) to a file.
//
//   hcbench gen --profile chat|agent --seed N --sessions N --session-gap-ms MS --out FILE
//
// Byte-identical to shared/fixtures/marconi/gen_trace.py for the same arguments (same
// sha256), so a trace can be handed to the reference simulator and to `hcbench replay`.
#include <cstdio>
#include <fstream>
#include <string>

#include <hybridcache/core/error.hpp>
#include <hybridcache/sim/synth_v1.hpp>

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
  const auto requests = sim::generate_synth_v1({.profile = sim::parse_synth_profile(o.profile),
                                                .seed = static_cast<std::uint64_t>(o.seed),
                                                .sessions = o.sessions,
                                                .session_gap_ms = o.gap_ms});
  std::ofstream f(o.out, std::ios::binary);
  if (!f) throw hybridcache::invalid_argument("--out: cannot open '" + o.out + "' for writing");
  sim::write_synth_v1_jsonl(f, requests);
  f.flush();
  if (!f) throw hybridcache::invalid_argument("--out: cannot write '" + o.out + "'");
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
