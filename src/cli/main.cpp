// strata: the command line. Subcommands: prepare, train, eval, quantize, generate, inspect,
// devices.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/job.h"
#include "base/memory.h"
#include "base/parse.h"
#include "checkpoint/checkpoint.h"
#include "cli/command_line.h"
#include "config/config.h"
#include "data/prepare.h"
#include "parallel/grid.h"
#include "run/evaluate.h"
#include "run/generate.h"
#include "run/quantize.h"
#include "run/session.h"
#include "strata/backend.h"
#include "strata/comm.h"
#include "strata/error.h"

using namespace strata;

namespace {

constexpr int kMaxThreads = 1024;

// Math threads per rank: --threads, else Slurm's --cpus-per-task, else 1.
int threads_from(const CLI::Option* flag, int given) {
  if (flag->count()) return given;
  return int(env_int("SLURM_CPUS_PER_TASK", 1, kMaxThreads).value_or(1));
}

// Run-level numbers, parsed as strictly as config values (parse.h): plain decimal integers,
// finite numbers, in range. CLI11 alone takes "0x2" for 2 and "nan" for a double.
CLI::Validator int_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        std::string why;
        auto x = parse_int(v, &why);
        if (!x) return why;
        if (*x < lo || *x > hi) return fmt::format("must be in [{}, {}], got {}", lo, hi, *x);
        return "";
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}
CLI::Validator real_in(double lo, double hi) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        std::string why;
        auto x = parse_real(v, &why);
        if (!x) return why;
        if (*x < lo || *x > hi) return fmt::format("must be in [{}, {}], got {}", lo, hi, v);
        return "";
      },
      fmt::format("NUMBER in [{}, {}]", lo, hi));
}

// A JSON number; JSON has no NaN or infinity: those are null.
std::string json_value(double x) { return std::isfinite(x) ? fmt::format("{}", x) : "null"; }

struct EvalOptions {
  std::string ckpt, data, device = "auto";
  bool json = false, throughput = false;
  int threads = 1;
  int64_t batch_size = 0;  // samples per batch; 0: 1000 rows of logits
  CLI::Option* threads_flag = nullptr;
};

// p-th percentile (nearest rank) of v, which it sorts.
double percentile(std::vector<double>& v, double p) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const size_t k = size_t(std::ceil(p / 100.0 * double(v.size())));
  return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
}

// Samples per second and the latencies of the full batches, leaving out the first (it creates
// oneDNN's kernels for the shape: a cost paid once per process, not per batch served) and a
// last, partial one (another shape, and its own kernels), when there are others.
struct Throughput {
  double samples_per_s = 0;
  std::vector<double> latency;  // seconds per measured batch
  int64_t per_batch = 0;        // samples in each measured batch
};
Throughput throughput_of(const std::vector<double>& seconds, int64_t samples,
                         int64_t batch_samples) {
  Throughput t{.latency = seconds};
  std::vector<double>& lat = t.latency;
  if (lat.size() > 1 && samples % batch_samples != 0) {
    lat.pop_back();
    samples -= samples % batch_samples;
  }
  if (lat.size() > 1) {
    lat.erase(lat.begin());
    samples -= batch_samples;
  }
  double total = 0;
  for (double x : lat) total += x;
  t.samples_per_s = total > 0 ? double(samples) / total : 0.0;
  t.per_batch = lat.empty() ? 0 : samples / int64_t(lat.size());
  return t;
}

