// Operations metrics for Prometheus: rank 0 rewrites one text-format file (PATH.prom) after
// every log interval, atomically (temporary file, rename), for node_exporter's textfile
// collector (--collector.textfile.directory). Every series carries the labels
// slurm_job_id="<id>" ("" outside Slurm) and run="<last component of output.dir>".
// The names and their meaning are listed in kPrometheusSeries (docs/operations.md, "Prometheus metrics";
// slurm/grafana-strata.json graphs them).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "run/goodput.h"

namespace strata {

struct PrometheusSeries {
  const char* name;
  const char* help;
};
// Every series strata writes (the dashboard test checks the dashboard against this list).
extern const std::vector<PrometheusSeries> kPrometheusSeries;

// What one update reports.
struct TrainingGauges {
  int64_t step = 0;
  double loss = 0, samples_per_s = 0, tokens_per_s = 0;
  double step_s = 0;               // mean step wall time over the last log interval
  double allreduce_exposed_s = 0;  // mean per step over the last interval
  double progress_age_s = -1;      // the watchdog's; < 0 when it is off
  int64_t slurm_restart_count = 0;
  GoodputFigures goodput;
};

class PrometheusFile {
 public:
  PrometheusFile() = default;  // inactive
  // Throws UserError naming the path if it does not end in .prom or its directory cannot be
  // created or written (call where all ranks agree on input errors).
  PrometheusFile(std::string path, const std::string& job_id, const std::string& run);
  bool active() const { return !path_.empty(); }
  // The newest finished checkpoint: the file is rewritten with it at once (after the first
  // update), so the file left at the end names the last checkpoint drained at run end.
  void note_checkpoint(int64_t step, double write_s, double stall_s, int64_t bytes);
  // Rewrites the file; a failed write is a warning (once) and training goes on.
  void write(const TrainingGauges& g);

 private:
  std::string path_, labels_;
  int64_t ckpt_step_ = -1, ckpt_bytes_ = 0;
  double ckpt_write_s_ = 0, ckpt_stall_s_ = 0;
  bool warned_ = false;
  std::optional<TrainingGauges> last_;  // the last update's, rewritten with a new checkpoint
};

// A label value in the text format: backslash, double quote and newline escaped.
std::string prometheus_label_value(const std::string& v);
// The run label: the last component of output.dir ("runs/fmnist_cnn/" -> "fmnist_cnn").
std::string run_name_of(const std::string& output_dir);

}  // namespace strata
