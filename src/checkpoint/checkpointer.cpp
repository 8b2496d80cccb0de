#include "checkpoint/checkpointer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <climits>
#include <random>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "base/files.h"
#include "data/data.h"
#include "strata/comm.h"
#include "strata/error.h"

namespace strata {
namespace fs = std::filesystem;
namespace {

// Broadcasts a float buffer from `root` in pieces MPI's int counts can hold.
void broadcast_floats(Comm& comm, float* p, int64_t n, int root) {
  for (int64_t at = 0; at < n;) {
    const int64_t len = std::min<int64_t>(n - at, int64_t(1) << 28);
    comm.broadcast(p + at, len * int64_t(sizeof(float)), root);
    at += len;
  }
}

// A verified checkpoint's tensors into the model and optimizer state. read_checkpoint found
// every tensor of the file's model, each with its shape, and check_resumable that the model and
// optimizer are this run's: each copy fits.
void copy_into(const LoadedCheckpoint& ck, const std::string& path, Model& model, Optimizer& opt) {
  STRATA_CHECK(!opt.sharded(), "a checkpoint loads into an unsharded optimizer (zero.h)");
  auto tensor = [&](const std::string& ds, const Param& p) -> const std::vector<float>& {
    auto it = ck.tensors.find(ds);
    if (it == ck.tensors.end() || int64_t(it->second.size()) != numel(p.shape))
      throw UserError(kExitBadCheckpoint, fmt::format("{}: {} is missing or has the wrong size", path, ds));
    return it->second;
  };
  for (Param* p : model.params()) {
    const auto& v = tensor(param_path(p->name), *p);
    std::copy(v.begin(), v.end(), p->host);
  }
  for (auto& [name, t] : opt.state())
    for (Param* p : model.params()) {
      const auto& v = tensor("/optimizer/" + name + param_path(p->name).substr(7), *p);
      std::copy(v.begin(), v.end(), t->data() + p->offset);
    }
}

}  // namespace

Checkpointer::Checkpointer(const RunConfig& cfg, Comm& comm, CheckpointWriterKind writer)
    : comm_(comm),
      shared_(cfg.checkpoint_dir(), /*warn=*/comm.rank() == 0),
      policy_(cfg.checkpoint),
      file_writer_(make_checkpoint_writer(writer, &comm)),
      keep_last_(cfg.checkpoint.keep_last),
      keep_every_(cfg.checkpoint.keep_every),
      local_config_(cfg.checkpoint.local_dir),
      fresh_(cfg.resume == "never") {}

namespace {
// Rank 0: creates `dir` if needed (never world-writable), checks that it is writable with room
// for `bytes`, removes temporary files a crash left. `what` names it in errors.
void prepare_directory(const std::string& dir, int64_t bytes, const std::string& what) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    fail_input("{} {}: exists and is not a directory", what, dir);
  if (!fs::exists(dir, ec))
    if (std::string why = make_directories(dir); !why.empty())
      fail_input("{} {}: cannot create it ({})", what, dir, why);
  if (const std::string why = cannot_create_in(dir); !why.empty())  // root passes access(2)
    fail_input("{} {}: not writable ({})", what, dir, why);
  struct statvfs sv{};
  if (::statvfs(dir.c_str(), &sv) == 0) {
    const double free_b = double(sv.f_bavail) * double(sv.f_frsize);
    if (free_b < double(bytes) * 1.05 + 1e6)
      fail_input("{} {}: {:.1f} MB free, a checkpoint needs {:.1f} MB", what, dir, free_b / 1e6,
                 double(bytes) / 1e6);
  }
  // Temporary files of writes a crash interrupted are never part of a checkpoint.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp.") == std::string::npos) continue;
    for (const char* mine : {"ckpt-", "latest", "goodput.toml", "hung-rank", "cache-id"})
      if (n.starts_with(mine)) {
        fs::remove(e.path(), ec);
        fmt::print("removed {} (left by an interrupted write)\n", e.path().string());
        break;
      }
  }
}

