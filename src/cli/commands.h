// The commands of the command line, one file each in cli/ (main.cpp parses and dispatches):
// each adds its CLI11 subcommand and what runs it on every rank.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

#include "config/config.h"
#include "strata/comm.h"

namespace strata::cli {

// A subcommand: CLI11 fills its options (kept alive by `run`), run() does it on every rank and
// returns the exit code.
struct Subcommand {
  CLI::App* app;
  std::function<int(Comm&)> run;
};

Subcommand add_train(CLI::App& app);
Subcommand add_config(CLI::App& app);      // config --get KEY: a resolved key, for job scripts
Subcommand add_checkpoint(CLI::App& app);  // checkpoint latest DIR: the newest that verifies
std::vector<Subcommand> add_prepare(CLI::App& app);  // fashion-mnist, text
Subcommand add_eval(CLI::App& app);
Subcommand add_quantize(CLI::App& app);
Subcommand add_export(CLI::App& app);      // export --format hf|llmc: a GPT for transformers or llm.c
Subcommand add_generate(CLI::App& app);
Subcommand add_inspect(CLI::App& app);
Subcommand add_devices(CLI::App& app);
std::vector<Subcommand> add_bench(CLI::App& app);  // bench comm, ...: measuring for strata plan
Subcommand add_plan(CLI::App& app);        // plan --nodes N --ranks_per_node R: grids predicted, ranked
Subcommand add_bench_layers(CLI::App& bench);      // bench layers (bench_layers.cpp)
Subcommand add_bench_predict(CLI::App& bench);     // bench predict (hidden; bench_layers.cpp)

// `strata train`'s flags (the config file, every key as --section.key, and the run's own),
// which `strata config` takes too (train.cpp); apply_train_flags reads the file and the flags
// into cfg (UserError).
struct TrainFlags {
  RunConfig cfg;
  ConfigFlags config_flags;
  CLI::Option* threads = nullptr;
  std::string progress = "auto";
  std::string prometheus, metrics;  // --prometheus, --metrics: aliases of output.* keys
};
void add_train_flags(CLI::App& sub, TrainFlags& f);
void apply_train_flags(TrainFlags& f);

// ---- Shared by the commands (flags.cpp) ---------------------------------------------------
inline constexpr int kMaxThreads = 1024;
// Math threads per rank: --threads, else Slurm's --cpus-per-task, else 1.
int threads_from(const CLI::Option* flag, int given);
// Run-level numbers, parsed as strictly as config values (parse.h): plain decimal integers,
// finite numbers, in range. CLI11 alone takes "0x2" for 2 and "nan" for a double.
CLI::Validator int_in(int64_t lo, int64_t hi);
CLI::Validator real_in(double lo, double hi);

}  // namespace strata::cli
