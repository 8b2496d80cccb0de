#include "checkpoint/memory_checkpoints.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "base/files.h"
#include "base/job.h"
#include "base/memory.h"
#include "base/stats.h"
#include "checkpoint/checkpoint_cache.h"
#include "checkpoint/crc32c.h"
#include "strata/lane_sums.h"
#include "strata/error.h"

namespace strata {
namespace fs = std::filesystem;
namespace {

constexpr int kTag = 0x6d63;  // the parts' messages on the world communicator
constexpr int64_t kExchangeFloats = int64_t(1) << 17;  // 512 KiB pieces
constexpr uint32_t kVersion = 2;

// A part file's header; header_crc covers the bytes before it, payload_crc the payload: its
// CRC-32C, or with `checksum` kLaneSums the CRC-32C of its lane sums (strata/lane_sums.h: a
// generation the optimizer's update wrote). The payload starts at kPayloadAt.
enum : uint32_t { kCrc32c = 0, kLaneSums = 1 };
struct Header {
  char magic[8] = {};
  uint32_t version = 0;
  int32_t part = 0, ranks = 0;
  uint32_t checksum = kCrc32c;
  int64_t step = 0, attempt = 0;
  uint64_t run = 0, job = 0, payload_bytes = 0;
  uint32_t payload_crc = 0, header_crc = 0;
};
static_assert(sizeof(Header) == 72 && sizeof(Header) <= MemoryCheckpoints::kPayloadAt);
constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'M', 'C'};
// In place of kMagic while the optimizer's update writes the file (MappedFile::mark_writing).
constexpr char kWriting[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'W', 'R'};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint32_t header_crc(const Header& h) { return crc32c(&h, offsetof(Header, payload_crc)); }

// The checksum of a payload the update wrote: its lane sums a and b, through CRC-32C.
uint32_t sums_digest(const uint32_t* total) { return crc32c(total, sizeof(uint32_t) * kRunningWords); }
uint32_t lane_sums_digest(const float* payload, int64_t floats) {
  uint32_t total[kRunningWords] = {};
  lane_sums_place(total, payload, floats, 0);
  return sums_digest(total);
}

std::string part_name(int part, int64_t step, bool own) {
  return fmt::format("part-{:05d}-{:012d}.{}", part, step, own ? "own" : "peer");
}
// A generation the optimizer's update writes keeps one name, its step in its header only: a
// rename at each step cost the MLP's step about 2 % (benchmarks/memory_update_cost.sh).
std::string generation_name(int part, int slot) { return fmt::format("part-{:05d}-gen{}.own", part, slot); }

struct Parsed {
  int part;
  int64_t step;  // -1: a generation's (generation_name), whose step is in its header
  bool own;
};
std::optional<Parsed> parse_name(const std::string& name) {
  static const std::regex named(R"(part-(\d{5})-(\d{12})\.(own|peer))"),
      generation(R"(part-(\d{5})-gen[01]\.own)");
  std::smatch m;
  if (std::regex_match(name, m, named)) return Parsed{std::stoi(m[1]), std::stoll(m[2]), m[3] == "own"};
  if (std::regex_match(name, m, generation)) return Parsed{std::stoi(m[1]), -1, true};
  return std::nullopt;
}

// The payload of a part file after its header, or why it cannot be taken.
std::string read_part(const std::string& path, Header* h, std::vector<float>* payload) {
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(h), sizeof *h)) return "shorter than its header";
  if (std::memcmp(h->magic, kMagic, 8) != 0 || h->version != kVersion)
    return fmt::format("not a strata memory checkpoint (version {})", kVersion);
  if (header_crc(*h) != h->header_crc) return "its header's CRC-32 does not match";
  if (!payload) return "";
  payload->resize(h->payload_bytes / 4);
  if (!in.seekg(MemoryCheckpoints::kPayloadAt) ||
      !in.read(reinterpret_cast<char*>(payload->data()), std::streamsize(h->payload_bytes)))
    return fmt::format("truncated: fewer than the {} payload bytes its header names", h->payload_bytes);
  const bool sums = h->checksum == kLaneSums;
  const uint32_t crc = sums ? lane_sums_digest(payload->data(), int64_t(payload->size()))
                            : crc32c(payload->data(), payload->size() * 4);
  if (crc != h->payload_crc)
    return fmt::format("{} {:08x} of its payload, {:08x} in its header",
                       sums ? "lane sums" : "CRC-32C", crc, h->payload_crc);
  return "";
}

// Completes `h` (magic, version, its own CRC; the payload's is set) and writes it at the start
// of `file`.
void seal(char* file, Header h) {
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.header_crc = header_crc(h);
  std::memcpy(file, &h, sizeof h);
}

// Whether `file` starts with a verified header of `part` at `step` with `payload` bytes.
bool header_names(const char* file, int part, int64_t step, uint64_t payload) {
  Header h;
  std::memcpy(&h, file, sizeof h);
  return std::memcmp(h.magic, kMagic, 8) == 0 && header_crc(h) == h.header_crc && h.part == part &&
         h.step == step && h.payload_bytes == payload;
}