// The cache id in checkpoint.dir/cache-id (16 hex digits), made when missing or damaged.
std::string cache_id(const std::string& dir) {
  const std::string path = dir + "/cache-id";
  std::ifstream in(path);
  std::string id;
  if (in && std::getline(in, id) && std::regex_match(id, std::regex("[0-9a-f]{16}"))) return id;
  std::random_device rd;
  id = fmt::format("{:08x}{:08x}", rd(), rd());
  publish_text_file(path, id + "\n");
  return id;
}
}  // namespace

void Checkpointer::preflight(int64_t bytes) {
  collectively(comm_, [&] {
    if (comm_.rank() != 0) return;
    prepare_directory(dir(), bytes, "checkpoint.dir");
    if (const int64_t step = shared_.newest_step(); fresh_ && step >= 0)
      fail_input("checkpoint.dir {}: holds an earlier run's checkpoints (the newest at step {}): "
                 "--resume auto continues that run; a new one needs another output.dir or "
                 "checkpoint.dir (or that directory moved away)", dir(), step);
  });
  if (!local_config_.empty()) prepare_local_cache(bytes);
}

void Checkpointer::prepare_local_cache(int64_t bytes) {
  char id[17] = {0};
  collectively(comm_, [&] {
    if (comm_.rank() == 0) std::memcpy(id, cache_id(dir()).c_str(), 16);
  });
  comm_.broadcast(id, 16, 0);
  // Every rank knows its node's directory (resume looks there); rank 0 writes into it.
  collectively(comm_, [&] {
    cache_ = std::make_unique<CheckpointDir>(expand_local_dir(local_config_) + "/strata-" + id,
                                             /*warn=*/comm_.rank() == 0);
    if (comm_.rank() == 0) prepare_directory(cache_->path(), bytes, "checkpoint.local_dir");
  });
  if (comm_.rank() == 0) copier();  // the writer thread submits to it
}

SharedCopier& Checkpointer::copier() {
  if (!copier_)
    copier_ = std::make_unique<SharedCopier>(dir(), [this](const std::string& name, int64_t step) {
      std::string pointed;
      const auto at = shared_.latest(&pointed);
      if (!at || *at < step) shared_.point_to(name);  // `latest` only moves forward
      shared_.apply_retention(step, keep_last_, keep_every_);
    });
  return *copier_;
}

void Checkpointer::publish(const CheckpointDir& d, int64_t step) const {
  d.point_to(checkpoint_name(step));
  d.apply_retention(step, keep_last_, &d == &shared_ ? keep_every_ : 0);
}

void check_resumable(const LoadedCheckpoint& ck, const std::string& path, const Model& model,
                     const RunConfig& cfg, const std::string& dataset_sha256) {
  auto bad = [&](const std::string& what) {
    throw UserError(kExitBadCheckpoint, fmt::format("{}: cannot continue this run from it: {}", path, what));
  };
  if (ck.format == "strata-int8")
    bad("it is an int8 inference file (strata quantize): its weights are int8, and it has no "
        "optimizer state or data position; resume from a checkpoint");
  if (ck.format != "strata-checkpoint")
    bad("it is a parameter file, not a checkpoint (no optimizer state or data position)");
  if (ck.spec != model.spec()) bad("it holds a different model (model_layers differ)");
  if (ck.input_shape != model.input_shape() || ck.classes != model.classes())
    bad("it was trained on samples of another shape or class count");
  if (ck.state.global_batch != cfg.train.batch_size)
    bad(fmt::format("it was written with train.batch_size = {}, this run has {} (the data "
                    "position would not match)", ck.state.global_batch, cfg.train.batch_size));
  if (ck.state.seed != cfg.train.seed)
    bad(fmt::format("it was written with train.seed = {}, this run has {}", ck.state.seed, cfg.train.seed));
  if (ck.state.optimizer != cfg.train.optimizer)
    bad(fmt::format("it holds {} state, this run uses train.optimizer = {}", ck.state.optimizer,
                    cfg.train.optimizer));
  if (!ck.prov.dataset_sha256.empty() && !dataset_sha256.empty() &&
      ck.prov.dataset_sha256 != dataset_sha256)
    bad(fmt::format("it was trained on another dataset (sha256 {} vs {} of {})",
                    ck.prov.dataset_sha256.substr(0, 12), dataset_sha256.substr(0, 12), cfg.data.path));
}

