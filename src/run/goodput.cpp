#include "run/goodput.h"


#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "base/files.h"
#include "base/job.h"
#include "base/metrics.h"

namespace strata {
namespace {

constexpr size_t kKeep = 64;      // checkpoint marks and restarts kept in the file
constexpr double kWriteEvery = 1;  // seconds between updates while training

// A non-negative finite number of the table, or `fallback`.
double number(const toml::table& t, const char* key, double fallback = 0) {
  const double v = t[key].value<double>().value_or(fallback);
  return std::isfinite(v) && v >= 0 ? v : fallback;
}
int64_t integer(const toml::table& t, const char* key) {
  return std::max<int64_t>(0, t[key].value<int64_t>().value_or(0));
}

template <typename T>
void keep_newest(std::vector<T>& v) {
  if (v.size() > kKeep) v.erase(v.begin(), v.end() - ptrdiff_t(kKeep));
}

}  // namespace

GoodputLedger::GoodputLedger(std::string path, std::string job_id, int64_t slurm_restart_count)
    : path_(std::move(path)), job_(std::move(job_id)), slurm_restarts_(slurm_restart_count),
      active_(!path_.empty()) {
  if (!active_) return;
  read_existing();
  if (!open_) first_start_ = attempt_start_time();
}

GoodputLedger::~GoodputLedger() {
  if (active_ && !finished_) {
    last_update_ = unix_now();
    write();
  }
}

void GoodputLedger::read_existing() {
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return;
  toml::table t;
  try {
    t = toml::parse_file(path_);
  } catch (const toml::parse_error& e) {
    fmt::print(stderr, "strata: warning: {}: unreadable goodput ledger ({}); starting a new one\n",
               path_, e.description());
    return;
  }
  if (t["version"].value<int64_t>() != 1) {
    fmt::print(stderr, "strata: warning: {}: not a version 1 goodput ledger; starting a new one\n", path_);
    return;
  }
  // Another job, or a finished run: this attempt begins a new ledger.
  if (t["job"].value<std::string>() != job_ || t["state"].value<std::string>() != "running") return;
  open_ = true;
  first_start_ = number(t, "first_start", unix_now());
  last_update_ = number(t, "last_update", first_start_);
  step_ = integer(t, "step");
  f_.restarts = integer(t, "restarts");
  f_.restores_memory = integer(t, "restores_memory");
  f_.restores_file = integer(t, "restores_file");
  f_.useful_s = number(t, "useful_s");
  f_.startup_s = number(t, "startup_s");
  f_.checkpoint_stall_s = number(t, "checkpoint_stall_s");
  f_.recompute_s = number(t, "recompute_s");
  f_.restart_gap_s = number(t, "restart_gap_s");
  if (auto* a = t["checkpoint"].as_array())
    for (auto& n : *a)
      if (auto* c = n.as_table()) marks_.push_back({integer(*c, "step"), number(*c, "useful_s")});
  if (auto* a = t["restart"].as_array())
    for (auto& n : *a)
      if (auto* r = n.as_table())
        restarts_.push_back({number(*r, "at"), integer(*r, "slurm_restart_count"),
                             integer(*r, "reached_step"), integer(*r, "resumed_step"),
                             number(*r, "recompute_s"), number(*r, "restart_gap_s"),
                             number(*r, "startup_s"), r->get_as<std::string>("source")
                                                          ? **r->get_as<std::string>("source")
                                                          : std::string()});
}

double GoodputLedger::useful_at(int64_t step) const {
  for (auto it = marks_.rbegin(); it != marks_.rend(); ++it)
    if (it->step == step) return it->useful_s;
  // Not a checkpoint this ledger saw begin (another job's, or one older than the marks kept):
  // the steps after it are counted lost in proportion to the steps.
  if (step >= step_ || step_ == 0) return f_.useful_s;
  return f_.useful_s * double(step) / double(step_);
}

void GoodputLedger::begin(int64_t start_step, const std::string& source, double useful_s) {
  if (!active_) return;
  const double now = unix_now(), launch = launch_time();
  if (!open_) {
    f_.startup_s += now - first_start_;  // the first attempt: its script's start to here
  } else {
    GoodputRestart r{.at = launch, .slurm_restart_count = slurm_restarts_, .reached_step = step_,
                     .resumed_step = start_step, .source = source};
    r.startup_s = now - launch;
    const double before = useful_s >= 0 ? useful_s : useful_at(start_step);
    // Steps the checkpoint kept that the ledger had not written yet ran after its last update.
    const double kept = std::max(0.0, before - f_.useful_s);
    r.restart_gap_s = std::max(0.0, launch - last_update_ - kept);
    r.recompute_s = std::max(0.0, f_.useful_s - before);
    f_.useful_s = before;
    f_.recompute_s += r.recompute_s;
    f_.restart_gap_s += r.restart_gap_s;
    f_.startup_s += r.startup_s;
    ++f_.restarts;
    f_.restores_memory += source == "memory";
    f_.restores_file += source == "file";
    restarts_.push_back(r);
    keep_newest(restarts_);
    // Checkpoints beyond the one resumed from belong to the abandoned history.
    std::erase_if(marks_, [&](const Mark& m) { return m.step > start_step; });
  }
  step_ = start_step;
  last_update_ = now;
  write();
}

void GoodputLedger::step_done(int64_t steps_done, double seconds) {
  if (!active_) return;
  f_.useful_s += seconds;
  step_ = steps_done;
  last_update_ = unix_now();
  if (last_update_ - last_write_ >= kWriteEvery) write();
}

void GoodputLedger::checkpoint(int64_t steps_done, double stall_s, bool write_now) {
  if (!active_) return;
  f_.checkpoint_stall_s += stall_s;
  marks_.push_back({steps_done, f_.useful_s});
  keep_newest(marks_);
  last_update_ = unix_now();
  // Before the checkpoint can be resumed from, the ledger knows its useful time (a memory
  // checkpoint's mark may be up to a second late: the checkpoint carries it, begin()).
  if (write_now || last_update_ - last_write_ >= kWriteEvery) write();
}

GoodputFigures GoodputLedger::figures() const {
  GoodputFigures f = f_;
  if (!active_) return f;
  f.wall_s = unix_now() - first_start_;
  f.other_s = std::max(0.0, f.wall_s - f.useful_s - f.startup_s - f.checkpoint_stall_s -
                                f.recompute_s - f.restart_gap_s);
  return f;
}

void GoodputLedger::finish(bool done) {
  if (!active_ || finished_) return;
  last_update_ = unix_now();
  finished_ = true;
  state_ = done ? "done" : "running";
  write();
}

void GoodputLedger::write() {
  std::string s = fmt::format(
      "# strata's goodput ledger (docs/operations.md, \"Goodput\"): rewritten by rank 0, read by the next "
      "attempt\nversion = 1\njob = {}\nstate = \"{}\"\nfirst_start = {:.6f}\nlast_update = "
      "{:.6f}\nstep = {}\nrestarts = {}\nrestores_memory = {}\nrestores_file = {}\nuseful_s = {:.6f}\nstartup_s = {:.6f}\n"
      "checkpoint_stall_s = {:.6f}\nrecompute_s = {:.6f}\nrestart_gap_s = {:.6f}\n",
      json_string(job_), state_, first_start_, last_update_, step_, f_.restarts, f_.restores_memory,
      f_.restores_file, f_.useful_s,
      f_.startup_s, f_.checkpoint_stall_s, f_.recompute_s, f_.restart_gap_s);
  for (const Mark& m : marks_)
    s += fmt::format("\n[[checkpoint]]\nstep = {}\nuseful_s = {:.6f}\n", m.step, m.useful_s);
  for (const GoodputRestart& r : restarts_)
    s += fmt::format("\n[[restart]]\nat = {:.6f}\nslurm_restart_count = {}\nreached_step = {}\n"
                     "resumed_step = {}\nrecompute_s = {:.6f}\nrestart_gap_s = {:.6f}\n"
                     "startup_s = {:.6f}\nsource = {}\n", r.at, r.slurm_restart_count,
                     r.reached_step, r.resumed_step, r.recompute_s, r.restart_gap_s, r.startup_s,
                     json_string(r.source));
  // Accounting must never stop training: a failed write is retried at the next update.
  if (replace_text_file(path_, s).empty()) last_write_ = unix_now();
}

std::string describe_goodput(const GoodputFigures& f) {
  return fmt::format(
      "goodput {:.1f}% of {} since the job's first attempt (useful {}; lost: start-up {}, "
      "checkpoint stalls {}, recomputed steps {}, restart gaps {}, other {}; {} restart{}{})",
      100 * f.ratio(), format_duration(f.wall_s), format_duration(f.useful_s),
      format_duration(f.startup_s), format_duration(f.checkpoint_stall_s),
      format_duration(f.recompute_s), format_duration(f.restart_gap_s), format_duration(f.other_s),
      f.restarts, f.restarts == 1 ? "" : "s",
      f.restores_memory == 0 ? "" : fmt::format(": {} from memory, {} from files",
                                                 f.restores_memory, f.restores_file));
}

std::vector<std::pair<std::string, std::string>> goodput_fields(const GoodputFigures& f) {
  return {{"goodput", json_number(f.ratio())},
          {"goodput_wall_s", json_number(f.wall_s)},
          {"goodput_useful_s", json_number(f.useful_s)},
          {"lost_startup_s", json_number(f.startup_s)},
          {"lost_checkpoint_stall_s", json_number(f.checkpoint_stall_s)},
          {"lost_recompute_s", json_number(f.recompute_s)},
          {"lost_restart_gap_s", json_number(f.restart_gap_s)},
          {"lost_other_s", json_number(f.other_s)},
          {"job_restarts", fmt::format("{}", f.restarts)},
          {"job_restores_memory", fmt::format("{}", f.restores_memory)},
          {"job_restores_file", fmt::format("{}", f.restores_file)}};
}

}  // namespace strata
