// Tracer: spans in memory during the traced steps; one merged Chrome trace file at the end.
#include "comm/trace.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <utility>

#include <fmt/format.h>

#include "base/files.h"
#include "base/metrics.h"
#include "strata/error.h"

namespace strata {

Tracer::Tracer(int64_t first_step, int64_t steps)
    : first_(first_step), steps_(steps), origin_(Clock::now()) {}

void Tracer::set_origin() { origin_ = Clock::now(); }

void Tracer::begin_step(int64_t step) {
  step_ = step;
  recording_ = enabled() && step >= first_ && step - first_ < steps_;
}

void Tracer::span(const char* cat, const std::string& name, Clock::time_point t0,
                  Clock::time_point t1, int micro) {
  if (!recording_) return;
  if (int64_t(spans_.size()) >= kMaxSpans) {
    ++dropped_;
    return;
  }
  spans_.push_back({cat, name, t0, t1, step_, micro});
}

Tracer::Scope::Scope(Tracer& t, const char* cat, std::string name, int micro)
    : t_(t.recording() ? &t : nullptr), cat_(cat), name_(std::move(name)), micro_(micro) {
  if (t_) t0_ = Clock::now();
}

Tracer::Scope::~Scope() {
  if (t_) t_->span(cat_, name_, t0_, Clock::now(), micro_);
}

// This rank's events as one JSON fragment, each event preceded by ",\n" so that rank 0 can
// append the fragments of all ranks one after another.
std::string Tracer::events_json(int rank, const std::string& label) const {
  fmt::memory_buffer out;
  auto it = std::back_inserter(out);
  const std::string row =
      dropped_ ? fmt::format("{} ({} spans past {} dropped)", label, dropped_, kMaxSpans) : label;
  fmt::format_to(it, ",\n{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"args\":{{\"name\":{}}}}}",
                 rank, json_string(row));
  fmt::format_to(it, ",\n{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{},"
                     "\"args\":{{\"sort_index\":{}}}}}",
                 rank, rank);
  using us = std::chrono::duration<double, std::micro>;
  for (const Span& s : spans_) {
    // Three decimals: the steady clock's nanoseconds, in the microseconds the format uses.
    fmt::format_to(it, ",\n{{\"name\":{},\"cat\":{},\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f},"
                       "\"pid\":{},\"tid\":0,\"args\":{{\"step\":{}",
                   json_string(s.name), json_string(s.cat), us(s.t0 - origin_).count(),
                   us(s.t1 - s.t0).count(), rank, s.step);
    if (s.micro >= 0) fmt::format_to(it, ",\"micro\":{}", s.micro);
    fmt::format_to(it, "}}}}");
  }
  return fmt::to_string(out);
}

int64_t Tracer::write(Comm& world, const std::string& path, const std::string& label) {
  if (!enabled()) return 0;
  const int rank = world.rank(), size = world.size();
  std::string mine = events_json(rank, label);

  // Comm has no gather: one allreduce for every rank's length and span count, then each rank's
  // bytes in a broadcast from that rank. Traces are a few MB, so the copies the other ranks
  // receive and drop cost little; rank 0 streams each fragment to the file as it arrives.
  std::vector<int64_t> counts(2 * size_t(size), 0);
  counts[2 * size_t(rank)] = int64_t(mine.size());
  counts[2 * size_t(rank) + 1] = int64_t(spans_.size());
  world.allreduce_sum(counts.data(), int64_t(counts.size()));

  const std::string tmp = path + ".tmp";
  FILE* f = rank == 0 ? std::fopen(tmp.c_str(), "wb") : nullptr;
  int err = rank == 0 && !f ? (errno ? errno : EIO) : 0;  // rank 0: the first failure's errno
  auto put = [&](const char* p, size_t n) {
    if (f && !err && std::fwrite(p, 1, n, f) != n) err = errno ? errno : EIO;
  };
  const std::string head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", tail = "\n]}\n";
  put(head.data(), head.size());
  // Rank 0's fragment is never empty (it has the metadata); its leading "," is dropped.
  if (rank == 0) put(mine.data() + 1, mine.size() - 1);
  for (int r = 1; r < size; ++r) {
    std::string buf = r == rank ? std::move(mine) : std::string(size_t(counts[2 * size_t(r)]), '\0');
    world.broadcast(buf.data(), int64_t(buf.size()), r);
    put(buf.data(), buf.size());
  }
  put(tail.data(), tail.size());
  std::string error;  // rank 0: why `path` was not written
  if (f && std::fclose(f) != 0 && !err) err = errno ? errno : EIO;
  if (err) {
    if (f) std::remove(tmp.c_str());
    error = fmt::format("{}: cannot write the trace to {} ({})", path, tmp, std::strerror(err));
  } else if (f) {
    try {
      publish_file(tmp, path);  // fsync + rename: never a half-written file under `path`
    } catch (const UserError& e) {
      error = e.what();
    }
  }

  // Every rank learns whether rank 0 failed, so all of them leave by the same exception.
  int64_t failed = error.empty() ? 0 : 1;
  world.broadcast(&failed, sizeof failed, 0);
  if (failed) {
    if (rank == 0) fail_input("{}", error);
    throw AgreedFailure(kExitBadInput, "");
  }
  if (rank != 0) return 0;
  int64_t total = 0;
  for (int r = 0; r < size; ++r) total += counts[2 * size_t(r) + 1];
  return total;
}

}  // namespace strata