// The step a copy holds: its name's, or a generation's header's (-1 if that does not verify).
int64_t step_of(const fs::path& path, const Parsed& p) {
  if (p.step >= 0) return p.step;
  Header h;
  return read_part(path.string(), &h, nullptr).empty() ? h.step : -1;
}

// Removes the copies of `part` and kind in `dir` but the newest (an earlier launch's), so a
// save's new file makes at most two. Given `keep` (a copy this launch has just published):
// every other one, an earlier launch's newer ones too (this launch resumed from an older
// step, and its own copies replace them).
void remove_older(const std::string& dir, int part, bool own, const std::string& keep = "") {
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> olds;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (auto p = parse_name(e.path().filename().string());
        p && p->part == part && p->own == own && e.path() != fs::path(keep))
      olds.emplace_back(step_of(e.path(), *p), e.path());
  std::sort(olds.begin(), olds.end());
  for (size_t k = 0; k + (keep.empty() ? 1 : 0) < olds.size(); ++k) fs::remove(olds[k].second, ec);
}

// Waits for a request of the exchange's communicator without the watchdog's marks (those are
// the training thread's): MPI moves the bytes inside test().
// Gives up once `stopped()` (the run ends on an error: a partner may be gone).
template <class Stopped>
void await(Comm& c, int handle, Stopped stopped) {
  for (int spins = 0; !c.test(handle); ++spins) {
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (stopped()) return;
  }
}

// The two directions of a partner exchange: floats to rank `to`, and from rank `from`.
struct Outgoing {
  const float* data;
  int64_t floats;
  int to;
};
struct Incoming {
  float* data;
  int64_t floats;
  int from;
};

// Sends `out` and receives `in` (into its data) in pieces of kExchangeFloats, kInFlight pieces
// at most in flight, each posted before the oldest is awaited, and none while `gate` is
// closed (the training thread's gradient sums in flight: comm/traffic_gate.h). On a 16-core
// host (benchmarks/RESULTS.md, run 12; MPI's shared memory without single-copy) the MLP's
// 0.84 ms step cost +80.6 % with a save every step, +39.5 % with the gate; with fewer bytes in
// flight the exchange could not keep up (4 pieces of 256 KiB: +56.8 %, 2: +111 %, saves waiting
// for their slot). On 2 vCPUs one piece at a time took the MLP's 2 MiB part 1.99 ms a save, two
// 1.41, all 0.74. False when the run stopped (an exchange in flight is abandoned).
bool send_and_receive(Comm& c, Outgoing out, Incoming in, MemoryCheckpoints::GateWait gate,
                      const bool& stop, std::mutex& mu) {
  constexpr size_t kInFlight = 8;
  auto stopped = [&] {
    std::lock_guard<std::mutex> lk(mu);
    return stop;
  };
  std::deque<std::pair<int, int>> window;  // (send, receive) handles, -1 for none
  auto await_oldest = [&] {
    for (int h : {window.front().first, window.front().second})
      if (h >= 0) await(c, h, stopped);
    window.pop_front();
    return !stopped();
  };
  for (int64_t at = 0; at < std::max(out.floats, in.floats); at += kExchangeFloats) {
    if (gate.gate) gate.gate->wait_open(gate.most, stopped);
    const int64_t ns = std::clamp<int64_t>(out.floats - at, 0, kExchangeFloats);
    const int64_t nr = std::clamp<int64_t>(in.floats - at, 0, kExchangeFloats);
    window.emplace_back(ns > 0 ? c.start_send(out.data + at, ns, out.to, kTag) : -1,
                        nr > 0 ? c.start_recv(in.data + at, nr, in.from, kTag) : -1);
    if (window.size() == kInFlight && !await_oldest()) return false;
  }
  while (!window.empty())
    if (!await_oldest()) return false;
  return true;
}

// The rank whose copy r keeps, under the same pairing.
int source_of(const MemoryPairing& p, int r) {
  std::vector<std::string> names;
  for (int n : p.node_of) names.push_back(p.node_names[size_t(n)]);
  return pair_ranks(names, r).source;
}


// Bytes per node: two generations of its ranks' parts and of the partners' copies it holds
// (none when the parts are replicated).
std::vector<int64_t> bytes_per_node(const MemoryPairing& pair, const std::vector<int64_t>& part_floats,
                                    bool replicated) {
  std::vector<int64_t> node_bytes(pair.node_names.size(), 0);
  for (size_t r = 0; r < part_floats.size(); ++r) {
    const int src = replicated ? -1 : source_of(pair, int(r));
    const int64_t held = src >= 0 ? part_floats[size_t(src)] : 0;
    node_bytes[size_t(pair.node_of[r])] +=
        2 * (4 * (part_floats[r] + held) + 2 * MemoryCheckpoints::kPayloadAt);
  }
  return node_bytes;
}

// Whose copies a scan may take, and of what size.
struct ScanFor {
  std::string dir;
  int local_rank, local_size, ranks;
  uint64_t job, run;
  int64_t attempt;
  const std::vector<int64_t>& part_floats;
};

