#include "strata/job.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <atomic>
#include <chrono>
#include <thread>

#include <fmt/format.h>

namespace strata {
namespace {

std::atomic<int> g_stop_signal{0};

void record_stop_signal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
}

extern "C" void on_stop_signal(int sig) { record_stop_signal(sig); }

// squeue prints EndTime in the cluster's local time, "2026-11-22T05:12:00", or "N/A"/"NONE".
std::optional<double> parse_slurm_time(const std::string& s) {
  std::tm tm{};
  if (strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return std::nullopt;
  tm.tm_isdst = -1;
  std::time_t t = std::mktime(&tm);
  if (t == std::time_t(-1)) return std::nullopt;
  return double(t);
}

}  // namespace

void install_stop_handlers() {
  // No thread that computes may take these signals: oneDNN's JIT sgemm kernels (Debian's 2.6)
  // point rsp into a heap workspace, so a handler run inside one writes its signal frame over
  // the heap (a later free() aborts; oneDNN issue #4845). So they are blocked in this thread and
  // in every thread it starts (OpenMP's, the watchdog's, ...), and a thread of their own takes
  // them with sigwait; threads MPI_Init started may still run the handler (it sets the flag).
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads and MPI progress continue; the loop polls the flag
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGUSR1);
  sigaddset(&stops, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stops, nullptr);
  std::thread([stops] {
    for (int sig = 0;;)
      if (sigwait(&stops, &sig) == 0) record_stop_signal(sig);
  }).detach();
}

int stop_signal() { return g_stop_signal.load(std::memory_order_relaxed); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

std::optional<double> job_end_time(std::string* why_not) {
  if (const char* e = std::getenv("STRATA_JOB_END_TIME"); e && *e) {
    char* end = nullptr;
    double t = std::strtod(e, &end);
    if (*end == '\0' && t > 0) return t;
    *why_not = fmt::format("STRATA_JOB_END_TIME='{}' is not a Unix time", e);
    return std::nullopt;
  }
  const std::string id = slurm_job_id();
  if (id.empty()) return std::nullopt;
  const std::string cmd = fmt::format("squeue -h -j '{}' -o %e 2>/dev/null", id);
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    *why_not = "cannot run squeue";
    return std::nullopt;
  }
  char buf[128] = {0};
  std::string out = std::fgets(buf, sizeof buf, p) ? buf : "";
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (out.empty()) {
    *why_not = fmt::format("squeue printed no end time for job {}", id);
    return std::nullopt;
  }
  if (out == "N/A" || out == "NONE" || out == "Unknown") return std::nullopt;  // no limit
  auto t = parse_slurm_time(out);
  if (!t) *why_not = fmt::format("cannot parse squeue's end time '{}'", out);
  return t;
}

std::string slurm_job_id() {
  const char* a = std::getenv("SLURM_ARRAY_JOB_ID");
  const char* t = std::getenv("SLURM_ARRAY_TASK_ID");
  if (a && t && *a && *t) return fmt::format("{}_{}", a, t);
  const char* j = std::getenv("SLURM_JOB_ID");
  return j ? j : "";
}

int64_t slurm_restart_count() {
  const char* r = std::getenv("SLURM_RESTART_COUNT");
  return r ? std::strtoll(r, nullptr, 10) : 0;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// strftime of a Unix time, in UTC or the local time zone.
static std::string format_time(std::time_t t, const char* format, bool utc) {
  std::tm tm{};
  if (utc) gmtime_r(&t, &tm);
  else localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string utc_now_iso() { return format_time(std::time(nullptr), "%Y-%m-%dT%H:%M:%SZ", true); }
std::string local_clock_time(double unix_s) { return format_time(std::time_t(unix_s), "%H:%M:%S", false); }

}  // namespace strata