int run_eval(const EvalOptions& o, Comm& comm) {
  std::string note;
  const Backend* be = nullptr;
  LoadedParams lp;
  DatasetInfo info;
  std::unique_ptr<Model> model;
  Int8Table int8;  // an int8 file's products (strata quantize)
  collectively(comm, [&] {
    if (o.throughput && comm.size() > 1)
      fail_input("--throughput measures one process serving batches: run strata eval on one "
                 "rank (without mpirun/srun), not {}", comm.size());
    // A device asked for by name is checked first; auto takes the CPU for an int8 file (int8
    // inference is the CPU's), so it is chosen once the file is read.
    if (o.device != "auto") be = &select_backend({.device = o.device, .threads = o.threads}, &note);
    lp = load_parameters(o.ckpt);
    if (!be)
      be = &select_backend({.device = lp.int8.weights.empty() ? "auto" : "cpu",
                            .threads = o.threads}, &note);
    info = open_dataset(o.data);
    if (info.tokens && lp.input_shape.size() == 1) set_context(info, lp.input_shape[0]);
    if (!info.has_test) fail_input("{}: has no /test split to evaluate", o.data);
    if (info.test.sample_shape != lp.input_shape || info.classes != lp.classes)
      fail_input("{}: samples {} with {} classes do not fit the model in {} ({} with {} classes)",
                 o.data, shape_str(info.test.sample_shape), info.classes, o.ckpt,
                 shape_str(lp.input_shape), lp.classes);
    require_model_memory(Model::describe_layers(lp.spec, lp.input_shape, lp.classes), {}, 2, 1, 1,
                         o.ckpt);
    model = std::make_unique<Model>(lp.spec, lp.input_shape, lp.classes);
    copy_parameters_into(*model, lp, o.ckpt, &int8);
    if (!int8.weights.empty()) model->set_int8(&int8);
    model->check_backend(*be);
  });
  model->place(*be);
  const int64_t rows = model->rows_per_sample();
  const int64_t batch_samples = o.batch_size > 0 ? o.batch_size : std::max<int64_t>(1, 1000 / rows);
  std::vector<double> seconds;
  EvalResult r = evaluate(*model, *be, info, "test", comm,
                          o.batch_size > 0 ? o.batch_size * rows : 1000,
                          o.throughput ? &seconds : nullptr);
  if (comm.rank() != 0) return kExitOk;
  const std::string precision = int8.weights.empty() ? "fp32" : fmt::format("int8 ({} products)", int8.weights.size());
  if (o.json) {
    std::string extra;
    if (o.throughput) {
      auto [sps, lat, per_batch] = throughput_of(seconds, r.samples, batch_samples);
      extra = fmt::format(", \"samples_per_s\": {}, \"tokens_per_s\": {}, \"batches\": {}, "
                          "\"latency_p50_ms\": {}, \"latency_p99_ms\": {}", json_value(sps),
                          json_value(info.tokens ? sps * double(rows) : 0), lat.size(),
                          json_value(1e3 * percentile(lat, 50)), json_value(1e3 * percentile(lat, 99)));
    }
    fmt::print("{{\"accuracy\": {}, \"loss\": {}, \"samples\": {}, \"precision\": \"{}\"{}}}\n",
               json_value(r.accuracy), json_value(r.loss), r.samples,
               int8.weights.empty() ? "fp32" : "int8", extra);
    return kExitOk;
  }
  fmt::print("test accuracy {:.4f}, test loss {:.4f} over {} samples ({})\n", r.accuracy, r.loss,
             r.samples, precision);
  if (o.throughput) {
    auto [sps, lat, per_batch] = throughput_of(seconds, r.samples, batch_samples);
    fmt::print("throughput: {:.1f} samples/s{} on {} with {} thread{} ({} batches of {} samples); "
               "latency per batch p50 {:.3f} ms, p99 {:.3f} ms\n", sps,
               info.tokens ? fmt::format(" ({:.1f} tokens/s)", sps * double(rows)) : "", be->name,
               o.threads, o.threads == 1 ? "" : "s",
               lat.size(), per_batch,
               1e3 * percentile(lat, 50), 1e3 * percentile(lat, 99));
  }
  return kExitOk;
}

// `strata inspect`: what a checkpoint or parameter file holds; non-zero if it does not verify.
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