int64_t Checkpointer::newest_file_step() {
  int64_t neg = -std::max(comm_.rank() == 0 ? shared_.newest_step() : -1,
                          cache_ ? cache_->newest_step() : -1);
  comm_.allreduce_min(&neg, 1);
  return -neg;
}

std::optional<TrainState> Checkpointer::resume(Model& model, const std::function<Optimizer&()>& opt_into,
                                               const RunConfig& cfg,
                                               const std::string& dataset_sha256) {
  if (cfg.resume == "never") return std::nullopt;
  const bool automatic = cfg.resume == "auto";
  // The reader: the lowest rank whose node-local cache holds the newest copy, when that is at
  // least as new as the shared `latest`; else rank 0, from the shared directory.
  int64_t steps[2] = {comm_.rank() == 0 && automatic ? shared_.newest_step() : -1, -1};
  comm_.broadcast(steps, sizeof steps[0], 0);
  const int64_t shared_step = steps[0];
  const int64_t mine = automatic && cache_ ? cache_->newest_step() : -1;
  int64_t best[2] = {-mine, mine >= 0 ? -1 : 0};  // newest local step, then lowest rank holding it
  comm_.allreduce_min(best, 1);
  const int64_t local_step = -best[0];
  best[1] = mine == local_step && mine >= 0 ? comm_.rank() : INT_MAX;
  comm_.allreduce_min(&best[1], 1);
  const bool from_local = local_step >= 0 && local_step >= shared_step;
  const int reader = from_local ? int(best[1]) : 0;

  int64_t found = 0;  // on the reader: 1 if a checkpoint was loaded
  TrainState st;
  std::string from;
  collectively(comm_, [&] {
    if (comm_.rank() != reader) return;
    std::vector<std::string> paths;
    if (!automatic) {
      paths.push_back(cfg.resume);
    } else {
      if (from_local) paths = cache_->candidates(shared_step);  // then the shared ones
      for (auto& p : shared_.candidates(0)) paths.push_back(std::move(p));
      if (paths.empty()) {
        fmt::print("no checkpoint in {}; starting at step 0\n", dir());
        return;
      }
    }
    for (const std::string& path : paths) {
      LoadedCheckpoint ck;
      try {
        ck = read_checkpoint(path, /*tolerate_mismatch=*/false, /*quarantine_if_damaged=*/true);
      } catch (const UserError& e) {
        // Only a damaged file is set aside; anything else (no memory for it, a file that is
        // not a strata checkpoint at all) is for the user to look at.
        if (!automatic || e.code != kExitBadCheckpoint) throw;
        fmt::print(stderr, "strata: warning: skipping damaged checkpoint: {}\n", e.what());
        std::error_code ec;
        fs::rename(path, path + ".corrupt", ec);  // kept for inspection, never loaded again
        continue;
      }
      check_resumable(ck, path, model, cfg, dataset_sha256);
      copy_into(ck, path, model, opt_into());
      st = ck.state;
      from = path;
      found = 1;
      return;
    }
    throw UserError(kExitBadCheckpoint,
                    fmt::format("checkpoint.dir {}: none of the {} checkpoints verifies (each "
                                "is named above and renamed *.corrupt); not starting over from "
                                "step 0 (move them away to do so)", dir(), paths.size()));
  });
  comm_.broadcast(&found, sizeof found, reader);
  if (!found) return std::nullopt;
  int64_t s[8] = {st.step, st.epoch, st.batch, st.sequence, st.global_batch, int64_t(st.seed),
                  st.optimizer_steps, 0};
  comm_.broadcast(s, sizeof s, reader);
  st = TrainState{.step = s[0], .epoch = s[1], .batch = s[2], .sequence = s[3],
                  .global_batch = s[4], .seed = uint64_t(s[5]), .optimizer = cfg.train.optimizer,
                  .optimizer_steps = s[6]};
  broadcast_floats(comm_, model.host_values().data(), model.host_values().size(), reader);
  Optimizer& opt = opt_into();
  for (auto& [name, t] : opt.state()) broadcast_floats(comm_, t->data(), t->size(), reader);
  opt.set_steps_taken(st.optimizer_steps);
  sequence_ = st.sequence;
  if (comm_.rank() == reader) {
    fmt::print("resumed from {} at step {} (epoch {}, batch {} of the epoch)\n", from, st.step,
               st.epoch + 1, st.batch);
    // A local copy newer than the shared directory's: the shared one catches up.
    if (from_local && cache_ && from.starts_with(cache_->path() + "/") && st.step > shared_step) {
      fmt::print("checkpoint.dir {} is behind the node-local copy (step {} vs {}): copying it "
                 "there in the background\n", dir(), st.step, shared_step);
      copier().submit(from, checkpoint_name(st.step), st.step);
    }
  }
  return st;
}