// This rank's share of its node's directory: the copies that verify. Damaged ones are named
// and removed, an earlier attempt's removed (counted in *stale), others' left alone.
std::vector<MemoryCopy> scan(const ScanFor& w, int64_t* stale) {
  std::vector<MemoryCopy> copies;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(w.dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  int64_t other = 0;
  // The ranks of a node share its directory: each looks at every local_size-th name.
  for (size_t i = size_t(w.local_rank); i < names.size(); i += size_t(w.local_size)) {
    const std::string path = w.dir + "/" + names[i];
    if (names[i].starts_with("part-") && names[i].find(".tmp.") != std::string::npos) {
      fs::remove(path, ec);  // a write a killed rank left unfinished
      continue;
    }
    const auto p = parse_name(names[i]);
    if (!p) continue;
    Header h{};
    std::vector<float> payload;
    std::string why = read_part(path, &h, nullptr);
    if (std::memcmp(h.magic, kWriting, 8) == 0) {
      fs::remove(path, ec);  // an update a killed rank left unfinished
      continue;
    }
    if (why.empty() && h.job != w.job) continue;  // another job's: not ours to judge
    if (why.empty() && h.attempt != w.attempt) {
      fs::remove(path, ec);  // an earlier attempt's: a requeue starts from checkpoint.dir
      ++*stale;
      continue;
    }
    if (why.empty() && (h.run != w.run || h.ranks != w.ranks)) {
      if (other++ == 0)  // once per rank: a launch on another grid sees every copy so
        fmt::print(stderr, "strata: warning: checkpoint.memory_dir {}: {} and maybe more copies "
                   "were written by a run with another config or grid; not taken\n", w.dir, path);
      continue;
    }
    if (why.empty() && (h.part != p->part || (p->step >= 0 && h.step != p->step) ||
                        h.payload_bytes != uint64_t(w.part_floats[size_t(p->part)]) * 4))
      why = "its header does not match its name or this run's part size";
    if (why.empty()) why = read_part(path, &h, &payload);
    if (!why.empty()) {
      fmt::print(stderr, "strata: warning: memory checkpoint {} is damaged ({}): skipped and "
                 "removed\n", path, why);
      fs::remove(path, ec);
      continue;
    }
    copies.push_back({p->part, h.step, p->own, path});
  }
  return copies;
}

// Whether `bytes` of copies fit node `node`'s directory `dir` (its file system's free space and
// the node's available memory, with `pinned` bytes of the ranks' pinned buffers; copies an
// earlier launch left counted as free: they are replaced); else a UserError. `ranks`: the
// node's ranks, for the message.
void check_room(const std::string& dir, const std::string& node, int64_t bytes, int64_t pinned,
                int ranks) {
  int64_t ours = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (parse_name(e.path().filename().string())) ours += int64_t(e.file_size(ec));
  struct statvfs v{};
  if (::statvfs(dir.c_str(), &v) != 0)
    fail_input("checkpoint.memory_dir {}: cannot read its file system's size ({})", dir,
               std::strerror(errno));
  const int64_t free_fs = int64_t(v.f_bavail) * int64_t(v.f_frsize) + ours;
  const MemoryBound avail = memory_bound();  // the node's MemAvailable or the job's cgroup limit
  if (bytes > free_fs)
    fail_input("checkpoint.memory_dir {} on node {}: memory checkpoints need {} there (two "
               "generations of {} rank part(s) and their partner copies), its file system has "
               "{} free", dir, node, format_bytes(double(bytes)), ranks, format_bytes(double(free_fs)));
  if (avail.bytes != INT64_MAX && bytes + pinned > avail.bytes + ours)
    fail_input("checkpoint.memory_dir {} on node {}: memory checkpoints need {} of memory{}, "
               "and {}", dir, node, format_bytes(double(bytes + pinned)),
               pinned ? fmt::format(" ({} of them pinned buffers for the GPUs' copies)",
                                    format_bytes(double(pinned)))
                      : "", avail.source);
}

// Collective: the newest step for which some rank holds a copy of every part, or of a part with
// the same contents (`group`: by rank, the group's lowest rank), else -1 (each rank passes its
// own copies); *why says what the newest step lacked (or that there is none).
int64_t newest_complete_step(Comm& comm, const std::vector<MemoryCopy>& copies,
                             const std::vector<int>& group, std::string* why) {
  const int R = comm.size();
  int64_t bound = INT64_MAX;
  for (int round = 0;; ++round) {
    int64_t newest = -1;
    for (const MemoryCopy& c : copies)
      if (c.step < bound) newest = std::max(newest, c.step);
    int64_t neg = -newest;
    comm.allreduce_min(&neg, 1);
    const int64_t step = -neg;
    if (step < 0) {
      if (why->empty()) *why = "no memory copies";
      return -1;
    }
    std::vector<int64_t> have(size_t(R), 0);  // by group
    for (const MemoryCopy& c : copies)
      if (c.step == step) have[size_t(group[size_t(c.part)])] = 1;
    comm.allreduce_sum(have.data(), R);
    int missing = 0;  // the lowest part without a copy
    while (missing < R && have[size_t(group[size_t(missing)])]) ++missing;
    if (missing == R) return step;
    const bool replicated = std::count(group.begin(), group.end(), group[size_t(missing)]) > 1;
    if (round == 0)
      *why = fmt::format("step {} lacks part {} ({} is on a node of this launch)", step, missing,
                         replicated ? "no copy of it or of its replicas' parts"
                                    : "neither its own nor its partner's copy");
    bound = step;
  }
}

// By rank, the lowest rank passing the same key >= 0 (the rank itself for a key < 0).
std::vector<int> content_groups(const std::vector<int64_t>& key, const std::vector<int64_t>& part_floats) {
  std::vector<int> group(key.size());
  for (size_t r = 0; r < key.size(); ++r) {
    size_t g = r;
    if (key[r] >= 0) g = size_t(std::find(key.begin(), key.end(), key[r]) - key.begin());
    STRATA_CHECK(part_floats[g] == part_floats[r],
                 "memory checkpoints: ranks with the same contents have parts of different sizes");
    group[r] = int(g);
  }
  return group;
}

// Who would provide each part p of `step` from this rank's copies, as a key to minimise over
// the ranks: score * (R + 1) + provider (0: p's own rank, else rank + 1); INT64_MAX: none. A
// copy of p itself scores before one of a part with the same contents (a replica's: its
// header, such as the goodput ledger's time on rank 0, may differ), an own copy before a
// partner's. *chosen: by part, this rank's copy behind its key.
std::vector<int64_t> provider_keys(const std::vector<MemoryCopy>& copies, const std::vector<int>& group,
                                   int64_t step, int me, std::map<int, MemoryCopy>* chosen) {
  const int R = int(group.size());
  std::vector<int64_t> key(size_t(R), INT64_MAX);
  chosen->clear();
  for (int p = 0; p < R; ++p)
    for (const MemoryCopy& c : copies) {
      if (c.step != step || group[size_t(c.part)] != group[size_t(p)]) continue;
      const int score = (c.part == p ? 0 : 2) + (c.own ? 0 : 1);
      const int64_t k = int64_t(score) * (R + 1) + (p == me ? 0 : me + 1);
      if (k < key[size_t(p)]) key[size_t(p)] = k, (*chosen)[p] = c;
    }
  return key;
}

// Collective: how many parts (summed over the ranks, as find() chose their providers) come
// from a partner's copy, and how many from a data-parallel replica's.
std::pair<int64_t, int64_t> count_taken(Comm& comm, const std::vector<int64_t>& holder,
                                        const std::map<int, MemoryCopy>& chosen) {
  const int R = comm.size(), me = comm.rank();
  std::vector<int64_t> taken(2 * size_t(R), 0);  // parts from a partner's copy, from a replica's
  for (int p = 0; p < R; ++p) {
    if (holder[size_t(p)] != (p == me ? -1 : me)) continue;
    const MemoryCopy& c = chosen.at(p);
    if (c.part != p) taken[size_t(R + p)] = 1;
    else if (!c.own) taken[size_t(p)] = 1;
  }
  comm.allreduce_sum(taken.data(), 2 * R);
  return {std::accumulate(taken.begin(), taken.begin() + R, int64_t(0)),
          std::accumulate(taken.begin() + R, taken.end(), int64_t(0))};
}

// The payload of copy c, read (and verified again) once into `payloads`, by path.
std::vector<float>& read_once(std::map<std::string, std::vector<float>>& payloads, const MemoryCopy& c) {
  if (auto it = payloads.find(c.path); it != payloads.end()) return it->second;
  std::vector<float>& p = payloads[c.path];
  Header h{};
  if (auto why = read_part(c.path, &h, &p); !why.empty())
    fail_input("memory checkpoint {}: {} (it verified a moment ago)", c.path, why);
  return p;
}

// Collective, as find() chose the providers (holder: by part, the rank that sends it, -1 its
// own rank): each rank sends the parts it provides and gets its own (floats) into out.
void deliver_parts(Comm& comm, const std::vector<int64_t>& holder,
                   const std::map<int, MemoryCopy>& chosen, int64_t floats, float* out) {
  const int me = comm.rank();
  std::map<std::string, std::vector<float>> payloads;  // by path: each copy read once
  std::vector<int> handles;
  for (int p = 0; p < comm.size(); ++p) {
    if (p == me || holder[size_t(p)] != me) continue;
    const std::vector<float>& sending = read_once(payloads, chosen.at(p));
    handles.push_back(comm.start_send(sending.data(), int64_t(sending.size()), p, kTag + 1));
  }
  const int64_t mine = holder[size_t(me)];
  if (mine == -1) {
    const std::vector<float>& payload = read_once(payloads, chosen.at(me));
    std::copy(payload.begin(), payload.end(), out);
  } else {
    handles.push_back(comm.start_recv(out, floats, int(mine), kTag + 1));
  }
  for (int hd : handles) comm.wait(hd);
}

// The copies in `dir` of part `own` (its own) and of part `held` (a partner's), then `dir`
// if that left it empty (the node's other ranks may still be writing).
void remove_parts(const std::string& dir, int own, int held) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto p = parse_name(e.path().filename().string());
    if (p && ((p->own && p->part == own) || (!p->own && p->part == held))) fs::remove(e.path(), ec);
  }
  fs::remove(dir, ec);
}

}  // namespace