// `strata devices`: whether this node can run the CUDA backend, and if so which CUDA libraries
// it loaded from where (the start-up line of a GPU run says the same); why not otherwise.
int run_devices() {
  std::string why;
  const int gpus = cuda_devices(&why);
  if (gpus == 0)
    fmt::print("cuda: no GPU: {}\n", why);
  else
    fmt::print("cuda: {} GPU{} visible\n", gpus, gpus == 1 ? "" : "s");
  for (const auto& lib : cuda_libraries())
    fmt::print("cuda library: {} {} ({})\n", lib.soname, lib.path, lib.source);
  return kExitOk;
}

// CLI11's messages name the option; say that it is a flag.
std::string describe_parse_error(const std::string& msg) {
  return msg.rfind("--", 0) == 0 ? fmt::format("flag {}", msg) : msg;
}

// A subcommand: CLI11 fills its options (kept alive by `run`), run() does it on every rank.
struct Subcommand {
  CLI::App* app;
  std::function<int(Comm&)> run;
};

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

// `strata prepare fashion-mnist` and `strata prepare text`: rank 0 writes the file.
std::vector<Subcommand> add_prepare(CLI::App& app) {
  auto* prepare = app.add_subcommand("prepare", "convert a dataset to strata's HDF5 layout");
  prepare->require_subcommand(1);
  struct Opts {
    std::string out_path, source_dir = "/usr/share/datasets/fashion-mnist";
    std::vector<std::string> text_inputs;
    std::string text_out;
    double val_fraction = 0.1;
  };
  auto o = std::make_shared<Opts>();
  auto* fmnist = prepare->add_subcommand("fashion-mnist", "the IDX files of Debian's dataset-fashion-mnist");
  fmnist->add_option("--out", o->out_path, "output HDF5 file")->required();
  fmnist->add_option("--source", o->source_dir, "directory with the four IDX .gz files")->capture_default_str();
  auto* text = prepare->add_subcommand(
      "text", "text files as bytes (token = byte, vocab 256) for language models, e.g. Debian's "
              "fortunes: /usr/share/games/fortunes/* without the .dat and .u8 files");
  text->add_option("--input", o->text_inputs, "text files, used in this order")->required();
  text->add_option("--out", o->text_out, "output HDF5 file")->required();
  text->add_option("--val_fraction", o->val_fraction,
                   "the last fraction of each input's bytes that is the validation split")
      ->capture_default_str();
  auto prepare_fmnist = [o](Comm& comm) {
    if (comm.rank() == 0) {
      prepare_fashion_mnist(o->source_dir, o->out_path);
      fmt::print("wrote {}\n", o->out_path);
    }
    comm.barrier();
    return int(kExitOk);
  };
  auto prepare_txt = [o](Comm& comm) {
    if (comm.rank() == 0) {
      const PreparedText t = prepare_text(o->text_inputs, o->text_out, o->val_fraction);
      fmt::print("wrote {}: {} train tokens, {} val tokens, vocab {} (bytes); unigram entropy "
                 "{:.4f} nats/token ({:.4f} bits)\n",
                 o->text_out, t.train_tokens, t.val_tokens, t.vocab, t.unigram_entropy_nats,
                 t.unigram_entropy_nats / std::log(2.0));
    }
    comm.barrier();
    return int(kExitOk);
  };
  return {{fmnist, prepare_fmnist}, {text, prepare_txt}};
}

Subcommand add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  auto* eval = app.add_subcommand("eval", "evaluate a parameter file (or an int8 file from "
                                          "strata quantize) on a dataset's test split");
  eval->add_option("--checkpoint", o->ckpt, "parameter file written by train, or an int8 file")
      ->required();
  eval->add_option("--data", o->data, "HDF5 dataset with a /test split")->required();
  eval->add_flag("--json", o->json, "print {\"accuracy\": ..., \"loss\": ...}");
  o->threads_flag = eval->add_option("--threads", o->threads)->check(int_in(1, kMaxThreads));
  eval->add_option("--device", o->device)->capture_default_str();
  eval->add_option("--batch_size", o->batch_size,
                   "samples per batch (default: 1000 rows of logits, i.e. 1000 / context "
                   "sequences for a language model)")
      ->check(int_in(1, INT32_MAX));
  eval->add_flag("--throughput", o->throughput,
                 "also report samples/s (tokens/s) and each batch's latency, p50 and p99 (the first "
                 "batch, which builds the kernels, left out)");
  return {eval, [o](Comm& comm) {
            collectively(comm, [&] { o->threads = threads_from(o->threads_flag, o->threads); });
            return run_eval(*o, comm);
          }};
}

