// The one list of config keys, and the checked stores every source of a value goes through.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/config.h"
#include "strata/error.h"

namespace strata {

const std::vector<std::string>& pipeline_schedules() {
  static const std::vector<std::string> all{"1f1b", "gpipe", "zb-h1", "zb-h2", "interleaved"};
  return all;
}
namespace {

constexpr double kInf = 1e308;
Range above(double lo) { return {.lo = lo, .hi = kInf, .open_lo = true}; }
Range at_least(double lo) { return {.lo = lo, .hi = kInf}; }
Range in(double lo, double hi) { return {.lo = lo, .hi = hi}; }
// Counts stored in an `int` field stay within it; int64 fields take what TOML can hold.
const Range kCount = in(1, INT_MAX), kCountOrZero = in(0, INT_MAX);
const Range kCount64 = at_least(1), kCountOrZero64 = at_least(0);
const Range kFraction = in(0, 0.9999);
// Layer sizes stay within 2^24 (model.cpp), so the layers' size products fit int arithmetic.
const Range kSize = in(1, 1 << 24);

ConfigKey key(std::string name, ConfigKey::Field field, Range range, std::string help) {
  ConfigKey k;
  k.name = std::move(name);
  k.field = field;
  k.range = range;
  k.help = std::move(help);
  return k;
}
ConfigKey text(std::string name, std::string* field, std::vector<std::string> choices,
               std::string help) {
  ConfigKey k = key(std::move(name), field, {}, std::move(help));
  k.choices = std::move(choices);
  return k;
}
std::string toml_quoted(const std::string& s);  // below

ConfigKey text_or_list(std::string name, std::string* field, std::string help) {
  ConfigKey k = key(std::move(name), field, {}, std::move(help));
  k.list_as_text = true;
  return k;
}
ConfigKey layers(std::string name, std::vector<std::string>* field, std::string help) {
  ConfigKey k = key(std::move(name), field, {}, std::move(help));
  k.count_or_list = true;
  return k;
}

// A config's text ends up in file paths, HDF5 attributes and one-line messages: control
// characters (a newline in a layer spec would split it in two) are refused everywhere.
void check_text(const std::string& v, const std::string& where) {
  for (unsigned char c : v)
    if (c < 0x20 || c == 0x7f)
      fail_input("{}: contains a control character (0x{:02x})", where, int(c));
}

// parallel.auto's keys (plan/auto_grid.h), kept apart so config_keys stays short.
std::vector<ConfigKey> auto_plan_keys(RunConfig& c) {
  return {
      key("parallel.auto", &c.parallel.auto_plan, {},
          "choose the grid (P, T, ZeRO, schedule, micro-batches, recompute) for the ranks "
          "launched: the best that fits (docs/planning.md)"),
      key("parallel.memory_per_rank", &c.parallel.memory_per_rank, in(0, 1e18),
          "parallel.auto: bytes a rank may take (0 = the node's memory / its ranks)"),
      text("parallel.profile", &c.parallel.profile, {},
           "parallel.auto: a machine profile (strata bench layers) to time grids (\"\" = none)"),
      text("parallel.comm", &c.parallel.comm, {},
           "parallel.auto: a comm profile (JSON) or cluster description (TOML) (\"\" = none)"),
  };
}

// The checkpoint keys (checkpoint/checkpointer.h, memory_checkpoints.h), after the parallel ones.
std::vector<ConfigKey> checkpoint_keys(RunConfig& c) {
  return {
      text("checkpoint.dir", &c.checkpoint.dir, {}, "checkpoint directory (\"\" = OUTPUT_DIR/checkpoints)"),
      key("checkpoint.every_steps", &c.checkpoint.every_steps, kCountOrZero64,
          "steps between checkpoints (0 = off)"),
      key("checkpoint.every_seconds", &c.checkpoint.every_seconds, at_least(0),
          "seconds between checkpoints (0 = off)"),
      key("checkpoint.keep_last", &c.checkpoint.keep_last, kCount64, "newest checkpoints kept"),
      key("checkpoint.keep_every", &c.checkpoint.keep_every, kCountOrZero64,
          "keep every M-th checkpoint for good (0 = none)"),
      key("checkpoint.final", &c.checkpoint.final, {}, "write a checkpoint when training ends"),
      text("checkpoint.writer", &c.checkpoint.writer, {"auto", "rank0", "parallel"},
           "with parallel.zero: auto | rank0 (shards gathered, rank 0 writes) | parallel (every "
           "rank writes its shard, parallel HDF5)"),
      key("checkpoint.async", &c.checkpoint.async, {},
          "write periodic checkpoints in the background (training stalls only for a copy)"),
      text("checkpoint.local_dir", &c.checkpoint.local_dir, {},
           "node-local directory written first, copied to checkpoint.dir in the background "
           "(\"\" = off; %n = the node's name)"),
      key("checkpoint.memory_every", &c.checkpoint.memory_every, kCountOrZero64,
          "steps between checkpoints in node memory, copied to a partner node (0 = off)"),
      key("checkpoint.memory_budget", &c.checkpoint.memory_budget, in(0, 1),
          "largest share of step time for memory checkpoints: sets their interval (0 = fixed)"),
      text("checkpoint.memory_dir", &c.checkpoint.memory_dir, {},
           "node memory (tmpfs) directory of memory checkpoints (\"\" = /dev/shm/strata-<job>; "
           "%n = the node's name)"),
  };
}

}  // namespace

std::vector<ConfigKey> config_keys(RunConfig& c) {
  std::vector<ConfigKey> keys = {
      text_or_list("data.path", &c.data.path,
                   "HDF5 data file, or token shards: a file, a list of files or a glob "
                   "(docs/models-and-data.md, Data format)"),
      text("data.format", &c.data.format, {"auto", "hdf5", "llmc", "nanogpt"},
           "auto | hdf5 | llmc | nanogpt (auto: told from each file)"),
      text_or_list("data.val_path", &c.data.val_path,
                   "token shards' validation split, as data.path (\"\" = the train path with "
                   "\"train\" read as \"val\", when that names files)"),

      text("model.type", &c.model.type, {"mlp", "cnn", "custom", "gpt"}, "mlp | cnn | custom | gpt"),
      key("model.hidden", &c.model.hidden, kSize, "hidden linear widths"),
      text("model.activation", &c.model.activation, {"relu", "gelu", "silu"}, "relu | gelu | silu"),
      key("model.channels", &c.model.channels, kSize, "cnn: conv output channels"),
      key("model.kernel", &c.model.kernel, in(1, 15), "cnn: conv kernel size (odd)"),
      key("model.dropout", &c.model.dropout, in(0, 0.99), "dropout after hidden activations"),
      layers("model.layers", &c.model.layers,
             "custom: layer specs (docs/models-and-data.md); gpt: the number of blocks"),
      key("model.heads", &c.model.heads, kSize, "gpt: attention heads"),
      key("model.dim", &c.model.dim, kSize, "gpt: model width"),
      key("model.context", &c.model.context, kSize, "gpt: tokens per sample"),
      key("model.vocab", &c.model.vocab, in(0, 1 << 24), "gpt: vocabulary (0 = the data's)"),
      text("model.preset", &c.model.preset, model_presets(),
           "none | gpt2 | gpt2-medium | gpt2-large | gpt2-xl: GPT-2's published shapes (sets "
           "model.type, layers, heads, dim, context, vocab)"),
      key("model.pad_vocab", &c.model.pad_vocab, {},
          "gpt: token table rows padded to a multiple of 128 (default on with a preset)"),
      text("model.gelu", &c.model.gelu, {"erf", "tanh"},
           "gpt: erf | tanh: the blocks' GELU (tanh is GPT-2's; default tanh with a preset)"),

      key("train.epochs", &c.train.epochs, kCount64, "passes over the training split"),
      key("train.batch_size", &c.train.batch_size, kCount64, "GLOBAL batch over all ranks"),
      text("train.optimizer", &c.train.optimizer, {"sgd", "adamw"}, "sgd | adamw"),
      key("train.lr", &c.train.lr, above(0), "learning rate"),
      key("train.momentum", &c.train.momentum, kFraction, "sgd momentum"),
      key("train.nesterov", &c.train.nesterov, {}, "sgd: Nesterov momentum"),
      key("train.weight_decay", &c.train.weight_decay, at_least(0), "decoupled for adamw"),
      key("train.beta1", &c.train.beta1, kFraction, "adamw"),
      key("train.beta2", &c.train.beta2, in(0, 0.99999), "adamw"),
      key("train.eps", &c.train.eps, above(0), "adamw"),
      text("train.lr_schedule", &c.train.lr_schedule, {"constant", "cosine"}, "constant | cosine"),
      key("train.warmup_steps", &c.train.warmup_steps, kCountOrZero64, "linear warmup steps"),
      key("train.min_lr", &c.train.min_lr, at_least(0), "cosine: the rate at the last step"),
      key("train.grad_clip", &c.train.grad_clip, at_least(0), "max global grad norm, 0 = off"),
      key("train.seed", &c.train.seed, kCountOrZero64, "initialisation, shuffling, dropout"),
      key("train.log_every", &c.train.log_every, kCount64, "steps between metrics lines"),
      key("train.max_steps", &c.train.max_steps, kCountOrZero64, "stop after N steps (0 = all epochs)"),
      text("train.precision", &c.train.precision, {"fp32", "bf16"},
           "fp32 | bf16 (bf16 GEMMs and convolutions on a GPU; fp32 master weights)"),
      text("train.recompute", &c.train.recompute, {"none", "block"},
           "none | block: recompute transformer blocks in backward (less memory)"),
      text("train.init_from", &c.train.init_from, {},
           "gpt: start from a Hugging Face GPT-2 directory or an llm.c model file (docs/checkpoints.md)"),

      key("dp.bucket_mb", &c.dp.bucket_mb, in(0.001, 4096), "gradient allreduce bucket size (MiB)"),
      key("dp.overlap", &c.dp.overlap, {}, "overlap allreduce with backward"),

      key("parallel.pipeline_stages", &c.parallel.pipeline_stages, in(1, 4096),
          "pipeline stages P (data-parallel width = ranks / (P T))"),
      key("parallel.tensor", &c.parallel.tensor, in(1, 4096),
          "tensor-parallel ranks T splitting each transformer block's heads and MLP"),
      key("parallel.microbatches", &c.parallel.microbatches, in(0, 4096),
          "micro-batches per step (0 = auto: largest divisor of the per-replica batch up to 4 P)"),
      text("parallel.schedule", &c.parallel.schedule, pipeline_schedules(),
           "1f1b | gpipe | zb-h1 | zb-h2 (zero-bubble: backward split into input and weight "
           "gradients) | interleaved (parallel.virtual_stages chunks per stage)"),
      key("parallel.virtual_stages", &c.parallel.virtual_stages, in(1, 64),
          "model chunks per pipeline stage, for the interleaved schedule (2 or more)"),
      key("parallel.stage_layers", &c.parallel.stage_layers, in(0, 1 << 20),
          "layers per stage (per chunk when interleaved), as the model summary lists them "
          "([] = balanced by cost)"),
      text("parallel.balance", &c.parallel.balance, {"estimated", "measured"},
           "cost the partition balances: estimated (FLOPs) | measured (each layer timed on rank 0)"),
      text("parallel.placement", &c.parallel.placement, {"replicas_in_node", "pipeline_in_node"},
           "replicas_in_node (a stage's replicas on consecutive ranks) | pipeline_in_node"),
      key("parallel.zero", &c.parallel.zero, in(0, 2),
          "ZeRO: 0 = every replica holds the whole optimizer state | 1 = each holds 1/D of it "
          "| 2 = and 1/D of the gradient sum (reduce-scatter)"),

  };
  const std::vector<ConfigKey> ckpt = checkpoint_keys(c);
  keys.insert(keys.end(), ckpt.begin(), ckpt.end());
  keys.insert(keys.end(), {
      key("watchdog.timeout_s", &c.watchdog.timeout_s, in(0, 1e7),
          "abort naming a rank stuck this long (0 = off)"),
      key("watchdog.heartbeat_timeout_s", &c.watchdog.heartbeat_timeout_s, in(0, 1e7),
          "abort naming a rank whose heartbeats stopped this long (at most timeout_s; 0 = timeout_s)"),

      text("output.dir", &c.output.dir, {}, "where model.h5 and metrics.jsonl go"),
      text("output.params", &c.output.params, {}, "final parameters (\"\" = OUTPUT_DIR/model.h5)"),
      text("output.metrics", &c.output.metrics, {}, "JSON lines (\"\" = OUTPUT_DIR/metrics.jsonl)"),
      text("output.prometheus", &c.output.prometheus, {},
           "Prometheus text file (*.prom) for node_exporter's textfile collector (\"\" = none)"),
  });
  // After the other parallel keys.
  const auto zero = std::find_if(keys.begin(), keys.end(), [](const ConfigKey& k) { return k.name == "parallel.zero"; });
  std::vector<ConfigKey> plan = auto_plan_keys(c);
  keys.insert(zero + 1, plan.begin(), plan.end());
  return keys;
}

std::string ConfigKey::expects() const {
  if (count_or_list) return "a list of layer strings (custom) or a block count (gpt)";
  if (list_as_text) return "a string or a list of strings";
  return std::visit(
      [this](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) return "true or false";
        else if constexpr (std::is_integral_v<T>) return "an integer " + range.describe();
        else if constexpr (std::is_floating_point_v<T>) return "a number " + range.describe();
        else if constexpr (std::is_same_v<T, std::string>)
          return choices.empty() ? "a string" : fmt::format("one of {}", fmt::join(choices, ", "));
        else if constexpr (std::is_same_v<T, std::vector<int>>) return "a list of integers " + range.describe();
        else return "a list of strings";
      },
      field);
}

