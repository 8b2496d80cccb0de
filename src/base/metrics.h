// Metrics (JSON lines) and the progress line rank 0 prints.
#pragma once
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace strata {

// One JSON object per line; values are numbers or strings. Opened in append mode so a resumed
// run continues the same file and nothing already written is lost.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  explicit MetricsWriter(const std::string& path);  // throws UserError if it cannot be opened
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  using Field = std::pair<std::string, std::string>;  // key, JSON-encoded value
  void write(const std::vector<Field>& fields);
  bool enabled() const { return f_ != nullptr; }

 private:
  FILE* f_ = nullptr;
};

std::string json_number(double v);  // NaN/Inf become null (JSON has no NaN)
std::string json_string(const std::string& s);

// Updates one line in place on a terminal; prints plain lines when output goes to a file.
// mode: "auto" | "inplace" | "lines" | "off". Under mpirun/srun stdout is often a pty that
// ends in a log file, so "auto" prints plain lines whenever a launcher started the rank.
class ProgressLine {
 public:
  explicit ProgressLine(const std::string& mode);
  bool in_place() const { return tty_; }
  void update(const std::string& text, bool force_newline);
  void finish();  // ends an in-place line

 private:
  bool enabled_, tty_, open_ = false;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "42s"

}  // namespace strata
