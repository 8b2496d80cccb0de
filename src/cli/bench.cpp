// `strata bench ...`: measuring the machine for `strata plan` (docs/planning.md). One
// subcommand per function below, each registered in add_bench.
#include "cli/commands.h"

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/files.h"
#include "plan/comm_bench.h"
#include "strata/error.h"

namespace strata::cli {

namespace {

// `strata bench comm`: the collectives' times per size and level, as a table and a JSON profile.
Subcommand add_bench_comm(CLI::App& bench) {
  struct Opts {
    CommBenchOptions bench;
    std::string min_bytes = "8", max_bytes = "1G", out, progress = "auto";
    std::vector<std::string> ops = {"allreduce", "reduce_scatter", "all_gather", "sendrecv"};
  };
  auto o = std::make_shared<Opts>();
  auto* sub = bench.add_subcommand(
      "comm", "time allreduce, reduce-scatter, all-gather and send/receive over the ranks it is "
              "launched on (mpirun/srun, >= 2 ranks), within a node and across nodes, every "
              "result checked; prints a table and writes the JSON profile strata plan reads");
  sub->add_option("--min_bytes", o->min_bytes, "smallest message, a power of 2 (8, 64K, 1M, 1G)")
      ->capture_default_str();
  sub->add_option("--max_bytes", o->max_bytes, "largest message, a power of 2 (at most 4G)")
      ->capture_default_str();
  sub->add_option("--ops", o->ops,
                  "comma-separated: allreduce,reduce_scatter,all_gather,sendrecv; also "
                  "allreduce_blocking (the blocking sum, MPI_Allreduce)")
      ->delimiter(',')->capture_default_str();
  sub->add_option("--iters", o->bench.iters, "timed calls per size (the median is reported)")
      ->check(int_in(1, 1000000))->capture_default_str();
  sub->add_option("--warmup", o->bench.warmup, "untimed calls per size before them")
      ->check(int_in(0, 1000000))->capture_default_str();
  sub->add_option("--rounds", o->bench.rounds,
                  "sweeps over every op and size; each size's figure is the median of its rounds' "
                  "(a shared machine's slow moment then spoils one round, not the profile)")
      ->check(int_in(1, 1000))->capture_default_str();
  sub->add_option("--out", o->out, "the JSON profile (default bench-comm-<host>-<UTC time>.json here)");
  sub->add_option("--device", o->bench.device,
                  "cpu (MPI over host memory) | cuda (NCCL over GPU memory, as training on GPUs; "
                  "needs a build with the CUDA backend) | cpu-staged (the device path on the CPU, "
                  "for tests)")
      ->check(CLI::IsMember({"cpu", "cuda", "cpu-staged"}))->capture_default_str();
  sub->add_option("--progress", o->progress, "auto | lines (a line per size on stderr) | off")
      ->check(CLI::IsMember({"auto", "inplace", "lines", "off"}))->capture_default_str();
  sub->add_flag_callback("--quiet", [o] { o->progress = "off"; }, "same as --progress off");
  auto run = [o](Comm& comm) {
    CommBenchOptions& b = o->bench;
    std::string out = o->out;
    collectively(comm, [&] {
      b.min_bytes = parse_byte_size(o->min_bytes, "--min_bytes");
      b.max_bytes = parse_byte_size(o->max_bytes, "--max_bytes");
      b.ops.clear();
      for (const auto& name : o->ops) b.ops.push_back(parse_comm_op(name, "--ops"));
      b.progress = o->progress != "off";
      if (comm.rank() == 0) {
        if (out.empty()) out = default_comm_profile_name(comm.host());
        ensure_parent_dir(out, "--out");  // also: not a directory
      }
      check_comm_bench_options(b, comm.size());
    });
    const CommProfile p = run_comm_bench(comm, b);
    collectively(comm, [&] {
      if (comm.rank() != 0) return;
      publish_text_file(out, comm_profile_json(p));
      fmt::print("wrote {}\n", out);
    });
    return int(kExitOk);
  };
  return {sub, run};
}

}  // namespace

std::vector<Subcommand> add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "measure this machine for strata plan");
  bench->require_subcommand(1);
  return {add_bench_comm(*bench), add_bench_layers(*bench), add_bench_predict(*bench)};
}

}  // namespace strata::cli
