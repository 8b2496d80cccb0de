#include "config/config.h"


#include <fmt/format.h>
#include <fmt/ranges.h>

#include "strata/error.h"

namespace strata {
namespace {

std::string toml_list(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}\"{}\"", i ? ", " : "", v[i]);
  return s + "]";
}

}  // namespace

void add_config_flags(CLI::App& sub, ConfigFlags& flags) {
  sub.add_option("--config", flags.config_path, "TOML config file; --section.key flags override it")
      ->check([](const std::string& v) { return v.empty() ? std::string("an empty path; give a TOML file") : std::string(); });
  RunConfig defaults;
  for (const ConfigKey& k : config_keys(defaults)) {
    const bool list = std::holds_alternative<std::vector<int>*>(k.field) ||
                      std::holds_alternative<std::vector<std::string>*>(k.field) || k.list_as_text;
    // Values stay text here: apply_config() parses them strictly, after the file.
    auto* o = sub.add_option("--" + k.name, flags.given[k.name], k.help);
    o->type_name(list ? "LIST" : k.expects().starts_with("an integer") ? "INT"
                       : k.expects().starts_with("a number") ? "NUMBER" : "TEXT");
    // A flag given twice: its last occurrence counts, all of its values for a list (scripts
    // append overrides to a command). trigger_on_parse makes each occurrence replace the last.
    if (!list) o->expected(1);
    o->trigger_on_parse();
    o->default_str(k.to_toml());
  }
}

void apply_config(const ConfigFlags& flags, RunConfig& cfg) {
  cfg.config_path = flags.config_path;
  if (!flags.config_path.empty()) read_config_file(flags.config_path, cfg);
  for (const ConfigKey& k : config_keys(cfg))
    if (auto it = flags.given.find(k.name); it != flags.given.end() && !it->second.empty()) {
      k.set_from_flag(it->second);
      cfg.given[k.name] = "flag --" + k.name;
    }
  apply_model_preset(cfg);
}

void validate(const RunConfig& c) {
  if (c.model.type == "custom" && c.model.layers.empty())
    fail_input("model.layers: model.type = \"custom\" needs a list of layers");
  if (c.model.type == "cnn" && c.model.kernel % 2 == 0)
    fail_input("model.kernel: {} is even; use an odd size so padding keeps the shape", c.model.kernel);
  if (c.train.min_lr > c.train.lr)
    fail_input("train.min_lr: {} is larger than train.lr = {}", c.train.min_lr, c.train.lr);
  if (c.threads < 1) fail_input("--threads: {} must be at least 1", c.threads);
  // Heartbeats come at most every 20 ms: a shorter silence would name live ranks.
  if (c.watchdog.heartbeat_timeout_s > 0 && c.watchdog.heartbeat_timeout_s < 0.5)
    fail_input("watchdog.heartbeat_timeout_s = {}: below 0.5 s live ranks would be named (0 = "
               "watchdog.timeout_s)", c.watchdog.heartbeat_timeout_s);
  if (c.checkpoint.memory_budget > 0 && c.checkpoint.memory_every <= 0)
    fail_input("checkpoint.memory_budget = {} needs checkpoint.memory_every, the interval it "
               "starts from (memory checkpoints are off)", c.checkpoint.memory_budget);
  if (!c.output.prometheus.empty() && !c.output.prometheus.ends_with(".prom"))
    fail_input("output.prometheus {}: must end in .prom (node_exporter's textfile collector "
               "reads only *.prom files)", c.output.prometheus);
  if (c.model.type == "gpt") {
    c.model.gpt_blocks();  // model.layers must be one positive count
    if (c.model.dim % c.model.heads != 0)
      fail_input("model.heads = {} does not divide model.dim = {}", c.model.heads, c.model.dim);
    if (c.model.heads % c.parallel.tensor != 0)
      fail_input("parallel.tensor = {} does not divide model.heads = {} (each tensor-parallel "
                 "rank holds whole attention heads)", c.parallel.tensor, c.model.heads);
  } else if (c.parallel.tensor > 1 && c.model.type != "custom") {
    fail_input("parallel.tensor = {}: tensor parallelism splits transformer blocks, and "
               "model.type = \"{}\" has none (use data or pipeline parallelism)",
               c.parallel.tensor, c.model.type);
  }
}

int RunConfig::ModelCfg::gpt_blocks() const {
  if (layers.empty()) return 4;
  int n = 0;
  size_t used = 0;
  try {
    n = std::stoi(layers[0], &used);
  } catch (const std::exception&) {
  }
  if (layers.size() != 1 || used != layers[0].size() || n < 1)
    fail_input("model.layers: for model.type = \"gpt\" it is the number of blocks (a positive "
               "integer), got {}", toml_list(layers));
  return n;
}

std::string RunConfig::params_path() const {
  return output.params.empty() ? output.dir + "/model.h5" : output.params;
}
std::string RunConfig::checkpoint_dir() const {
  return checkpoint.dir.empty() ? output.dir + "/checkpoints" : checkpoint.dir;
}
std::string RunConfig::metrics_path() const {
  return output.metrics.empty() ? output.dir + "/metrics.jsonl" : output.metrics;
}

ModelSpec RunConfig::model_spec(int classes) const {
  if (model.type == "custom") return parse_model_spec(model.layers, "model.layers");
  const float dropout = float(model.dropout);
  ModelSpec s;
  if (model.type == "gpt") {
    s.push_back(embedding_spec(model.dim, model.vocab_row_multiple()));
    if (dropout > 0) s.push_back(dropout_spec(dropout));
    for (int i = 0, n = model.gpt_blocks(); i < n; ++i)
      s.push_back(block_spec(model.heads, dropout, train.recompute == "block", model.gelu == "tanh"));
    s.push_back(layernorm_spec());
    s.push_back(lmhead_spec());
    return s;
  }
  if (model.type == "cnn")
    for (int ch : model.channels) {
      s.push_back(conv_spec(ch, model.kernel, 1, model.kernel / 2));
      s.push_back(activation_spec(model.activation));
      s.push_back(maxpool_spec(2));
    }
  s.push_back(flatten_spec());
  for (int h : model.hidden) {
    s.push_back(linear_spec(h));
    s.push_back(activation_spec(model.activation));
    if (dropout > 0) s.push_back(dropout_spec(dropout));
  }
  s.push_back(linear_spec(classes));
  return s;
}

}  // namespace strata