void ConfigKey::set_int(int64_t v, const std::string& where) const {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if (auto why = range.check(double(v), std::to_string(v)); !why.empty())
            fail_input("{}: {}", where, why);
          *p = T(v);  // in range, hence representable (the ranges stay within each type)
        } else if constexpr (std::is_floating_point_v<T>) {
          set_real(double(v), std::to_string(v), where);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          if (!count_or_list) fail_input("{}: expected {}, got an integer", where, expects());
          *p = {std::to_string(v)};
        } else {
          fail_input("{}: expected {}, got an integer", where, expects());
        }
      },
      field);
}

void ConfigKey::set_real(double v, std::string_view written, const std::string& where) const {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_floating_point_v<T>) {
          if (!std::isfinite(v)) fail_input("{}: must be a finite number, got {}", where, written);
          if (auto why = range.check(v, written); !why.empty()) fail_input("{}: {}", where, why);
          // The kernels compute in fp32: a value fp32 cannot hold would become inf or 0 there.
          if (std::fabs(v) > double(FLT_MAX) || (v != 0 && std::fabs(v) < double(FLT_MIN)))
            fail_input("{}: {} is beyond what a 32-bit float holds (the kernels compute in fp32)",
                       where, written);
          *p = T(v);
        } else {
          fail_input("{}: expected {}, got {}", where, expects(), written);
        }
      },
      field);
}

