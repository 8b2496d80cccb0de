// model.preset: GPT-2's four published shapes (Radford et al. 2019, as the Hugging Face and
// llm.c configs give them), each a set of config keys. The preset fills the keys the config
// left alone; a key the config set must agree with it. It also turns on model.pad_vocab and
// sets model.gelu = "tanh" (GPT-2's GELU) unless the config sets them.
#include <algorithm>

#include <fmt/format.h>

#include "config/config.h"
#include "strata/error.h"

namespace strata {
namespace {

struct ModelPreset {
  const char* name;
  int blocks, heads, dim;
};
// Every GPT-2 has a context of 1024 tokens and a vocabulary of 50257 (50000 merges, 256 bytes
// and <|endoftext|>).
constexpr ModelPreset kPresets[] = {
    {"gpt2", 12, 12, 768},          // 124M
    {"gpt2-medium", 24, 16, 1024},  // 350M
    {"gpt2-large", 36, 20, 1280},   // 774M
    {"gpt2-xl", 48, 25, 1600},      // 1558M
};
constexpr int kGpt2Context = 1024, kGpt2Vocab = 50257;

// A key's value as a config file writes it (model.layers of a GPT: its block count).
std::string shown(const ConfigKey& k) {
  if (auto* v = std::get_if<std::vector<std::string>*>(&k.field); v && k.count_or_list) {
    std::string why;
    if ((*v)->size() == 1 && parse_int((**v)[0], &why)) return (**v)[0];
  }
  return k.to_toml();
}

}  // namespace

const std::vector<std::string>& model_presets() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> v{"none"};
    for (const auto& p : kPresets) v.emplace_back(p.name);
    return v;
  }();
  return all;
}

void apply_model_preset(RunConfig& cfg) {
  const ModelPreset* preset = nullptr;
  for (const auto& p : kPresets)
    if (cfg.model.preset == p.name) preset = &p;
  if (!preset) return;  // "none" (config_keys admits nothing else)
  const std::pair<const char*, std::string> values[] = {
      {"model.type", "gpt"},
      {"model.layers", std::to_string(preset->blocks)},
      {"model.heads", std::to_string(preset->heads)},
      {"model.dim", std::to_string(preset->dim)},
      {"model.context", std::to_string(kGpt2Context)},
      {"model.vocab", std::to_string(kGpt2Vocab)},
  };
  auto where = [&](const std::string& key) {
    auto it = cfg.given.find(key);
    return it == cfg.given.end() ? std::string() : it->second;
  };
  const std::string preset_at = where("model.preset");
  auto keys = config_keys(cfg);
  RunConfig want_cfg;  // the preset's values, stored by the keys' own parsers
  auto want_keys = config_keys(want_cfg);
  for (const auto& [name, value] : values) {
    const ConfigKey* k = find_config_key(keys, name);
    const ConfigKey* w = find_config_key(want_keys, name);
    w->set_from_flag({value});
    const std::string set_at = where(name);
    if (set_at.empty()) {
      k->set_from_flag({value});
    } else if (shown(*k) != shown(*w)) {
      fail_input("{}: {} = {} conflicts with model.preset = \"{}\"{}, which sets {} = {}", set_at,
                 name, shown(*k), preset->name,
                 preset_at.empty() ? "" : fmt::format(" ({})", preset_at), name, shown(*w));
    }
  }
  if (where("model.pad_vocab").empty()) cfg.model.pad_vocab = true;
  if (where("model.gelu").empty()) cfg.model.gelu = "tanh";  // GPT-2's own GELU
}

}  // namespace strata