void PartWriter::put(const void* src, size_t bytes) {
  STRATA_CHECK(bytes <= left_, "a memory checkpoint's part is larger than its file");
  crc_ = crc32c_copy(crc_, dst_, static_cast<const unsigned char*>(src), bytes);
  dst_ += bytes;
  left_ -= bytes;
}

uint32_t PartWriter::finish() { return ~crc_; }

void PartWriter::zeros(size_t bytes) {
  static const char none[4096] = {};
  for (size_t n; bytes > 0; bytes -= n) put(none, n = std::min(bytes, sizeof none));
}

bool parts_span_nodes(const std::vector<int64_t>& same_as, const std::vector<int>& node_of) {
  // By key (few: one per part): the first node holding it, and whether another node does too
  // (strata plan asks this of every grid, over up to 2^20 ranks).
  std::map<int64_t, std::pair<int, bool>> seen;
  for (size_t r = 0; r < same_as.size(); ++r) {
    if (same_as[r] < 0) return false;  // a part of its own: one node holds it
    auto [it, first] = seen.try_emplace(same_as[r], node_of[r], false);
    if (!first && it->second.first != node_of[r]) it->second.second = true;
  }
  return std::all_of(seen.begin(), seen.end(), [](const auto& s) { return s.second.second; });
}