void ConfigKey::set_bool(bool v, const std::string& where) const {
  if (auto* p = std::get_if<bool*>(&field)) **p = v;
  else fail_input("{}: expected {}, got {}", where, expects(), v);
}

void ConfigKey::set_text(const std::string& v, const std::string& where) const {
  auto* p = std::get_if<std::string*>(&field);
  if (!p) fail_input("{}: expected {}, got a string", where, expects());
  check_text(v, where);
  if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
    fail_input("{}: expected one of {}, got '{}'", where, fmt::join(choices, ", "), v);
  **p = v;
}

void ConfigKey::set_int_list(const std::vector<int64_t>& v, const std::string& where) const {
  auto* p = std::get_if<std::vector<int>*>(&field);
  if (!p) fail_input("{}: expected {}, got a list of integers", where, expects());
  std::vector<int> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (auto why = range.check(double(v[i]), std::to_string(v[i])); !why.empty())
      fail_input("{}: element {}: {}", where, i + 1, why);
    out.push_back(int(v[i]));
  }
  **p = std::move(out);
}

void ConfigKey::set_text_list(const std::vector<std::string>& v, const std::string& where) const {
  if (auto* s = std::get_if<std::string*>(&field); s && list_as_text) {
    std::vector<std::string> q;
    for (const auto& e : v) check_text(e, where), q.push_back(toml_quoted(e));
    return set_text(fmt::format("[{}]", fmt::join(q, ", ")), where);
  }
  auto* p = std::get_if<std::vector<std::string>*>(&field);
  if (!p) fail_input("{}: expected {}, got a list of strings", where, expects());
  for (const auto& s : v) check_text(s, where);
  **p = v;
}