Subcommand add_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  auto* q = app.add_subcommand("quantize", "write an int8 file (linear layers' weights int8, "
                                           "per output channel) for strata eval and generate");
  q->add_option("--checkpoint", o->checkpoint, "parameter file or checkpoint of a run")->required();
  q->add_option("--out", o->out, "the int8 file to write (.h5)")->required();
  q->add_option("--calibrate", o->calibrate,
                "static activation scales from N batches of --data's train split (default 0: "
                "each row's own scale at run time)")
      ->check(int_in(0, INT32_MAX));
  q->add_option("--data", o->data, "HDF5 dataset for --calibrate");
  q->add_option("--batch_size", o->batch_size, "samples per calibration batch")
      ->check(int_in(1, INT32_MAX))->capture_default_str();
  auto* threads = q->add_option("--threads", o->threads)->check(int_in(1, kMaxThreads));
  return {q, [o, threads](Comm& comm) {
            o->threads = threads_from(threads, o->threads);
            return comm.rank() == 0 ? run_quantize(*o) : int(kExitOk);
          }};
}

Subcommand add_generate(CLI::App& app) {
  struct Opts {
    GenerateOptions gen;
    CLI::Option* threads = nullptr;
  };
  auto o = std::make_shared<Opts>();
  GenerateOptions& gen = o->gen;
  auto* generate = app.add_subcommand("generate", "sample text from a trained GPT (model.type = \"gpt\")");
  generate->add_option("--checkpoint", gen.checkpoint, "model.h5 or a checkpoint of a gpt run")->required();
  generate->add_option("--prompt", gen.prompt, "text to continue (bytes)")->capture_default_str();
  generate->add_option("--tokens", gen.tokens, "tokens (bytes) to generate")
      ->check(int_in(0, INT32_MAX))->capture_default_str();
  generate->add_option("--temperature", gen.temperature, "0 = always the most likely token")
      ->check(real_in(0, 1e6))
      ->capture_default_str();
  generate->add_option("--top_k", gen.top_k, "sample among the k most likely (0 = all)")
      ->check(int_in(0, INT32_MAX))
      ->capture_default_str();
  generate->add_option("--seed", gen.seed, "the same seed gives the same text")
      ->check(int_in(0, INT64_MAX))->capture_default_str();
  o->threads = generate->add_option("--threads", gen.threads)->check(int_in(1, kMaxThreads));
  generate->add_option("--device", gen.device, "auto | cpu | cuda (auto: the CPU for an int8 file)")
      ->capture_default_str();
  return {generate, [o](Comm& comm) {
            o->gen.threads = threads_from(o->threads, o->gen.threads);
            return comm.rank() == 0 ? run_generate(o->gen) : int(kExitOk);
          }};
}

std::vector<Subcommand> add_rank0_tools(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto* inspect = app.add_subcommand("inspect", "print what a checkpoint holds and verify its checksums");
  inspect->add_option("path", *path, "checkpoint or parameter file (.h5)")->required();
  auto* devices = app.add_subcommand(
      "devices", "whether this node can run the CUDA backend, and which CUDA libraries it found "
                 "where (or why not)");
  return {{inspect, [path](Comm& comm) { return comm.rank() == 0 ? run_inspect(*path) : int(kExitOk); }},
          {devices, [](Comm& comm) { return comm.rank() == 0 ? run_devices() : int(kExitOk); }}};
}