MemoryPairing pair_ranks(const std::vector<std::string>& node_by_rank, int rank) {
  MemoryPairing p;
  std::vector<std::vector<int>> ranks_of;  // by node index
  std::vector<int> local(node_by_rank.size());
  for (size_t r = 0; r < node_by_rank.size(); ++r) {
    auto it = std::find(p.node_names.begin(), p.node_names.end(), node_by_rank[r]);
    int n = int(it - p.node_names.begin());
    if (it == p.node_names.end()) {
      p.node_names.push_back(node_by_rank[r]);
      ranks_of.emplace_back();
    }
    p.node_of.push_back(n);
    local[r] = int(ranks_of[size_t(n)].size());
    ranks_of[size_t(n)].push_back(int(r));
  }
  const int n = p.node_of[size_t(rank)], N = int(p.node_names.size());
  p.local_rank = local[size_t(rank)];
  p.local_size = int(ranks_of[size_t(n)].size());
  if (N < 2) return p;
  auto at = [&](int node, int l) {
    const auto& v = ranks_of[size_t((node + N) % N)];
    return l < int(v.size()) ? v[size_t(l)] : -1;
  };
  p.partner = at(n + 1, p.local_rank);
  p.source = at(n - 1, p.local_rank);
  return p;
}

std::string expand_memory_dir(const std::string& memory_dir) {
  if (!memory_dir.empty()) return expand_local_dir(memory_dir);
  const std::string job = slurm_job_id();
  return "/dev/shm/strata-" + (job.empty() ? fmt::format("local-{}", ::getuid()) : job);
}

MemoryCheckpoints::MemoryCheckpoints(std::string dir, Comm& comm, int64_t part_floats, Identity id,
                                     const std::string& node, int64_t same_as)
    : dir_(std::move(dir)), comm_(comm), floats_(part_floats), id_(std::move(id)),
      run_(fnv1a(id_.run)), job_(fnv1a(id_.job)) {
  pair_ = pair_ranks(comm.all_gather_text(node), comm.rank());
  part_floats_.assign(size_t(comm.size()), 0);
  part_floats_[size_t(comm.rank())] = floats_;
  comm.allreduce_sum(part_floats_.data(), int64_t(part_floats_.size()));
  group_parts(same_as);
  xcomm_ = comm.split(0, comm.rank());
  // MPI moves a message only inside a call on it: on a thread of its own where MPI allows
  // that, so the exchange goes on while the training thread computes.
  const std::string level = mpi_thread_level();
  background_exchange_ = level == "MPI_THREAD_MULTIPLE" || level == "none";  // none: in-process ranks
  copier_ = std::thread([this] { copy_loop(); });
  if (background_exchange_) exchanger_ = std::thread([this] { exchange_loop(); });
}

// The copies finish; an exchange in flight is abandoned (an error ends this run and its
// partner may be gone; drain() is the orderly end).
MemoryCheckpoints::~MemoryCheckpoints() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  copier_.join();
  if (exchanger_.joinable()) exchanger_.join();
  for (MappedFile* f : {&own_[0], &own_[1], &held_[0], &held_[1]}) f->close();
}

