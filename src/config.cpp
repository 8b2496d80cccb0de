#include "strata/config.h"

#include <cmath>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "strata/error.h"

namespace strata {
namespace {

// CLI11 2.1 maps TOML sections to subcommands. We want `[train] epochs = 2` to set the option
// `--train.epochs` of the subcommand being run, exactly as the flag would: drop the section
// markers ("++"/"--"), rename each item to "section.key" and route it to that subcommand.
class SectionToFlagConfig : public CLI::ConfigTOML {
 public:
  explicit SectionToFlagConfig(std::string sub) : sub_(std::move(sub)) {}
  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    std::vector<CLI::ConfigItem> out;
    for (auto& item : CLI::ConfigTOML::from_config(in)) {
      if (item.name == "++" || item.name == "--") continue;
      std::string name = item.name;
      for (auto it = item.parents.rbegin(); it != item.parents.rend(); ++it) name = *it + "." + name;
      item.name = name;
      item.parents = {sub_};
      out.push_back(std::move(item));
    }
    return out;
  }

 private:
  std::string sub_;
};

std::string toml_list(const std::vector<int>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }
std::string toml_list(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}\"{}\"", i ? ", " : "", v[i]);
  return s + "]";
}

// Validators with messages a user can act on ("must be > 0, got -1").
CLI::Validator number_in(double lo, double hi, bool integer, bool open_lo = false) {
  std::string what = integer ? "an integer" : "a number";
  std::string range = open_lo ? fmt::format("> {}", lo)
                      : hi == INFINITY ? fmt::format(">= {}", lo)
                                       : fmt::format("in [{}, {}]", lo, hi);
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        char* end = nullptr;
        double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0' || (integer && x != std::floor(x)))
          return fmt::format("expected {} {}, got '{}'", what, range, v);
        if (x < lo || x > hi || (open_lo && x <= lo))
          return fmt::format("must be {}, got {}", range, v);
        return "";
      },
      fmt::format("{} {}", integer ? "INT" : "NUMBER", range));
}
const auto kPositive = number_in(0, INFINITY, false, true);
const auto kNonNegative = number_in(0, INFINITY, false);
const auto kCount = number_in(1, INFINITY, true);       // 1, 2, ...
const auto kCountOrZero = number_in(0, INFINITY, true); // 0, 1, ...
const auto kFraction = number_in(0, 0.9999, false);     // [0, 1)

}  // namespace

