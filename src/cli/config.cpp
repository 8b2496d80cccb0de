// `strata config --get KEY --config F [train's flags]`: one key's value as a run would resolve
// it (the file, then the flags; checkpoint.dir, output.params and output.metrics with their
// defaults filled in from output.dir), on one line, so job scripts read a config without a
// TOML parser of their own. Strings print as they are, other values as TOML.
#include "cli/commands.h"

#include <fmt/format.h>

#include "strata/error.h"

namespace strata::cli {
namespace {

std::string resolved(const RunConfig& cfg, const std::string& key) {
  if (key == "checkpoint.dir") return cfg.checkpoint_dir();
  if (key == "output.params") return cfg.params_path();
  if (key == "output.metrics") return cfg.metrics_path();
  RunConfig copy = cfg;
  std::string near;
  const auto keys = config_keys(copy);
  const ConfigKey* k = find_config_key(keys, key, &near);
  if (!k)
    fail_input("--get {}: unknown key{}", key, near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near));
  if (auto* s = std::get_if<std::string*>(&k->field)) return **s;
  return k->to_toml();
}

}  // namespace

Subcommand add_config(CLI::App& app) {
  struct Opts {
    TrainFlags flags;
    std::string get;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("config", "print a config key as a run resolves it (for job scripts)");
  sub->add_option("--get", o->get, "the key (section.key), e.g. checkpoint.dir")->required();
  add_train_flags(*sub, o->flags);
  return {sub, [o](Comm& comm) {
            if (comm.rank() != 0) return int(kExitOk);
            apply_train_flags(o->flags);
            fmt::print("{}\n", resolved(o->flags.cfg, o->get));
            return int(kExitOk);
          }};
}

}  // namespace strata::cli