// Collective. group_ from the ranks' keys; replicated_ when every group has members on two
// nodes or more: then each node's own copies hold the second copy of the others' parts, and a
// partner's would be a third.
void MemoryCheckpoints::group_parts(int64_t same_as) {
  std::vector<int64_t> key(size_t(comm_.size()), 0);
  key[size_t(comm_.rank())] = same_as;
  comm_.allreduce_sum(key.data(), comm_.size());
  group_ = content_groups(key, part_floats_);
  replicated_ = parts_span_nodes(key, pair_.node_of);
  one_part_ = replicated_ &&
              std::all_of(key.begin(), key.end(), [&](int64_t k) { return k == key[0]; });
  if (replicated_) pair_.partner = pair_.source = -1;
}

int64_t MemoryCheckpoints::preflight(int64_t pinned_per_rank) {
  const std::vector<int64_t> node_bytes = bytes_per_node(pair_, part_floats_, replicated_);
  const int64_t mine = node_bytes[size_t(pair_.node_of[size_t(comm_.rank())])];
  collectively(comm_, [&] {
    if (const std::string why = make_directories(dir_); !why.empty())
      fail_input("checkpoint.memory_dir {}: cannot create it ({})", dir_, why);
    if (pair_.local_rank == 0) check_room(dir_, pair_.node_names[size_t(pair_.node_of[size_t(comm_.rank())])],
                                          mine, pinned_per_rank * pair_.local_size, pair_.local_size);
  });
  return *std::max_element(node_bytes.begin(), node_bytes.end());
}

void MemoryCheckpoints::save(int64_t step, const std::function<void(int slot)>& start, Fill fill,
                             double* wait_s) {
  const auto t0 = std::chrono::steady_clock::now();
  const int k = next_;
  next_ ^= 1;
  std::chrono::steady_clock::time_point queued;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return busy_[k] == 0; });
    if (start) start(k);
    ++busy_[k];
    ++uncopied_;
    queued = std::chrono::steady_clock::now();
    timings_.queue_s.push_back(std::chrono::duration<double>(queued - t0).count());
    copy_q_.push_back({step, k, std::move(fill), queued});
  }
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> lk(mu_);
    timings_.wake_s.push_back(seconds_since(queued));
  }
  if (!background_exchange_) {  // the training thread moves the bytes itself, now
    fence();
    timed_exchange({step, k, nullptr, {}});
  }
  *wait_s = seconds_since(t0);
}

double MemoryCheckpoints::fence() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return uncopied_ == 0; });
  return seconds_since(t0);
}

void MemoryCheckpoints::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return busy_[0] == 0 && busy_[1] == 0; });
}

void MemoryCheckpoints::done(int slot) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    --busy_[slot];
  }
  cv_.notify_all();
}

// The next save of `q`, waiting for one; false when the thread is to end: at a stop, once the
// queue is empty (`finish`) or at once.
bool MemoryCheckpoints::pop(std::deque<Save>& q, bool finish, Save* s) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return stop_ || !q.empty(); });
  if (stop_ && (!finish || q.empty())) return false;
  *s = std::move(q.front());
  q.pop_front();
  return true;
}

void MemoryCheckpoints::copy_loop() {
  for (Save s; pop(copy_q_, /*finish=*/true, &s);) {
    const auto t0 = std::chrono::steady_clock::now();
    copy_own(s, t0);
    const double took = seconds_since(t0);
    const bool exchanging = background_exchange_ && (pair_.partner >= 0 || pair_.source >= 0);
    {
      std::lock_guard<std::mutex> lk(mu_);
      timings_.start_s.push_back(std::chrono::duration<double>(t0 - s.queued).count());
      timings_.copy_s.push_back(took);
      if (exchanging) exchange_q_.push_back({s.step, s.slot, nullptr});
      else if (background_exchange_) --busy_[s.slot];
    }
    cv_.notify_all();
  }
}

void MemoryCheckpoints::exchange_loop() {
  for (Save s; pop(exchange_q_, /*finish=*/false, &s);) timed_exchange(s);
}

void MemoryCheckpoints::timed_exchange(const Save& s) {
  const auto t0 = std::chrono::steady_clock::now();
  exchange(s);
  const double took = seconds_since(t0);
  {
    std::lock_guard<std::mutex> lk(mu_);
    timings_.exchange_s.push_back(took);
  }
  done(s.slot);
}

MemoryCheckpoints::Timings MemoryCheckpoints::timings() {
  std::lock_guard<std::mutex> lk(mu_);
  return timings_;
}

int MemoryCheckpoints::MappedFile::prepare(const std::string& tmp, size_t n, std::string* at) {
  *at = fd >= 0 ? path : tmp;
  if (fd >= 0) return ::rename(path.c_str(), tmp.c_str()) == 0 ? (path = tmp, 0) : errno;
  fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return errno;
  int err = ::posix_fallocate(fd, 0, off_t(n));
  void* m = err == 0 ? ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (err == 0 && m == MAP_FAILED) err = errno;
  if (err != 0) {
    ::close(fd);
    fd = -1;
    ::unlink(tmp.c_str());
    return err;
  }
  map = static_cast<char*>(m);
  bytes = n;
  path = tmp;
  return 0;
}

int MemoryCheckpoints::MappedFile::rename_to(const std::string& to) {
  if (to == path) return 0;
  if (::rename(path.c_str(), to.c_str()) != 0) return errno;
  path = to;
  return 0;
}