// A flag's values, as the user typed them: the same checks as a file's, on strictly parsed text.
void ConfigKey::set_from_flag(const std::vector<std::string>& texts) const {
  const std::string where = "flag --" + name;
  auto one = [&]() -> const std::string& {
    if (texts.size() != 1) fail_input("{}: expected one value, got {}", where, texts.size());
    return texts[0];
  };
  std::string why;
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          const std::string& s = one();
          if (s != "true" && s != "false")
            fail_input("{}: expected true or false, got '{}'", where, s);
          set_bool(s == "true", where);
        } else if constexpr (std::is_integral_v<T>) {
          auto v = parse_int(one(), &why);
          if (!v) fail_input("{}: {}", where, why);
          set_int(*v, where);
        } else if constexpr (std::is_floating_point_v<T>) {
          auto v = parse_real(one(), &why);
          if (!v) fail_input("{}: {}", where, why);
          set_real(*v, one(), where);
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (list_as_text && texts.size() > 1) set_text_list(texts, where);
          else set_text(one(), where);
        } else if constexpr (std::is_same_v<T, std::vector<int>>) {
          std::vector<int64_t> vs;
          for (const auto& s : texts) {
            auto v = parse_int(s, &why);
            if (!v) fail_input("{}: {}", where, why);
            vs.push_back(*v);
          }
          set_int_list(vs, where);
        } else {
          set_text_list(texts, where);
        }
      },
      field);
}

