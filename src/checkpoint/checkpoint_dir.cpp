#include "checkpoint/checkpoint_dir.h"

#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "base/files.h"
#include "base/hdf5_util.h"
#include "base/parse.h"
#include "checkpoint/checkpoint.h"
#include "data/data.h"
#include "strata/error.h"

namespace strata {
namespace fs = std::filesystem;
namespace {

const std::regex kCheckpointName(R"(ckpt-(\d+)\.h5)");

// The `sequence` attribute of a checkpoint file; nullopt if it cannot be read.
std::optional<int64_t> read_sequence(const std::string& path) {
  std::lock_guard lock(hdf5_mutex());
  h5_quiet();
  H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.get() < 0) return std::nullopt;
  std::vector<int64_t> v;
  if (!read_int_attr(f.get(), "sequence", &v) || v.size() != 1) return std::nullopt;
  return v[0];
}

}  // namespace

std::string checkpoint_name(int64_t step) { return fmt::format("ckpt-{:09d}.h5", step); }

bool is_checkpoint_name(const std::string& filename) {
  return std::regex_match(filename, kCheckpointName);
}

std::vector<CheckpointDir::Entry> CheckpointDir::list() const {
  std::vector<Entry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_, ec)) {
    const std::string n = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(n, m, kCheckpointName)) continue;
    std::string why;
    if (auto step = parse_int(m[1].str(), &why)) {
      out.push_back({*step, n});
      continue;
    }
    std::lock_guard lk(warned_mu_);
    if (warn_ && warned_.insert(n).second)  // not a name strata writes
      fmt::print(stderr, "strata: warning: ignoring {}/{}: {}\n", path_, n, why);
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.step > b.step; });
  return out;
}

std::optional<int64_t> CheckpointDir::latest(std::string* name) const {
  std::ifstream in(path_ + "/latest");
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  std::smatch m;
  if (!std::regex_match(line, m, kCheckpointName)) return std::nullopt;
  std::string why;
  auto step = parse_int(m[1].str(), &why);
  if (!step) return std::nullopt;  // damaged: every checkpoint is a candidate, each verified
  *name = line;
  return step;
}

void CheckpointDir::point_to(const std::string& name) const {
  publish_text_file(path_ + "/latest", name + "\n");
}

void CheckpointDir::apply_retention(int64_t newest_step, int64_t keep_last,
                                    int64_t keep_every) const {
  int64_t kept = 0;
  for (const Entry& e : list()) {
    if (e.step > newest_step) continue;  // not ours to judge (an abandoned, newer lineage)
    if (kept < keep_last) {
      ++kept;
      continue;
    }
    const std::string path = path_ + "/" + e.name;
    if (keep_every > 0) {
      auto seq = read_sequence(path);
      if (!seq || *seq % keep_every == 0) continue;  // kept for good (or unreadable: leave it)
    }
    std::error_code ec;
    fs::remove(path, ec);
  }
}

std::vector<std::string> CheckpointDir::candidates(int64_t min_step) const {
  std::vector<std::string> out;
  std::string pointed;
  auto limit = latest(&pointed);
  for (const Entry& e : list()) {
    if (limit && e.step > *limit) {
      fmt::print("ignoring {}/{}: newer than the latest complete checkpoint ({})\n", path_,
                 e.name, pointed);
      continue;
    }
    if (e.step >= min_step) out.push_back(path_ + "/" + e.name);
  }
  return out;
}

int64_t CheckpointDir::newest_step() const {
  std::string pointed;
  if (auto at = latest(&pointed)) return *at;
  const auto all = list();
  return all.empty() ? -1 : all.front().step;
}

std::optional<CheckpointDir::Found> CheckpointDir::newest_verified(
    std::vector<std::string>* skipped) const {
  std::string pointed;
  const auto limit = latest(&pointed);
  for (const Entry& e : list()) {
    if (limit && e.step > *limit) continue;
    const std::string path = path_ + "/" + e.name;
    try {
      read_checkpoint(path);  // throws on a damaged file or a checksum mismatch
      return Found{e.step, path};
    } catch (const UserError& err) {
      if (skipped) skipped->push_back(err.what());
    }
  }
  return std::nullopt;
}

}  // namespace strata
