// `strata inspect`: what a checkpoint or parameter file holds, every checksum verified.
#include "cli/commands.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/checkpoint.h"
#include "config/model_spec.h"
#include "strata/error.h"

namespace strata::cli {

// `strata inspect`: what a checkpoint or parameter file holds; non-zero if it does not verify.
namespace {

int run_inspect(const std::string& path) {
  LoadedCheckpoint ck = read_checkpoint(path, /*tolerate_mismatch=*/true);
  const TrainState& s = ck.state;
  const Provenance& p = ck.prov;
  fmt::print("{}: {}\n", path, ck.format);
  if (ck.format == "strata-checkpoint") {
    fmt::print("step {}  (next batch: epoch {}, batch {})  checkpoint #{}  global batch {}  seed {}\n",
               s.step, s.epoch + 1, s.batch, s.sequence, s.global_batch, s.seed);
    fmt::print("optimizer {} after {} steps\n", s.optimizer, s.optimizer_steps);
    fmt::print("written {} by {} rank{} (data parallel {} x stages {} x tensor {}) on {}\n",
               p.created_utc, p.grid_ranks, p.grid_ranks == 1 ? "" : "s", p.grid_data_parallel,
               p.grid_stages, p.grid_tensor, fmt::join(p.hosts, ", "));
    if (!p.slurm_job_id.empty())
      fmt::print("slurm job {} (restart {})\n", p.slurm_job_id, p.slurm_restart_count);
    fmt::print("dataset {} sha256 {}\n", p.dataset_path, p.dataset_sha256);
  } else {
    fmt::print("step {}\n", s.step);
  }
  fmt::print("model: {} -> {} classes: {}\n", shape_str(ck.input_shape), ck.classes, fmt::join(spec_texts(ck.spec), ", "));
  if (auto t = p.tokenizer.find("tokenizer"); t != p.tokenizer.end()) {
    auto dir = p.tokenizer.find("tokenizer_vocab");
    fmt::print("tokenizer {}{}\n", t->second, dir == p.tokenizer.end() ? "" : " from " + dir->second);
  }
  // The config summary: the keys that define the run.
  for (const char* key : {"lr =", "lr_schedule", "epochs", "max_steps", "weight_decay", "momentum"})
    for (size_t a = 0, b; a < p.config_toml.size(); a = b + 1) {
      b = p.config_toml.find('\n', a);
      if (b == std::string::npos) b = p.config_toml.size();
      if (p.config_toml.compare(a, std::strlen(key), key) == 0)
        fmt::print("  train.{}\n", p.config_toml.substr(a, b - a));
    }
  int64_t bytes = 0;
  int bad = 0;
  fmt::print("tensors:\n");
  for (const auto& [name, shape] : ck.shapes) {
    const std::string& status = ck.checksum.at(name);
    bytes += numel(shape) * 4;
    bad += status != "ok" && status != "none";
    fmt::print("  {:<40} {:<14} float32  crc32 {}\n", name, shape_str(shape), status);
  }
  if (!ck.int8.weights.empty()) {
    fmt::print("int8 products (strata quantize: q int8, per output channel):\n");
    for (const auto& [name, w] : ck.int8.weights) {
      const std::string q = "/int8" + param_path(name).substr(7) + "/q";
      fmt::print("  {:<40} ({}, {})  int8     crc32 {}  from {}, activations {}\n", q, w.rows,
                 w.cols, ck.checksum.count(q) ? ck.checksum.at(q) : "none", w.source,
                 w.act_scale > 0 ? fmt::format("static scale {:.4g}", w.act_scale) : "per row");
      bytes += int64_t(w.q.size());
      bad += ck.checksum.count(q) && ck.checksum.at(q) != "ok";
    }
  }
  fmt::print("{} tensors, {:.2f} MB; {}\n", ck.shapes.size() + ck.int8.weights.size(), double(bytes) / 1e6,
             bad ? fmt::format("{} FAIL their checksum", bad) : std::string("all checksums verify"));
  fmt::print("read and verified in {:.3f} s ({:.0f} MB/s)\n", ck.read_seconds,
             double(ck.tensor_bytes) / 1e6 / std::max(ck.read_seconds, 1e-9));
  if (bad) {
    std::fflush(stdout);
    fmt::print(stderr, "strata: error: {}: {} of {} tensors do not verify (listed above)\n", path,
               bad, ck.shapes.size());
    return kExitBadCheckpoint;
  }
  return kExitOk;
}

}  // namespace

Subcommand add_inspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto* inspect = app.add_subcommand("inspect", "print what a checkpoint holds and verify its checksums");
  inspect->add_option("path", *path, "checkpoint or parameter file (.h5)")->required();
  return {inspect, [path](Comm& comm) { return comm.rank() == 0 ? run_inspect(*path) : int(kExitOk); }};
}

}  // namespace strata::cli