namespace {
std::string toml_quoted(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') o += '\\', o += ch;
    else if (c < 0x20 || c == 0x7f) o += fmt::format("\\u{:04x}", int(c));
    else o += ch;
  }
  return o + "\"";
}
// The shortest text that reads back to the same value, written as a TOML float.
template <typename F>
std::string toml_real(F v) {
  std::string s = fmt::format("{}", v);  // a float as a float: 0.1f is "0.1", not 0.100000001
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}
}  // namespace

std::string ConfigKey::to_toml() const {
  return std::visit(
      [this](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_integral_v<T>) return std::to_string(*p);
        else if constexpr (std::is_floating_point_v<T>) return toml_real(*p);
        else if constexpr (std::is_same_v<T, std::string>)
          return list_as_text && p->starts_with('[') ? *p : toml_quoted(*p);
        else if constexpr (std::is_same_v<T, std::vector<int>>) return fmt::format("[{}]", fmt::join(*p, ", "));
        else {
          std::vector<std::string> q;
          for (const auto& s : *p) q.push_back(toml_quoted(s));
          return fmt::format("[{}]", fmt::join(q, ", "));
        }
      },
      field);
}

const ConfigKey* find_config_key(const std::vector<ConfigKey>& keys, std::string_view name,
                                 std::string* suggestion) {
  for (const auto& k : keys)
    if (k.name == name) return &k;
  if (!suggestion) return nullptr;
  std::vector<std::string> names;
  for (const auto& k : keys) names.push_back(k.name);
  *suggestion = closest_name(name, names);
  return nullptr;
}

}  // namespace strata