void MemoryCheckpoints::MappedFile::mark_writing() {
  std::memcpy(map, kWriting, sizeof kWriting);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // before the update's stores, streamed ones too
}

void MemoryCheckpoints::MappedFile::close() {
  if (map) ::munmap(map, bytes);
  if (fd >= 0) ::close(fd);
  map = nullptr;
  fd = -1;
}

// Makes `f` ready for the copy of `part` at `step` under its temporary name (on first use, an
// earlier launch's older copies of the part removed first, unless not `prune`).
bool MemoryCheckpoints::prepare(MappedFile& f, int part, int64_t step, bool own, size_t bytes,
                                bool prune) {
  if (f.fd < 0 && prune) remove_older(dir_, part, own);
  std::string at;
  const int err = f.prepare(fmt::format("{}/{}.tmp.{}", dir_, part_name(part, step, own), ::getpid()), bytes, &at);
  return err == 0 || (warn(at, err), false);
}

bool MemoryCheckpoints::publish(MappedFile& f, const std::string& name) {
  const int err = f.rename_to(dir_ + "/" + name);  // (f.path unchanged if it fails)
  return err == 0 || (warn(f.path, err), false);
}

// This rank's part: packed into the mapped file, then the CRCs and header, then its name.
void MemoryCheckpoints::copy_own(const Save& s, std::chrono::steady_clock::time_point t0) {
  MappedFile& f = own_[s.slot];
  const bool ready = prepare(f, comm_.rank(), s.step, true, kPayloadAt + size_t(floats_) * 4);
  const size_t payload = size_t(floats_) * 4;
  PartWriter w(ready ? f.map + kPayloadAt : nullptr, ready ? payload : 0);
  bool filled = false;
  uint32_t crc = 0;
  // A fill that fails (a device error while waiting for a GPU's copy, the run stopping) loses
  // this save, not the run: the file stays under its temporary name, and its old header names
  // another step, so the partner does not keep what the exchange sends of it.
  try {
    if (ready) s.fill(w, s.slot);
    crc = ready ? w.finish() : 0;
    filled = ready && w.left() == 0;
    if (ready && !filled) note_failure(f.path, "the part is smaller than its file");
  } catch (const std::exception& e) {
    note_failure(f.path, e.what());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    timings_.fill_s.push_back(seconds_since(t0));
    --uncopied_;  // the state is the training thread's again
  }
  cv_.notify_all();
  if (!filled) return;
  seal(f.map, {.part = comm_.rank(), .ranks = comm_.size(), .step = s.step, .attempt = id_.attempt,
                .run = run_, .job = job_, .payload_bytes = payload, .payload_crc = crc});
  publish(f, part_name(comm_.rank(), s.step, true));
}

float* MemoryCheckpoints::open_slot(int slot, int64_t step, double* wait_s) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return busy_[slot] == 0; });
  }
  *wait_s = seconds_since(t0);
  MappedFile& f = own_[slot];
  // A mapped file keeps its name while written: marked in its header, which a restart then
  // removes. An earlier launch's copies stay until this launch's first publish: the one a
  // restore took may not be their newest.
  if (f.map) f.mark_writing();
  else prepare(f, comm_.rank(), step, true, kPayloadAt + size_t(floats_) * 4, /*prune=*/false);
  return f.map ? reinterpret_cast<float*>(f.map + kPayloadAt) : nullptr;
}

void MemoryCheckpoints::publish_slot(int slot, int64_t step, const uint32_t* sums) {
  MappedFile& f = own_[slot];
  next_ = slot ^ 1;  // a copied save after these (the budget's) replaces the older generation
  if (f.map && sums) {  // (else the exchange still goes: its partner waits for it)
    seal(f.map, {.part = comm_.rank(), .ranks = comm_.size(), .checksum = kLaneSums, .step = step,
                  .attempt = id_.attempt, .run = run_, .job = job_,
                  .payload_bytes = uint64_t(floats_) * 4, .payload_crc = sums_digest(sums)});
    // Named once, then only sealed. The first: an earlier launch's copies go now (open_slot
    // left them), leaving this launch's two generations.
    if (publish(f, generation_name(comm_.rank(), slot)) && !published_) {
      remove_older(dir_, comm_.rank(), true, f.path);
      published_ = true;
    }
  }
  if (pair_.partner < 0 && pair_.source < 0) return;
  const Save s{.step = step, .slot = slot, .fill = nullptr, .blank = !(f.map && sums)};
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return busy_[slot] == 0; });  // (a blank save may repeat a slot)
    ++busy_[slot];  // until its exchange is done (done())
    if (background_exchange_) exchange_q_.push_back(s);
  }
  cv_.notify_all();
  if (!background_exchange_) timed_exchange(s);
}