Checkpointer::~Checkpointer() {
  finish();
  if (!copier_) return;
  // The newest checkpoint reaches the shared directory before the process ends.
  for (const std::string& f : copier_->drain()) fmt::print(stderr, "strata: warning: {}\n", f);
  copier_.reset();  // before the members its thread uses
}

std::optional<Checkpointer::SaveResult> Checkpointer::copy_failures(bool wait) {
  if (!copier_) return std::nullopt;
  const auto failed = wait ? copier_->drain() : copier_->take_failures();
  if (failed.empty()) return std::nullopt;
  SaveResult r;
  r.error = failed.front();
  if (failed.size() > 1) r.error += fmt::format(" (and {} more)", failed.size() - 1);
  return r;
}

std::optional<Checkpointer::SaveResult> Checkpointer::finish(bool copies) {
  if (!writer_.joinable()) return copy_failures(copies);
  writer_.join();
  writer_done_ = false;
  writer_result_.stall_s = writer_stall_s_;
  auto failed = copy_failures(copies);
  if (copier_) writer_result_.copy_s = copier_->last_copy_s();
  if (failed && writer_result_.ok) {
    writer_result_.ok = false;
    writer_result_.error = failed->error;
  }
  return writer_result_;
}

std::optional<Checkpointer::SaveResult> Checkpointer::poll() {
  if (!writer_done_.load(std::memory_order_acquire)) return copy_failures(false);
  return finish();
}

