// tools/hcbench/model_flags.hpp
//
// --model PRESET plus Marconi's architecture ablations (model/model_overrides.hpp):
// --model-attn-ratio A:S (attention:SSM layers, the preset's mixer count kept as nearly as
// the ratio allows) and --model-state-dim N (a Mamba preset's d_state). Shared by `replay`
// (both modes), `compare` and `models`, so every command builds the same spec from the same
// flags and names a bad value the same way.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include <hybridcache/core/error.hpp>
#include <hybridcache/model/model_overrides.hpp>
#include <hybridcache/model/presets.hpp>

#include "cli_support.hpp"

namespace hcbench {

/// The flags' values as given ("" / 0: not given).
struct model_cli {
  std::string attn_ratio;      ///< --model-attn-ratio A:S
  std::int64_t state_dim = 0;  ///< --model-state-dim N
};

/// Registers --model-attn-ratio and --model-state-dim with their --help text.
inline void add_model_options(CLI::App& sub, model_cli& o) {
  sub.add_option("--model-attn-ratio", o.attn_ratio,
                 "Marconi's layer ablation: A:S attention:SSM layers (e.g. 1:2, 1:6, 1:13; 0:1 pure SSM, 1:0 pure "
                 "attention) over the preset's mixer-layer count; default: the preset's own layers");
  sub.add_option("--model-state-dim", o.state_dim,
                 "Marconi's state ablation: the SSM state dimension N of a Mamba preset (16 = Mamba-1, 128 = "
                 "Mamba-2); default: the preset's")
      ->default_str("");
}

/// The preset `name` with the flags applied. @throws hybridcache::invalid_argument naming an
/// unknown preset, or the flag and its value when it is malformed or cannot apply.
[[nodiscard]] inline hybridcache::model_spec resolve_model(const std::string& name, const model_cli& o,
                                                           const CLI::App& sub) {
  hybridcache::model_spec preset = hybridcache::presets::preset(name);  // throws naming an unknown preset
  hybridcache::model_overrides over;
  if (given(sub, "--model-attn-ratio")) {
    try {
      over.attention_ratio = hybridcache::parse_layer_ratio(o.attn_ratio);
    } catch (const hybridcache::invalid_argument& e) {
      throw hybridcache::invalid_argument("--model-attn-ratio: " + strip_library_prefix(e.what()));
    }
  }
  if (given(sub, "--model-state-dim")) over.state_dim = o.state_dim;
  try {
    return hybridcache::with_overrides(std::move(preset), over);
  } catch (const hybridcache::invalid_argument& e) {
    const std::string what = strip_library_prefix(e.what());
    // with_overrides names the override it refused; say the flag the user typed.
    const bool ratio = what.rfind("attention_ratio", 0) == 0;
    const bool dim = what.rfind("state_dim", 0) == 0;
    if (ratio) throw hybridcache::invalid_argument("--model-attn-ratio: " + what);
    if (dim) throw hybridcache::invalid_argument("--model-state-dim: " + what);
    throw hybridcache::invalid_argument("--model " + name + " with --model-attn-ratio/--model-state-dim: " + what);
  }
}

}  // namespace hcbench
