// `strata bench layers`: each layer of a config's model timed on this node into a machine
// profile (plan/layer_bench.h); and `strata bench predict` (hidden: the step-time model's
// answer for one grid as JSON, for benchmarks/bench_plan_accuracy.py and for checking
// `strata plan`'s figures by hand).
#include <memory>

#include <fmt/format.h>

#include "base/files.h"
#include "base/metrics.h"
#include "cli/commands.h"
#include "plan/layer_bench.h"
#include "plan/step_time.h"
#include "strata/error.h"

namespace strata::cli {

Subcommand add_bench_layers(CLI::App& bench) {
  struct Opts {
    TrainFlags flags;
    std::string precision, checkpoint_dir, out = "machine-profile.json";
    std::vector<int64_t> micro_batches;
    int reps = 9;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = bench.add_subcommand(
      "layers", "time each layer of the config's model (forward, backward and its B and W halves, "
                "the optimizer) at a few micro-batch sizes on this node's device, and the "
                "checkpoint write bandwidth; writes the machine profile strata plan reads");
  add_train_flags(*sub, o->flags);
  sub->add_option("--precision", o->precision, "fp32 | bf16 (same as --train.precision)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--checkpoint_dir", o->checkpoint_dir,
                  "where to measure the checkpoint write bandwidth (default the config's "
                  "checkpoint.dir)");
  sub->add_option("--out", o->out, "the machine profile (JSON)")->capture_default_str();
  sub->add_option("--micro_batches", o->micro_batches,
                  "comma-separated micro-batch sizes (default every power of two from G/16 to G, and G, of "
                  "train.batch_size)")
      ->delimiter(',')->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  sub->add_option("--reps", o->reps, "timed runs per size after a warm-up, at least: more where a run is short (a quarter of a "
                  "second's worth, up to 25 x); the median is kept")
      ->check(int_in(1, 1000))->capture_default_str();
  auto run = [o](Comm& comm) {
    apply_train_flags(o->flags);
    RunConfig& cfg = o->flags.cfg;
    if (!o->precision.empty())
      find_config_key(config_keys(cfg), "train.precision")->set_text(o->precision, "flag --precision");
    validate(cfg);
    // (Every rank checks alike, before any waits for rank 0.) A run's own flags ask for what
    // bench layers never does: refused rather than ignored.
    for (const auto& [flag, given] : {std::pair<const char*, bool>{"--resume", cfg.resume != "never"},
                                      {"--trace", !cfg.trace.empty()}})
      if (given) fail_input("bench layers: {} does not apply (it times layers; it trains no run)", flag);
    ensure_parent_dir(o->out, "--out");  // also: not a directory
    // On several ranks they are one node's: rank 0 times the layers, and the whole pass with
    // every rank at once against alone (what the node's ranks share slows each).
    if (comm.size() > 1) {
      const std::vector<std::string> hosts = comm.all_hosts();
      for (const std::string& h : hosts)
        if (h != hosts.front())
          fail_input("bench layers: its {} ranks run on {} and {}: launch it on the ranks of one node",
                     hosts.size(), hosts.front(), h);
      if (comm.rank() != 0) {
        bench_layers_busy_peer(cfg, comm, o->reps);
        return int(kExitOk);
      }
    }
    LayerBenchOptions lo{.micro_batches = o->micro_batches, .reps = o->reps,
                         .checkpoint_dir = o->checkpoint_dir, .progress = {}, .node = &comm};
    if (cfg.progress != "off") lo.progress = [](const std::string& s) { fmt::print(stderr, "{}\n", s); };
    const MachineProfile p = bench_layers(cfg, lo);
    write_machine_profile(o->out, p);
    fmt::print("wrote {} ({} layers, {} on {})\n", o->out, p.layers.size(), p.device, p.cpu_model);
    return int(kExitOk);
  };
  return {sub, run};
}

namespace {

std::string step_time_json(const StepTime& t) {
  std::string a;
  for (const auto& s : t.assumptions) a += (a.empty() ? "" : ", ") + json_string(s);
  return fmt::format(
      "{{\"total_s\": {}, \"compute_s\": {}, \"bubble_s\": {}, \"exposed_comm_s\": {}, "
      "\"checkpoint_s\": {}, \"optimizer_s\": {}, \"tensor_comm_s\": {}, \"micro_batch\": {}, "
      "\"oversubscription\": {}, \"busy_node\": {}, \"reason\": {}, \"assumptions\": [{}]}}",
      json_number(t.total_s), json_number(t.compute_s), json_number(t.bubble_s),
      json_number(t.exposed_comm_s), json_number(t.checkpoint_s), json_number(t.optimizer_s),
      json_number(t.tensor_comm_s), json_number(t.micro_batch), json_number(t.oversubscription), json_number(t.busy_node),
      json_string(t.reason), a);
}

}  // namespace

Subcommand add_bench_predict(CLI::App& bench) {
  struct Opts {
    TrainFlags flags;
    std::string profile, comm, cluster;
    GridChoice g;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = bench.add_subcommand("predict", "one grid's predicted step time (JSON)");
  sub->group("");  // hidden: a tool for checking the model, strata plan is the command
  add_train_flags(*sub, o->flags);
  sub->add_option("--profile", o->profile,
                  "machine profile (strata bench layers); none: the cluster file's [device] projects");
  sub->add_option("--comm_profile", o->comm, "comm profile (strata bench comm)");
  sub->add_option("--cluster", o->cluster, "cluster description (TOML)");
  sub->add_option("--data", o->g.data)->check(int_in(1, 1 << 20));
  sub->add_option("--pipeline", o->g.pipeline)->check(int_in(1, 4096));
  sub->add_option("--tensor", o->g.tensor)->check(int_in(1, 4096));
  sub->add_option("--zero", o->g.zero)->check(int_in(0, 2));
  sub->add_option("--schedule", o->g.schedule);
  sub->add_option("--micro_batches", o->g.micro_batches)->check(int_in(1, 1 << 20));
  sub->add_option("--virtual_stages", o->g.virtual_stages)->check(int_in(1, 64));
  sub->add_flag("--recompute", o->g.recompute);
  sub->add_option("--ranks_per_node", o->g.ranks_per_node)->check(int_in(1, 4096));
  auto run = [o](Comm& comm) {
    if (comm.rank() != 0) return int(kExitOk);
    apply_train_flags(o->flags);
    const RunConfig& cfg = o->flags.cfg;
    validate(cfg);
    o->g.threads_per_rank = cfg.threads;
    o->g.precision = cfg.train.precision;
    const CommModel c = !o->comm.empty()    ? CommModel::from_profile(o->comm)
                        : !o->cluster.empty() ? CommModel::from_cluster(o->cluster)
                                              : CommModel();
    const MachineProfile p = o->profile.empty() ? MachineProfile{} : read_machine_profile(o->profile);
    fmt::print("{}\n", step_time_json(predict_step_time(cfg, o->g, p, c)));
    return int(kExitOk);
  };
  return {sub, run};
}

}  // namespace strata::cli