Checkpointer::SaveResult Checkpointer::save(const Model& model, Optimizer& opt, TrainState st,
                                            const Provenance& prov, bool wait, bool durable,
                                            double before_s) {
  using Clock = std::chrono::steady_clock;
  const auto t_enter = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(before_s));
  SaveResult r;
  st.sequence = ++sequence_;
  r.step = st.step;
  // With a local cache the file goes there first; the copier takes it to checkpoint.dir.
  const CheckpointDir& target = cache_ ? *cache_ : shared_;
  r.path = target.path() + "/" + checkpoint_name(st.step);
  if (comm_.rank() == 0) {
    // Data parallelism: every replica holds the same parameters and optimizer state, so rank 0
    // writes them all (a gather that costs nothing); other ranks only learn the outcome.
    finish();  // one write at a time (the caller has collected its outcome with finish())
    STRATA_CHECK(!file_writer_->every_rank_writes() && !opt.sharded(),
                 "rank 0 writes a checkpoint from an unsharded optimizer (zero.h)");
    std::vector<NamedTensor> tensors = model_tensors(model);
    for (auto& [name, t] : opt.state())
      for (const Param* p : model.params())
        tensors.push_back({"/optimizer/" + name + param_path(p->name).substr(7), p->shape,
                           t->data() + p->offset});
    if (!wait) {
      // Snapshot: one copy of every tensor, then training may change the originals.
      int64_t total = 0;
      for (const auto& t : tensors) total += numel(t.shape);
      if (snapshot_.size() != total) snapshot_ = Tensor({total});
      float* at = snapshot_.data();
      for (auto& t : tensors) {
        std::copy_n(t.data, numel(t.shape), at);
        t.data = at;
        at += numel(t.shape);
      }
    }
    auto write = [this, tensors = std::move(tensors), st, prov, r, &target, &model, &opt]() mutable {
      const auto t0 = Clock::now();
      try {
        r.bytes = file_writer_->write(r.path, {.model = model, .opt = &opt, .tensors = tensors,
                                          .state = st, .prov = prov});
        r.ok = true;
      } catch (const UserError& e) {
        r.error = e.what();
      }
      r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r.ok) {
        try {
          publish(target, st.step);
          if (copier_) copier_->submit(r.path, checkpoint_name(st.step), st.step);
        } catch (const UserError& e) {
          r.error = e.what();
        }
      }
      return r;
    };
    if (wait) {
      r = write();
      if (copier_ && r.ok && durable) {
        // A stop or final checkpoint is safe only once it is in the shared directory.
        if (auto failed = copy_failures(true)) r.ok = false, r.error = failed->error;
        r.copy_s = copier_->last_copy_s();
      }
    } else {
      writer_ = std::thread([this, write]() mutable {
        writer_result_ = write();
        writer_done_.store(true, std::memory_order_release);
      });
      r.ok = true;  // so far: the outcome comes from poll()
    }
  }
  if (wait) {
    // Every rank learns the outcome.
    double v[4] = {r.ok ? 1.0 : 0.0, double(r.bytes), r.seconds, r.copy_s};
    comm_.broadcast(v, sizeof v, 0);
    r.ok = v[0] != 0;
    r.bytes = int64_t(v[1]);
    r.seconds = v[2];
    r.copy_s = v[3];
    if (!r.ok && comm_.rank() != 0) r.error = "rank 0 could not write the checkpoint";
  }
  r.stall_s = std::chrono::duration<double>(Clock::now() - t_enter).count();
  if (!wait) writer_stall_s_ = r.stall_s;
  return r;
}

Checkpointer::SaveResult Checkpointer::save_every_rank(const Model& model, Optimizer& opt,
                                                       TrainState st, const Provenance& prov,
                                                       double before_s) {
  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  const auto t_enter = t_start - std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(before_s));
  STRATA_CHECK(!cache_ && file_writer_->every_rank_writes(),
               "a writer where every rank writes goes to checkpoint.dir directly");
  SaveResult r;
  st.sequence = ++sequence_;
  r.step = st.step;
  r.path = dir() + "/" + checkpoint_name(st.step);
  if (comm_.rank() == 0) finish();  // one write at a time
  try {
    r.bytes = file_writer_->write(r.path, {.model = model, .opt = &opt, .state = st, .prov = prov});
    r.ok = true;
  } catch (const UserError& e) {
    r.error = e.what();  // the same outcome on every rank
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  double ok = r.ok ? 1.0 : 0.0;
  if (comm_.rank() == 0 && r.ok) {
    try {
      publish(shared_, st.step);
    } catch (const UserError& e) {
      r.error = e.what(), ok = 0.0;
    }
  }
  comm_.broadcast(&ok, sizeof ok, 0);
  r.ok = ok != 0;
  if (!r.ok && r.error.empty()) r.error = "rank 0 could not publish the checkpoint";
  r.stall_s = std::chrono::duration<double>(Clock::now() - t_enter).count();
  return r;
}

}  // namespace strata
