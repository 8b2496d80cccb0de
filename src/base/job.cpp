#include "base/job.h"

#include <unistd.h>

#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <atomic>
#include <chrono>
#include <thread>

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "base/parse.h"
#include "base/subprocess.h"
#include "strata/error.h"

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

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 20 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A Slurm job id from the environment: digits only (it reaches squeue's arguments and every
// checkpoint's provenance). Anything else is refused, naming the variable.
std::string env_job_id(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return "";
  if (!all_digits(v))
    fail_input("environment variable {}='{}': not a Slurm job id (digits only)", name,
               std::string(v).substr(0, 40));
  return v;
}

}  // namespace

std::string slurm_job_id() {
  const std::string array = env_job_id("SLURM_ARRAY_JOB_ID"), task = env_job_id("SLURM_ARRAY_TASK_ID");
  if (!array.empty() && !task.empty()) return fmt::format("{}_{}", array, task);
  return env_job_id("SLURM_JOB_ID");
}

int64_t slurm_restart_count() {
  return env_int("SLURM_RESTART_COUNT", 0, std::numeric_limits<int32_t>::max()).value_or(0);
}

namespace {
// Before main: the closest this process can tell to its own start.
const double g_process_start = unix_now();

// A unix time from the environment (the sbatch script's clock); a node's clock a little ahead
// of this one's must not make time run backwards.
double env_time_or(const char* name, double fallback) {
  const double t = env_real(name, 1, 1e12).value_or(fallback);
  return std::min(t, unix_now());
}
}  // namespace

std::string slurm_node_name() {
  const char* v = std::getenv("SLURMD_NODENAME");
  if (!v || !*v) {
    char buf[256] = {0};
    gethostname(buf, sizeof buf - 1);
    return buf;
  }
  const std::string s = v;
  const bool ok = s.size() <= 128 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (!ok)
    fail_input("environment variable SLURMD_NODENAME='{}': not a node name (letters, digits, "
               "'.', '_', '-')", s.substr(0, 40));
  return s;
}

double launch_time() { return env_time_or("STRATA_STEP_START", g_process_start); }
double attempt_start_time() { return env_time_or("STRATA_ATTEMPT_START", launch_time()); }

std::optional<double> job_end_time(std::string* why_not) {
  // The sbatch script sets STRATA_JOB_END_TIME from squeue at every attempt; a value already
  // past is one inherited from somewhere else, and would stop every attempt after one step.
  if (auto t = env_real("STRATA_JOB_END_TIME", 1, 1e12)) {
    if (*t <= unix_now())
      fail_input("environment variable STRATA_JOB_END_TIME={:.0f}: the job's end time is {:.0f} s "
                 "in the past (unset it; slurm/train.sbatch sets it from squeue)", *t,
                 unix_now() - *t);
    return t;
  }
  const std::string id = slurm_job_id();
  if (id.empty()) return std::nullopt;
  // No shell: squeue gets the id as one argument (and only digits and '_' reach it).
  auto out = run_program({"squeue", "-h", "-j", id, "-o", "%e"}, 10.0, why_not, 128);
  if (!out) return std::nullopt;
  std::string line = out->substr(0, out->find('\n'));
  while (!line.empty() && line.back() == ' ') line.pop_back();
  if (line.empty()) {
    *why_not = fmt::format("squeue printed no end time for job {}", id);
    return std::nullopt;
  }
  if (line == "N/A" || line == "NONE" || line == "Unknown") return std::nullopt;  // no limit
  auto t = parse_slurm_time(line);
  if (!t) *why_not = fmt::format("cannot parse squeue's end time '{}'", line.substr(0, 40));
  return t;
}

bool started_by_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_FD"})
    if (std::getenv(v)) return true;
  return false;
}

// The launcher that started this process set its own variable: Open MPI's mpirun
// (OMPI_COMM_WORLD_LOCAL_RANK) or MPICH's Hydra (MPI_LOCALRANKID) first, since a job step's
// SLURM_LOCALID is inherited unchanged by every rank that mpirun starts inside an
// allocation; then srun's SLURM_LOCALID.
NodeLocalRank node_local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (auto r = env_int(v, 0, 1 << 20)) return {int(*r), v};
  return {0, "launched alone"};
}

void check_job_environment() {
  slurm_job_id();
  slurm_restart_count();
  slurm_node_name();
  attempt_start_time();  // and launch_time()
  // The node-local rank picks this rank's GPU (backend.cpp); checked even where none is used.
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    env_int(v, 0, 1 << 20);
  std::string ignored;
  if (std::getenv("STRATA_JOB_END_TIME")) job_end_time(&ignored);
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