// Parses the command line on every rank. Returns true when it asked for help or the version
// (rank 0 printed it); a bad command line throws (rank 0 alone reports it).
bool parse_command_line(CLI::App& app, int argc, char** argv, bool lead) {
  try {
    std::vector<std::string> args;
    try {  // strata's own reading first (command_line.h): TOML arrays, unknown names
      args = expand_list_flags(std::vector<std::string>(argv + 1, argv + argc));
      check_commands_and_flags(app, args);
    } catch (const UserError&) {
      if (!lead) throw AgreedFailure(kExitBadInput, "");
      throw;
    }
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    app.parse(args);
    return false;
  } catch (const CLI::CallForHelp& e) {
    if (lead) app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    if (lead) app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    if (lead) app.exit(e);
  } catch (const CLI::Error& e) {
    // Every rank parsed the same arguments: rank 0 alone reports.
    if (!lead) throw AgreedFailure(kExitBadInput, "");
    throw UserError(kExitBadInput, describe_parse_error(e.what()));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  mpi_init(&argc, &argv);
  // Stop signals only set a flag from the start: a rank srun TERMs while another rank fails
  // still exits with its own code (the training loop acts on the flag).
  install_stop_handlers();
  // Line-buffered even into a file or pipe (Slurm logs): a line is in the log when printed,
  // not lost in a buffer if the job is killed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto comm = make_world_comm();
  const bool lead = comm->rank() == 0;

  CLI::App app{"strata: a Slurm-native MPI training runtime"};
  app.set_version_flag("--version", fmt::format("strata {} ({})", STRATA_VERSION, STRATA_GIT_COMMIT));
  app.require_subcommand(1);
  std::vector<Subcommand> commands = {add_train(app)};
  for (auto& c : add_prepare(app)) commands.push_back(std::move(c));
  commands.push_back(add_eval(app));
  commands.push_back(add_quantize(app));
  commands.push_back(add_generate(app));
  for (auto& c : add_rank0_tools(app)) commands.push_back(std::move(c));

  int code = kExitOk;
  try {
    if (parse_command_line(app, argc, argv, lead)) {
      mpi_finalize();
      return kExitOk;
    }
    for (auto& c : commands)
      if (*c.app) {
        const CLI::App* parent = c.app->get_parent();
        const std::string what = "running strata " + (parent && parent->get_parent()
                                                          ? parent->get_name() + " " : std::string()) +
                                 c.app->get_name();
        AllocationScope scope(what.c_str());
        arm_allocation_failures();
        code = c.run(*comm);
      }
  } catch (const AgreedFailure& e) {
    code = e.code;
  } catch (const UserError& e) {
    // Errors found by all ranks alike are printed once; others name the rank.
    fmt::print(stderr, "strata: error: {}{}\n", comm->size() > 1 ? fmt::format("rank {} ({}): ", comm->rank(), comm->host()) : "", e.what());
    code = e.code;
  } catch (const std::bad_alloc& e) {
    // Past the memory check: another process took the memory, or an estimate fell short. The
    // report itself may find no memory: then without the bound.
    arm_allocation_failures(false);
    std::string bound = "memory left unknown";
    try {
      bound = memory_bound().source;
    } catch (const std::bad_alloc&) {
    }
    fmt::print(stderr, "strata: error: rank {} ({}): {} ({}; exit {})\n", comm->rank(), comm->host(),
               dynamic_cast<const OutOfMemory*>(&e) ? e.what() : "out of memory", bound,
               int(kExitOutOfMemory));
    std::fflush(stderr);
    if (comm->size() > 1) mpi_abort(kExitOutOfMemory);  // the other ranks cannot go on
    code = kExitOutOfMemory;
  } catch (const std::exception& e) {
    fmt::print(stderr, "strata: internal error on rank {} ({}): {}\n", comm->rank(), comm->host(), e.what());
    std::fflush(stderr);
    mpi_abort(kExitInternal);
  }
  std::fflush(stdout);
  mpi_finalize();
  return code;
}