// The own file's bytes, header and CRCs included, to the partner; the source's into the held
// file, published once its header verifies (the payload's CRC is the sender's: a restart
// checks it before taking the copy). A part whose file could not be prepared is still
// received, into scratch: the partner's send must complete. The bytes go in pieces of
// kExchangeFloats, a few in flight (below).
void MemoryCheckpoints::exchange(const Save& s) {
  static_assert(kPayloadAt % 4 == 0);
  MappedFile& mine = own_[s.slot];
  MappedFile& held = held_[s.slot];
  // Without an own file (its first prepare failed) or a save (blank) zeros go: the partner
  // expects the bytes, and a header of zeros names no step, so it keeps none of them.
  const int64_t send_floats = pair_.partner >= 0 ? int64_t(kPayloadAt / 4) + floats_ : 0;
  const bool sending = mine.map && !s.blank;
  std::vector<float> zeros(pair_.partner >= 0 && !sending ? size_t(send_floats) : 0);
  const size_t held_bytes = kPayloadAt + size_t(pair_.source >= 0 ? part_floats_[size_t(pair_.source)] : 0) * 4;
  const bool receiving = pair_.source >= 0 && prepare(held, pair_.source, s.step, false, held_bytes);
  std::vector<float> scratch;
  float* into = receiving ? reinterpret_cast<float*>(held.map) : nullptr;
  if (pair_.source >= 0 && !receiving) {
    scratch.resize(held_bytes / 4);
    into = scratch.data();
  }
  const int64_t recv_floats = pair_.source >= 0 ? int64_t(held_bytes / 4) : 0;
  const auto* from = sending ? reinterpret_cast<const float*>(mine.map) : zeros.data();
  if (!send_and_receive(*xcomm_, {from, send_floats, pair_.partner}, {into, recv_floats, pair_.source},
                        gate_, stop_, mu_))
    return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!receiving || stop_) return;
  }
  if (!header_names(held.map, pair_.source, s.step, held_bytes - kPayloadAt)) {
    fmt::print(stderr, "strata: warning: checkpoint.memory_dir {}: the copy of rank {}'s part "
               "for step {} arrived damaged: not kept\n", dir_, pair_.source, s.step);
    return;  // stays under its temporary name: the next save of the slot reuses the file
  }
  publish(held, part_name(pair_.source, s.step, false));
}

// A failure is a warning (the first one of a run) and training goes on.
void MemoryCheckpoints::warn(const std::string& path, int err) { note_failure(path, std::strerror(err)); }

void MemoryCheckpoints::note_failure(const std::string& path, const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (failures_.empty())
    fmt::print(stderr, "strata: warning: checkpoint.memory_dir {}: cannot write {} ({}); "
               "training goes on, later failures are not reported\n", dir_, path, why);
  failures_.push_back(path);
}

bool MemoryCheckpoints::stopping() {
  std::lock_guard<std::mutex> lk(mu_);
  return stop_;
}

namespace {

// The copies of an earlier attempt that the ranks' scans removed: rank 0 says how many.
void say_stale(Comm& comm, int64_t stale) {
  comm.allreduce_sum(&stale, 1);
  if (stale > 0 && comm.rank() == 0)
    fmt::print("memory checkpoints: removed {} cop{} left by an earlier attempt of this job (a "
               "requeue starts from checkpoint.dir)\n", stale, stale == 1 ? "y" : "ies");
}

}  // namespace

std::string memory_copy_file(const std::string& dir, int part, int64_t step, bool own) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (auto p = parse_name(e.path().filename().string());
        p && p->part == part && p->own == own && step_of(e.path(), *p) == step)
      return e.path().string();
  return "";
}

MemoryCheckpoints::Found MemoryCheckpoints::find() {
  int64_t stale = 0;
  const std::vector<Copy> copies =
      scan({dir_, pair_.local_rank, pair_.local_size, comm_.size(), job_, run_, id_.attempt, part_floats_},
           &stale);
  say_stale(comm_, stale);
  Found f;
  const int R = comm_.size(), me = comm_.rank();
  f.step = newest_complete_step(comm_, copies, group_, &f.why);
  if (f.step < 0) return f;
  // Who provides each part: the best copy anywhere (provider_keys), among equals the part's
  // own rank (-1), else the lowest rank holding one.
  std::vector<int64_t> key = provider_keys(copies, group_, f.step, me, &chosen_);
  comm_.allreduce_min(key.data(), R);
  holder_.assign(size_t(R), -1);
  for (int p = 0; p < R; ++p) holder_[size_t(p)] = key[size_t(p)] % (R + 1) - 1;
  const auto [partner, replica] = count_taken(comm_, holder_, chosen_);
  f.from_partner = partner, f.from_replica = replica;
  return f;
}

void MemoryCheckpoints::take(const Found& f, float* out) {
  STRATA_CHECK(f.step >= 0 && holder_.size() == size_t(comm_.size()), "take() without a found step");
  deliver_parts(comm_, holder_, chosen_, floats_, out);
}

void MemoryCheckpoints::remove_files() {
  drain();
  std::error_code ec;
  for (MappedFile* f : {&own_[0], &own_[1], &held_[0], &held_[1]}) {
    f->close();
    if (!f->path.empty()) fs::remove(f->path, ec);
    *f = MappedFile{};
  }
  remove_parts(dir_, comm_.rank(), pair_.source);
}

}  // namespace strata
