// `strata train`: the config file and flags, then a training run (or --check_grid).
#include "cli/commands.h"

#include <fmt/format.h>

#include "config/config.h"
#include "run/run_plan.h"
#include "run/session.h"
#include "strata/error.h"

namespace strata::cli {

Subcommand add_train(CLI::App& app) {
  struct Opts {
    RunConfig cfg;
    ConfigFlags config_flags;
    CLI::Option* threads = nullptr;
    std::string progress = "auto";
    std::string prometheus;
    int64_t check_grid = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* train = app.add_subcommand("train", "train a model (rank 0 prints progress)");
  add_config_flags(*train, o->config_flags);
  o->threads = train->add_option("--threads", o->cfg.threads, "math threads per rank (default SLURM_CPUS_PER_TASK, else 1)")
      ->check(int_in(1, kMaxThreads));
  train->add_option("--device", o->cfg.device,
                    "auto | cpu | cuda (auto: this node-local rank's GPU when one is visible)")
      ->capture_default_str();
  train->add_option("--metrics", o->cfg.output.metrics, "JSON-lines metrics file (default DIR/metrics.jsonl)");
  train->add_option("--progress", o->progress,
                    "auto (in place on a terminal, plain lines otherwise) | inplace | lines | off")
      ->check(CLI::IsMember({"auto", "inplace", "lines", "off"}))->capture_default_str();
  train->add_option("--resume", o->cfg.resume,
                    "never | auto (newest checkpoint that verifies, if any) | PATH.h5")
      ->capture_default_str();
  train->add_option("--trace", o->cfg.trace,
                    "write a Chrome trace (chrome://tracing, ui.perfetto.dev) of a few steps, all ranks, to PATH.json");
  train->add_option("--trace_steps", o->cfg.trace_steps, "steps in the trace, from the second step run")
      ->check(int_in(1, 100000))->capture_default_str();
  train->add_flag_callback("--quiet", [o] { o->progress = "off"; }, "same as --progress off");
  train->add_option("--prometheus", o->prometheus,
                    "write Prometheus metrics to PATH.prom after every log interval (same as "
                    "--output.prometheus)");
  train->add_option("--check_grid", o->check_grid,
                    "only check that the config's grid fits RANKS ranks (exit 0, or 2 naming the "
                    "key); trains nothing (slurm/train.sbatch asks before shrinking a job)")
      ->check(int_in(1, 1 << 24));
  return {train, [o](Comm& comm) {
            RunConfig& cfg = o->cfg;
            // The file and the flags: every rank reads them; rank 0 alone reports what is wrong.
            collectively(comm, [&] {
              apply_config(o->config_flags, cfg);
              cfg.threads = threads_from(o->threads, cfg.threads);
              if (!o->prometheus.empty())  // beats the file, checked as the key is
                find_config_key(config_keys(cfg), "output.prometheus")
                    ->set_text(o->prometheus, "flag --prometheus");
            });
            cfg.progress = o->progress;
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
