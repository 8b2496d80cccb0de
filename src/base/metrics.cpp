#include "base/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "base/job.h"
#include "strata/error.h"

namespace strata {

MetricsWriter::MetricsWriter(const std::string& path) {
  f_ = std::fopen(path.c_str(), "a");
  if (!f_) fail_input("{}: cannot open metrics file for appending ({})", path, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const std::vector<Field>& fields) {
  if (!f_) return;
  std::string line = "{";
  for (size_t i = 0; i < fields.size(); ++i)
    line += fmt::format("{}\"{}\": {}", i ? ", " : "", fields[i].first, fields[i].second);
  line += "}\n";
  std::fputs(line.c_str(), f_);
  std::fflush(f_);
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{}", v);
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += fmt::format("\\u{:04x}", c);
    else o += c;
  }
  return o + "\"";
}

ProgressLine::ProgressLine(const std::string& mode) : enabled_(mode != "off") {
  // A launched rank's output goes to a launcher or a Slurm step's file, not a terminal.
  const bool launched = started_by_mpi_launcher() || std::getenv("SLURM_STEP_ID");
  tty_ = mode == "inplace" || (mode == "auto" && isatty(STDOUT_FILENO) && !launched);
}

void ProgressLine::update(const std::string& text, bool force_newline) {
  if (!enabled_) return;
  if (tty_) {
    std::fputs(("\r\033[K" + text).c_str(), stdout);
    open_ = true;
    if (force_newline) { std::fputc('\n', stdout); open_ = false; }
  } else if (force_newline) {
    std::fputs((text + "\n").c_str(), stdout);
  }
  std::fflush(stdout);
}

void ProgressLine::finish() {
  if (enabled_ && tty_ && open_) { std::fputc('\n', stdout); std::fflush(stdout); }
  open_ = false;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = long(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t % 3600 / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

}  // namespace strata
