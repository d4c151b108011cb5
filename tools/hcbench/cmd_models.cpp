// `hcbench models`: the cost-model table of every model preset (bytes and FLOP efficiency), or
// of one (--model), with Marconi's ablations applied (--model-attn-ratio, --model-state-dim).
#include <cstdio>
#include <string>
#include <vector>

#include <hybridcache/model/cost_model.hpp>
#include <hybridcache/model/presets.hpp>

#include "cli_support.hpp"
#include "command.hpp"
#include "model_flags.hpp"

namespace {

std::string layer_summary(const hybridcache::cost_model& m) {
  return std::to_string(m.attention_layers()) + "A/" + std::to_string(m.recurrent_layers()) + "R/" +
         std::to_string(m.mlp_layers()) + "M";
}

void print_models(const std::vector<hybridcache::model_spec>& specs, bool markdown) {
  using namespace hybridcache;
  const char* fmt_md = "| %s | %s | %s | %lld | %lld | %lld | %.0f | %.0f | %.0f |\n";
  const char* fmt_tx = "%-20s %-10s %-17s %12lld %14lld %12lld %12.0f %12.0f %12.0f\n";
  if (markdown) {
    std::printf("| preset | layers | recurrent | KV B/token | checkpoint B | ckpt/KV tokens | eff@1k | eff@8k | eff@32k |\n");
    std::printf("|---|---|---|---:|---:|---:|---:|---:|---:|\n");
  } else {
    std::printf("%-20s %-10s %-17s %12s %14s %12s %12s %12s %12s\n", "preset", "layers", "recurrent", "KV B/token",
                "checkpoint B", "ckpt/KV tok", "eff@1k", "eff@8k", "eff@32k");
  }
  for (const model_spec& spec : specs) {
    const cost_model m(spec);
    const long long ratio = m.kv_bytes_per_token() ? m.ssm_checkpoint_bytes() / m.kv_bytes_per_token() : 0;
    std::printf(markdown ? fmt_md : fmt_tx, spec.name.c_str(), layer_summary(m).c_str(),
                std::string(to_string(m.spec().recurrent)).c_str(), static_cast<long long>(m.kv_bytes_per_token()),
                static_cast<long long>(m.ssm_checkpoint_bytes()), ratio, m.flop_efficiency(1024),
                m.flop_efficiency(8192), m.flop_efficiency(32768));
  }
  if (!markdown)
    std::printf("\neff@L = prefill FLOPs of an L-token prefix per byte of its cached state (one SSM checkpoint + KV)\n");
}

const bool registered = hcbench::register_command(
    {"models", "print the cost-model table of every model preset", [](CLI::App& sub) {
       static bool markdown = false;
       static std::string model;
       static hcbench::model_cli flags;
       sub.add_flag("--markdown", markdown, "print a Markdown table");
       sub.add_option("--model", model, "print only this preset's row (default: every preset)");
       hcbench::add_model_options(sub, flags);
       sub.callback([&sub] {
         std::vector<hybridcache::model_spec> specs;
         if (model.empty()) {
           for (const char* name : {"--model-attn-ratio", "--model-state-dim"})
             hcbench::reject_unless(false, sub, name, "without --model (the preset it changes)");
           for (auto name : hybridcache::presets::preset_names()) specs.push_back(hybridcache::presets::preset(name));
         } else {
           specs.push_back(hcbench::resolve_model(model, flags, sub));
         }
         print_models(specs, markdown);
       });
     }});

}  // namespace
