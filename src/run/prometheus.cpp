#include "run/prometheus.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "base/files.h"
#include "strata/error.h"

namespace strata {

const std::vector<PrometheusSeries> kPrometheusSeries = {
    {"strata_step", "optimizer steps done"},
    {"strata_loss", "training loss at the last logged step"},
    {"strata_samples_per_second", "training samples per second over the last log interval"},
    {"strata_tokens_per_second", "language models: tokens (positions) per second over the last log interval; 0 for other models"},
    {"strata_step_seconds", "mean wall time of a step over the last log interval"},
    {"strata_allreduce_exposed_seconds", "mean time per step rank 0 spent in the gradient allreduce outside backward"},
    {"strata_checkpoint_step", "step of the newest finished checkpoint (-1: none yet in this attempt)"},
    {"strata_checkpoint_write_seconds", "write time of the newest finished checkpoint"},
    {"strata_checkpoint_stall_seconds", "training-thread stall of the newest finished checkpoint"},
    {"strata_checkpoint_bytes", "size of the newest finished checkpoint"},
    {"strata_job_restarts", "restarts of this job so far: in the allocation and requeued"},
    {"strata_job_restores", "restarts of this job so far by where they resumed from: source=\"memory\" (memory checkpoints) or \"file\" (checkpoint files)"},
    {"strata_slurm_restart_count", "requeues of this job (SLURM_RESTART_COUNT)"},
    {"strata_watchdog_progress_age_seconds", "seconds since the least recent progress of any rank rank 0's watchdog watches"},
    {"strata_goodput_ratio", "useful step time / wall time since the job's first attempt"},
    {"strata_goodput_wall_seconds", "wall time since the job's first attempt"},
    {"strata_goodput_useful_seconds", "step time of the steps in the run's history"},
    {"strata_goodput_lost_seconds", "time lost since the job's first attempt, by cause"},
};

std::string prometheus_label_value(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

std::string run_name_of(const std::string& output_dir) {
  std::string d = output_dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return std::filesystem::path(d).filename().string();
}

PrometheusFile::PrometheusFile(std::string path, const std::string& job_id, const std::string& run)
    : path_(std::move(path)) {
  if (!path_.ends_with(".prom"))
    fail_input("output.prometheus {}: must end in .prom (node_exporter's textfile collector reads "
               "only *.prom files)", path_);
  ensure_parent_dir(path_, "output.prometheus");
  labels_ = fmt::format("slurm_job_id=\"{}\",run=\"{}\"", prometheus_label_value(job_id),
                        prometheus_label_value(run));
}

void PrometheusFile::note_checkpoint(int64_t step, double write_s, double stall_s, int64_t bytes) {
  ckpt_step_ = step;
  ckpt_write_s_ = write_s;
  ckpt_stall_s_ = stall_s;
  ckpt_bytes_ = bytes;
  if (last_) write(TrainingGauges(*last_));
}

namespace {
struct Sample {
  const char* name;
  double value;
  const char* cause = nullptr;  // strata_goodput_lost_seconds only
  const char* label = "cause";
};
// The text format spells non-finite values NaN, +Inf, -Inf.
std::string prom_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}
}  // namespace

void PrometheusFile::write(const TrainingGauges& g) {
  if (!active()) return;
  last_ = g;
  const GoodputFigures& f = g.goodput;
  std::vector<Sample> samples = {
      {"strata_step", double(g.step)}, {"strata_loss", g.loss},
      {"strata_samples_per_second", g.samples_per_s}, {"strata_tokens_per_second", g.tokens_per_s},
      {"strata_step_seconds", g.step_s}, {"strata_allreduce_exposed_seconds", g.allreduce_exposed_s},
      {"strata_checkpoint_step", double(ckpt_step_)}, {"strata_checkpoint_write_seconds", ckpt_write_s_},
      {"strata_checkpoint_stall_seconds", ckpt_stall_s_}, {"strata_checkpoint_bytes", double(ckpt_bytes_)},
      {"strata_job_restarts", double(f.restarts)},
      {"strata_job_restores", double(f.restores_memory), "memory", "source"},
      {"strata_job_restores", double(f.restores_file), "file", "source"},
      {"strata_slurm_restart_count", double(g.slurm_restart_count)},
      {"strata_goodput_ratio", f.ratio()}, {"strata_goodput_wall_seconds", f.wall_s},
      {"strata_goodput_useful_seconds", f.useful_s},
      {"strata_goodput_lost_seconds", f.startup_s, "startup"},
      {"strata_goodput_lost_seconds", f.checkpoint_stall_s, "checkpoint_stall"},
      {"strata_goodput_lost_seconds", f.recompute_s, "recompute"},
      {"strata_goodput_lost_seconds", f.restart_gap_s, "restart_gap"},
      {"strata_goodput_lost_seconds", f.other_s, "other"}};
  if (g.progress_age_s >= 0)  // the watchdog is on
    samples.push_back({"strata_watchdog_progress_age_seconds", g.progress_age_s});
  std::string s;
  for (const PrometheusSeries& m : kPrometheusSeries) {
    bool header = false;
    for (const Sample& x : samples) {
      if (std::string_view(x.name) != m.name) continue;
      if (!header) s += fmt::format("# HELP {} {}\n# TYPE {} gauge\n", m.name, m.help, m.name);
      header = true;
      s += x.cause ? fmt::format("{}{{{},{}=\"{}\"}} {}\n", m.name, labels_, x.label, x.cause, prom_number(x.value))
                   : fmt::format("{}{{{}}} {}\n", m.name, labels_, prom_number(x.value));
    }
  }
  // node_exporter reads only *.prom: the temporary name (PATH.tmp.PID) does not end in it.
  const std::string why = replace_text_file(path_, s);
  if (!why.empty() && !warned_)
    fmt::print(stderr, "strata: warning: output.prometheus {}: cannot write it ({}); training "
               "goes on\n", path_, why);
  warned_ = warned_ || !why.empty();
}

}  // namespace strata
