// `strata train`: the config file and flags, then a training run (or --check_grid).
#include "cli/commands.h"

#include <fmt/format.h>

#include "config/config.h"
#include "plan/auto_grid.h"
#include "run/memory_estimate.h"
#include "run/run_plan.h"
#include "run/session.h"
#include "strata/error.h"

namespace strata::cli {

void add_train_flags(CLI::App& sub, TrainFlags& f) {
  add_config_flags(sub, f.config_flags);
  f.threads = sub.add_option("--threads", f.cfg.threads, "math threads per rank (default SLURM_CPUS_PER_TASK, else 1)")
      ->check(int_in(1, kMaxThreads));
  sub.add_option("--device", f.cfg.device,
                 "auto | cpu | cuda (auto: this node-local rank's GPU when one is visible)")
      ->capture_default_str();
  sub.add_option("--metrics", f.metrics, "JSON-lines metrics file (default DIR/metrics.jsonl; same as "
                 "--output.metrics)");
  sub.add_option("--progress", f.progress,
                 "auto (in place on a terminal, plain lines otherwise) | inplace | lines | off")
      ->check(CLI::IsMember({"auto", "inplace", "lines", "off"}))->capture_default_str();
  sub.add_option("--resume", f.cfg.resume,
                 "never | auto (newest checkpoint that verifies, if any) | PATH.h5")
      ->check([](const std::string& v) { return v.empty() ? std::string("empty; give never, auto or a checkpoint file") : std::string(); })
      ->capture_default_str();
  sub.add_option("--trace", f.cfg.trace,
                 "write a Chrome trace (chrome://tracing, ui.perfetto.dev) of a few steps, all ranks, to PATH.json");
  sub.add_option("--trace_steps", f.cfg.trace_steps, "steps in the trace, from the second step run")
      ->check(int_in(1, 100000))->capture_default_str();
  sub.add_flag_callback("--quiet", [&f] { f.progress = "off"; }, "same as --progress off");
  sub.add_option("--prometheus", f.prometheus,
                 "write Prometheus metrics to PATH.prom after every log interval (same as "
                 "--output.prometheus)");
}

// A flag that is another name for a key: it beats the file, is checked as the key is, and both
// given with different values are an error (neither silently wins).
void apply_alias(TrainFlags& f, const std::string& value, const std::string& alias, const std::string& key) {
  if (value.empty()) return;
  const auto given = f.config_flags.given.find(key);
  if (given != f.config_flags.given.end() && !given->second.empty() && given->second.back() != value)
    fail_input("flag {} {} and --{} {} name one key: give one of them", alias, value, key, given->second.back());
  find_config_key(config_keys(f.cfg), key)->set_text(value, "flag " + alias);
}

void apply_train_flags(TrainFlags& f) {
  apply_config(f.config_flags, f.cfg);
  f.cfg.threads = threads_from(f.threads, f.cfg.threads);
  apply_alias(f, f.prometheus, "--prometheus", "output.prometheus");
  apply_alias(f, f.metrics, "--metrics", "output.metrics");
  f.cfg.progress = f.progress;
}

Subcommand add_train(CLI::App& app) {
  struct Opts {
    TrainFlags flags;
    int64_t check_grid = 0, check_grid_per_node = 0;
    bool dry_run = false;
  };
  auto o = std::make_shared<Opts>();
  auto* train = app.add_subcommand("train", "train a model (rank 0 prints progress)");
  add_train_flags(*train, o->flags);
  train->add_option("--check_grid", o->check_grid,
                    "only check that the config's grid fits RANKS ranks (exit 0, or 2 naming the "
                    "key); trains nothing (slurm/train.sbatch asks before shrinking a job)")
      ->check(int_in(1, 1 << 24));
  train->add_option("--check_grid_ranks_per_node", o->check_grid_per_node,
                    "with --check_grid under parallel.auto: the ranks placed on each node (default: "
                    "all RANKS on one), whose memory they share")
      ->check(int_in(1, 1 << 24));
  train->add_flag("--dry_run", o->dry_run,
                  "plan the run on these ranks (config, data, grid, model) and print its `plan:` "
                  "line, the parameter count and memory per rank; allocates and trains nothing");
  return {train, [o](Comm& comm) {
            RunConfig& cfg = o->flags.cfg;
            // The file and the flags: every rank reads them; rank 0 alone reports what is wrong.
            collectively(comm, [&] { apply_train_flags(o->flags); });
            // parallel.auto: the grid keys chosen for these ranks before the run is planned.
            if (cfg.parallel.auto_plan)
              apply_auto_grid_for(cfg, comm, int(o->check_grid), int(o->check_grid_per_node));
            if (o->dry_run) {
              const RunPlan plan = plan_run(cfg, comm);
              if (comm.rank() == 0) fmt::print("{}\n", plan_line(cfg, plan));
              return int(kExitOk);
            }
            if (o->check_grid == 0) return run_train(cfg, comm);
            const int P = cfg.parallel.pipeline_stages, T = cfg.parallel.tensor;
            GridShape g;
            collectively(comm, [&] {
              validate(cfg);
              g = grid_shape(cfg, int(o->check_grid));
            });
            if (comm.rank() == 0)
              fmt::print("the grid fits {} ranks: {} data-parallel x {} pipeline x {} tensor, {} "
                         "micro-batch{} per step\n", o->check_grid, g.D, P, T, g.M,
                         g.M == 1 ? "" : "es");
            return int(kExitOk);
          }};
}

}  // namespace strata::cli