void add_config_options(CLI::App& sub, RunConfig& c) {
  auto nonneg = kNonNegative;
  auto pos = kPositive;
  sub.add_option("--data.path", c.data.path, "HDF5 dataset (see README: Data format)")
      ->capture_default_str();

  sub.add_option("--model.type", c.model.type, "mlp | cnn | custom | gpt")
      ->check(CLI::IsMember({"mlp", "cnn", "custom", "gpt"}))->capture_default_str();
  sub.add_option("--model.hidden", c.model.hidden, "hidden linear widths")
      ->check(kCount)->capture_default_str();
  sub.add_option("--model.activation", c.model.activation, "relu | gelu")
      ->check(CLI::IsMember({"relu", "gelu"}))->capture_default_str();
  sub.add_option("--model.channels", c.model.channels, "cnn: conv output channels")
      ->check(kCount)->capture_default_str();
  sub.add_option("--model.kernel", c.model.kernel, "cnn: conv kernel size (odd)")
      ->check(number_in(1, 15, true))->capture_default_str();
  sub.add_option("--model.dropout", c.model.dropout, "dropout after hidden activations")
      ->check(number_in(0, 0.99, false))->capture_default_str();
  sub.add_option("--model.layers", c.model.layers,
                 "custom: layer specs (README: Models); gpt: the number of blocks");
  sub.add_option("--model.heads", c.model.heads, "gpt: attention heads")->check(kCount)->capture_default_str();
  sub.add_option("--model.dim", c.model.dim, "gpt: model width")->check(kCount)->capture_default_str();
  sub.add_option("--model.context", c.model.context, "gpt: tokens per sample")->check(kCount)->capture_default_str();
  sub.add_option("--model.vocab", c.model.vocab, "gpt: vocabulary (0 = the data's)")
      ->check(kCountOrZero)->capture_default_str();

  sub.add_option("--train.epochs", c.train.epochs)->check(kCount)->capture_default_str();
  sub.add_option("--train.batch_size", c.train.batch_size, "GLOBAL batch over all ranks")
      ->check(kCount)->capture_default_str();
  sub.add_option("--train.optimizer", c.train.optimizer, "sgd | adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  sub.add_option("--train.lr", c.train.lr)->check(pos)->capture_default_str();
  sub.add_option("--train.momentum", c.train.momentum)->check(kFraction)->capture_default_str();
  sub.add_option("--train.nesterov", c.train.nesterov)->capture_default_str();
  sub.add_option("--train.weight_decay", c.train.weight_decay)->check(nonneg)->capture_default_str();
  sub.add_option("--train.beta1", c.train.beta1)->check(kFraction)->capture_default_str();
  sub.add_option("--train.beta2", c.train.beta2)->check(number_in(0, 0.99999, false))->capture_default_str();
  sub.add_option("--train.eps", c.train.eps)->check(pos)->capture_default_str();
  sub.add_option("--train.lr_schedule", c.train.lr_schedule, "constant | cosine")
      ->check(CLI::IsMember({"constant", "cosine"}))->capture_default_str();
  sub.add_option("--train.warmup_steps", c.train.warmup_steps)->check(kCountOrZero)->capture_default_str();
  sub.add_option("--train.min_lr", c.train.min_lr)->check(nonneg)->capture_default_str();
  sub.add_option("--train.grad_clip", c.train.grad_clip, "max global grad norm, 0 = off")
      ->check(nonneg)->capture_default_str();
  sub.add_option("--train.seed", c.train.seed)->check(kCountOrZero)->capture_default_str();
  sub.add_option("--train.log_every", c.train.log_every, "steps between metrics lines")
      ->check(kCount)->capture_default_str();
  sub.add_option("--train.max_steps", c.train.max_steps, "stop after N steps (0 = all epochs)")
      ->check(kCountOrZero)->capture_default_str();
  sub.add_option("--train.recompute", c.train.recompute,
                 "none | block: recompute transformer blocks in backward (less memory)")
      ->check(CLI::IsMember({"none", "block"}))->capture_default_str();
  sub.add_option("--train.precision", c.train.precision,
                 "fp32 | bf16 (bf16 GEMMs and convolutions on a GPU; fp32 master weights)")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();

  sub.add_option("--dp.bucket_mb", c.dp.bucket_mb, "gradient allreduce bucket size (MiB)")
      ->check(number_in(0.001, 4096, false))->capture_default_str();
  sub.add_option("--dp.overlap", c.dp.overlap, "overlap allreduce with backward")->capture_default_str();

  sub.add_option("--parallel.pipeline_stages", c.parallel.pipeline_stages,
                 "pipeline stages P (data-parallel width = ranks / P)")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  sub.add_option("--parallel.tensor", c.parallel.tensor,
                 "tensor-parallel ranks T splitting each transformer block's heads and MLP "
                 "(data-parallel width = ranks / (P T))")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  sub.add_option("--parallel.microbatches", c.parallel.microbatches,
                 "micro-batches per step (0 = auto: largest divisor of the per-replica batch up to 4 P)")
      ->check(CLI::Range(0, 4096))->capture_default_str();
  sub.add_option("--parallel.schedule", c.parallel.schedule, "1f1b | gpipe")
      ->check(CLI::IsMember({"1f1b", "gpipe"}))->capture_default_str();
  sub.add_option("--parallel.stage_layers", c.parallel.stage_layers,
                 "layers per stage, as the model summary lists them (default: balanced by cost)")
      ->check(CLI::Range(0, 1 << 20));
  sub.add_option("--parallel.balance", c.parallel.balance,
                 "cost the partition balances: estimated (FLOPs) | measured (each layer timed on rank 0)")
      ->check(CLI::IsMember({"estimated", "measured"}))->capture_default_str();
  sub.add_option("--parallel.placement", c.parallel.placement,
                 "replicas_in_node (a stage's replicas on consecutive ranks) | pipeline_in_node")
      ->check(CLI::IsMember({"replicas_in_node", "pipeline_in_node"}))->capture_default_str();

  sub.add_option("--checkpoint.dir", c.checkpoint.dir, "checkpoint directory (default DIR/checkpoints)");
  sub.add_option("--checkpoint.every_steps", c.checkpoint.every_steps, "steps between checkpoints (0 = off)")
      ->check(kCountOrZero)->capture_default_str();
  sub.add_option("--checkpoint.every_seconds", c.checkpoint.every_seconds, "seconds between checkpoints (0 = off)")
      ->check(nonneg)->capture_default_str();
  sub.add_option("--checkpoint.keep_last", c.checkpoint.keep_last, "newest checkpoints kept")
      ->check(kCount)->capture_default_str();
  sub.add_option("--checkpoint.keep_every", c.checkpoint.keep_every, "keep every M-th checkpoint for good (0 = none)")
      ->check(kCountOrZero)->capture_default_str();
  sub.add_option("--checkpoint.final", c.checkpoint.final, "write a checkpoint when training ends")
      ->capture_default_str();

  sub.add_option("--checkpoint.async", c.checkpoint.async,
                 "write periodic checkpoints in the background (training stalls only for a copy)")
      ->capture_default_str();
  sub.add_option("--watchdog.timeout_s", c.watchdog.timeout_s, "abort naming a rank stuck this long (0 = off)")
      ->check(nonneg)->capture_default_str();

  sub.add_option("--output.dir", c.output.dir)->capture_default_str();
  sub.add_option("--output.params", c.output.params, "final parameters (default DIR/model.h5)");
  sub.add_option("--output.metrics", c.output.metrics, "JSON lines (default DIR/metrics.jsonl)");
}

void enable_toml_config(CLI::App& app, CLI::App& sub, RunConfig& cfg) {
  app.config_formatter(std::make_shared<SectionToFlagConfig>(sub.get_name()));
  app.set_config("--config", "", "TOML config file; --section.key flags override it")
      ->check(CLI::ExistingFile);
  app.allow_config_extras(CLI::config_extras_mode::error);
  sub.fallthrough();
}

void validate(const RunConfig& c) {
  if (c.model.type == "custom" && c.model.layers.empty())
    fail_input("model.layers: model.type = \"custom\" needs a list of layers");
  if (c.model.type == "cnn" && c.model.kernel % 2 == 0)
    fail_input("model.kernel: {} is even; use an odd size so padding keeps the shape", c.model.kernel);
  if (c.train.min_lr > c.train.lr)
    fail_input("train.min_lr: {} is larger than train.lr = {}", c.train.min_lr, c.train.lr);
  if (c.threads < 1) fail_input("--threads: {} must be at least 1", c.threads);
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
  if (model.type == "custom") return model.layers;
  ModelSpec s;
  if (model.type == "gpt") {
    const std::string drop = model.dropout > 0 ? fmt::format(" {}", model.dropout) : "";
    s.push_back(fmt::format("embedding {}", model.dim));
    if (model.dropout > 0) s.push_back(fmt::format("dropout {}", model.dropout));
    for (int i = 0, n = model.gpt_blocks(); i < n; ++i)
      s.push_back(fmt::format("block {}{}{}", model.heads,
                              train.recompute == "block" ? fmt::format(" {}", model.dropout) : drop,
                              train.recompute == "block" ? " recompute" : ""));
    s.push_back("layernorm");
    s.push_back("lmhead");
    return s;
  }
  auto hidden_stack = [&] {
    for (int h : model.hidden) {
      s.push_back(fmt::format("linear {}", h));
      s.push_back(model.activation);
      if (model.dropout > 0) s.push_back(fmt::format("dropout {}", model.dropout));
    }
    s.push_back(fmt::format("linear {}", classes));
  };
  if (model.type == "cnn")
    for (int ch : model.channels) {
      s.push_back(fmt::format("conv {} {} 1 {}", ch, model.kernel, model.kernel / 2));
      s.push_back(model.activation);
      s.push_back("maxpool 2");
    }
  s.push_back("flatten");
  hidden_stack();
  return s;
}

std::string RunConfig::to_toml() const {
  std::string t;
  t += fmt::format("[data]\npath = \"{}\"\n\n", data.path);
  t += fmt::format("[model]\ntype = \"{}\"\nhidden = {}\nactivation = \"{}\"\nchannels = {}\n"
                   "kernel = {}\ndropout = {}\n",
                   model.type, toml_list(model.hidden), model.activation,
                   toml_list(model.channels), model.kernel, model.dropout);
  if (!model.layers.empty()) t += fmt::format("layers = {}\n", toml_list(model.layers));
  t += fmt::format("heads = {}\ndim = {}\ncontext = {}\nvocab = {}\n", model.heads, model.dim,
                   model.context, model.vocab);
  t += fmt::format(
      "\n[train]\nepochs = {}\nbatch_size = {}\noptimizer = \"{}\"\nlr = {}\nmomentum = {}\n"
      "nesterov = {}\nweight_decay = {}\nbeta1 = {}\nbeta2 = {}\neps = {}\nlr_schedule = \"{}\"\n"
      "warmup_steps = {}\nmin_lr = {}\ngrad_clip = {}\nseed = {}\nlog_every = {}\nmax_steps = {}\n"
      "precision = \"{}\"\nrecompute = \"{}\"\n",
      train.epochs, train.batch_size, train.optimizer, train.lr, train.momentum, train.nesterov,
      train.weight_decay, train.beta1, train.beta2, train.eps, train.lr_schedule,
      train.warmup_steps, train.min_lr, train.grad_clip, train.seed, train.log_every,
      train.max_steps, train.precision, train.recompute);
  t += fmt::format("\n[dp]\nbucket_mb = {}\noverlap = {}\n", dp.bucket_mb, dp.overlap);
  t += fmt::format("\n[parallel]\npipeline_stages = {}\ntensor = {}\nmicrobatches = {}\n"
                   "schedule = \"{}\"\nstage_layers = {}\nbalance = \"{}\"\nplacement = \"{}\"\n",
                   parallel.pipeline_stages, parallel.tensor, parallel.microbatches, parallel.schedule,
                   toml_list(parallel.stage_layers), parallel.balance, parallel.placement);
  t += fmt::format("\n[checkpoint]\ndir = \"{}\"\nevery_steps = {}\nevery_seconds = {}\n"
                   "keep_last = {}\nkeep_every = {}\nfinal = {}\nasync = {}\n",
                   checkpoint.dir, checkpoint.every_steps, checkpoint.every_seconds,
                   checkpoint.keep_last, checkpoint.keep_every, checkpoint.final, checkpoint.async);
  t += fmt::format("\n[watchdog]\ntimeout_s = {}\n", watchdog.timeout_s);
  t += fmt::format("\n[output]\ndir = \"{}\"\n", output.dir);
  return t;
}

}  // namespace strata
