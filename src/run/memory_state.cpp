#include "run/memory_state.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "base/job.h"
#include "base/memory.h"
#include "base/stats.h"
#include "strata/error.h"

namespace strata {
namespace {

int64_t part_floats(Model& model, Optimizer& opt, int64_t header) {
  int64_t n = header + model.host_values().size();
  for (auto& [name, t] : opt.state()) n += t->size();
  return n;
}

// STRATA_TEST_KILL_AT_STEP=STEP:RANK (the Slurm tests): that rank kills itself with SIGKILL
// once the memory checkpoint after STEP steps is complete (its copies written and sent), as a
// fault right after that step would. STRATA_TEST_KILL_IN_UPDATE=STEP:RANK: inside the update
// that completes STEP steps, its generation written but not sealed. {-1, -1}: not set.
std::pair<int64_t, int> test_kill_at(const char* variable = "STRATA_TEST_KILL_AT_STEP") {
  const char* v = std::getenv(variable);
  long long step = -1;
  int rank = -1;
  if (v && std::sscanf(v, "%lld:%d", &step, &rank) == 2) return {step, rank};
  return {-1, -1};
}

class MemoryHook final : public StepHook {
 public:
  MemoryHook(MemoryState& m, int64_t per_epoch, const Backend& be, GoodputLedger& g, int rank)
      : m_(m), per_epoch_(per_epoch), be_(be), goodput_(g), rank_(rank) {}
  std::optional<int> end(const StepEnd& e) override {
    const int64_t done = e.step + 1;
    if (m_.saves_at(done))
      goodput_.checkpoint(done, m_.save(done, per_epoch_, be_, goodput_.useful_s()), /*write_now=*/false);
    m_.after_step(done, e.seconds);
    if (kill_.first == done && kill_.second == rank_) {
      m_.finish(/*remove=*/false);
      std::fflush(nullptr);
      ::raise(SIGKILL);
    }
    return std::nullopt;
  }

 private:
  MemoryState& m_;
  int64_t per_epoch_;
  const Backend& be_;
  GoodputLedger& goodput_;
  int rank_;
  std::pair<int64_t, int> kill_ = test_kill_at();
};

// The partner exchange's median time per save, in words.
std::string exchange_words(const MemoryCheckpoints::Timings& t) {
  return t.exchange_s.empty() ? "no partner" : fmt::format("exchange {:.2f} ms", 1e3 * median(t.exchange_s));
}

// The line at the end of a launch whose generations the update wrote.
void print_in_update(const std::vector<double>& stalls, const std::vector<double>& fences,
                     const UpdateGenerations& gens, const std::string& exchange, bool remove) {
  const std::string how =
      gens.in_place()
          ? fmt::format("in place in one generation, {} updates: data-parallel replicas on "
                        "other nodes hold the same part", gens.updates())
          : fmt::format("{} of {} updates over the gradients, their target's exchange done "
                        "before the backward", gens.over_grads(), gens.updates());
  fmt::print("memory checkpoints: {} saves in this launch, written by the optimizer's update "
             "({}); stall per save: median {:.2f} ms, max {:.2f} ms (sealing it), and "
             "{:.2f} ms median before each update (its file marked as being written, its "
             "exchange awaited, where not done before the backward); off the training thread "
             "per save: copy 0.00 ms, {}{}\n",
             stalls.size(), how, 1e3 * median(stalls),
             1e3 * *std::max_element(stalls.begin(), stalls.end()), 1e3 * median(fences),
             exchange, remove ? "; this run's copies removed" : "");
}

// Whose copies a restore took, in words.
std::string copies_taken(const MemoryCheckpoints::Found& f) {
  if (f.from_partner == 0 && f.from_replica == 0) return "every rank's own copy";
  std::string s;
  if (f.from_partner > 0)
    s = fmt::format("{} part(s) from the partner's copy", f.from_partner);
  if (f.from_replica > 0)
    s += fmt::format("{}{} part(s) from a data-parallel replica's copy", s.empty() ? "" : ", ",
                     f.from_replica);
  return s + " (their own copy is gone or damaged), the rest from their own";
}

}  // namespace

MemoryInterval memory_interval(double per_save_s, double step_s, double budget, int64_t first,
                               double max_recompute_s) {
  first = std::max<int64_t>(first, 1);
  const double step = std::max(step_s, 1e-9);
  const int64_t cap = std::max(first, int64_t(max_recompute_s / step));
  const double need = std::ceil(per_save_s / (budget * step));
  if (need > double(cap)) return {cap, true};
  return {std::max(first, int64_t(need)), false};
}

std::unique_ptr<MemoryState> MemoryState::make(const RunConfig& cfg, Comm& comm, const Backend& be,
                                               const std::string& grid, int64_t same_as,
                                               Model& model, Optimizer& opt) {
  if (cfg.checkpoint.memory_every <= 0) return nullptr;
  auto m = std::make_unique<MemoryState>(cfg, comm, be, grid, same_as, model, opt);
  // Two pinned host buffers per rank whose state lives on a device (the GPU's copies).
  const bool on_device = model.values().data() != model.host_values().data();
  const int64_t per_node = m->mem_.preflight(on_device ? 2 * int64_t(m->state_bytes_) : 0);
  const MemoryPairing& p = m->mem_.pairing();
  if (comm.rank() == 0) {
    fmt::print("memory checkpoints: every {} step{} into {}: {} per node (two generations of "
               "its ranks' parts{})\n", cfg.checkpoint.memory_every,
               cfg.checkpoint.memory_every == 1 ? "" : "s", m->mem_.dir(),
               format_bytes(double(per_node)),
               m->mem_.replicated() ? "" : " and of their partners' copies");
    if (m->in_update())
      fmt::print("memory checkpoints: the optimizer's update writes each generation (the "
                 "parameters and its state live in the memory directory's files): no copy{}{}\n",
                 m->mem_.one_part() ? "; in place in one generation, the replicas' copies "
                                      "standing in for an update cut short" : "",
                 m->probe_.phase() == UpdateProbe::Phase::off ? ""
                 : fmt::format("; checkpoint.memory_budget: the update is timed in place for {0} "
                               "steps without saves, then writing the generations for {0}, and "
                               "copies take over if that costs more than the budget", kAdaptSaves));
    if (p.node_names.size() < 2)
      fmt::print(stderr, "strata: warning: checkpoint.memory_every: every rank runs on node {}: "
                 "memory checkpoints have no partner copy, so a lost node means resuming from "
                 "checkpoint.dir\n", p.node_names.front());
    else if (m->mem_.replicated())
      fmt::print("memory checkpoints: every part has data-parallel replicas on another node, "
                 "whose own copies are its second copy: no partner copies\n");
    else if (p.partner >= 0)
      fmt::print("memory checkpoints: each rank's part is copied to the rank of the same local "
                 "index on the next node (rank 0 on {} -> rank {} on {})\n", p.node_names[0],
                 p.partner, p.node_names[size_t(p.node_of[size_t(p.partner)])]);
  }
  return m;
}

MemoryState::MemoryState(const RunConfig& cfg, Comm& comm, const Backend& be,
                         const std::string& grid, int64_t same_as, Model& model, Optimizer& opt)
    : state_bytes_(sizeof(float) * size_t(part_floats(model, opt, 0))),
      layout_(part_layout(model, opt, kStateFloats)),
      mem_(expand_memory_dir(cfg.checkpoint.memory_dir), comm, layout_.floats,
           {.job = slurm_job_id(), .attempt = slurm_restart_count(), .run = cfg.to_toml() + grid},
           slurm_node_name(), same_as),
      comm_(comm), model_(model), opt_(opt), every_(cfg.checkpoint.memory_every),
      budget_(cfg.checkpoint.memory_budget), first_every_(every_) {
  if (every_ == 1 && model.values().data() == model.host_values().data() && opt.can_update_to(be))
    gens_ = std::make_unique<UpdateGenerations>(mem_, model, opt, layout_);
  if (gens_ && budget_ > 0) probe_ = UpdateProbe(true, kAdaptSaves);
}

std::optional<TrainState> MemoryState::restore(int64_t file_step) {
  const MemoryCheckpoints::Found f = mem_.find();
  const bool lead = comm_.rank() == 0;
  if (f.step < 0 || f.step < file_step) {
    if (lead)
      fmt::print("resuming from the checkpoint files, not from memory: {}\n",
                 f.step < 0 ? f.why
                            : fmt::format("the newest complete memory generation (step {}) is "
                                          "older than the newest checkpoint file (step {})",
                                          f.step, file_step));
    return std::nullopt;
  }
  std::vector<float> part(size_t(layout_.floats));
  mem_.take(f, part.data());
  int64_t s[4];
  std::memcpy(s, part.data(), sizeof s);
  std::memcpy(&restored_useful_s_, part.data() + kUsefulAt, sizeof restored_useful_s_);
  Tensor& values = model_.host_values();
  std::copy_n(part.data() + layout_.values_at, values.size(), values.data());
  int k = 0;
  for (auto& [name, t] : opt_.state()) std::copy_n(part.data() + layout_.state_at[k++], t->size(), t->data());
  opt_.set_steps_taken(s[3]);
  if (lead)
    fmt::print("resumed from memory at step {}: {} ({})\n", s[0], copies_taken(f),
               file_step < 0 ? "there is no checkpoint file"
               : f.step > file_step
                   ? fmt::format("newer than the newest checkpoint file, step {}", file_step)
                   : fmt::format("as new as the newest checkpoint file, step {}, and faster to "
                                 "read", file_step));
  return TrainState{.step = s[0], .epoch = s[1], .batch = s[2],
                    .optimizer = opt_.config().kind, .optimizer_steps = s[3]};
}

// A GPU's state leaves the device on a copy stream into the slot's pinned buffer (values,
// then the optimizer's state: the part's order), beside the next step's kernels.
void MemoryState::start_device_copy(const Backend& be, int slot) {
  char* at = staging_[slot].get();
  auto copy = [&](const Tensor& t) {
    be.snapshot_copy(at, t.data(), sizeof(float) * size_t(t.size()), slot);
    at += sizeof(float) * size_t(t.size());
  };
  copy(model_.values());
  for (const Tensor* t : opt_.used_state()) copy(*t);
  STRATA_CHECK(at == staging_[slot].get() + state_bytes_, "memory checkpoint: the device state changed size");
}

double MemoryState::save(int64_t steps_done, int64_t per_epoch, const Backend& be, double useful_s) {
  const auto t0 = std::chrono::steady_clock::now();
  step_times_.saved(steps_done);
  const bool device = be.snapshot_copy != nullptr;
  device_ = device ? &be : nullptr;
  if (device && !staging_[0])  // (the preflight counted them)
    for (Pinned& st : staging_) st = Pinned(static_cast<char*>(be.alloc_pinned(state_bytes_)), be.free_pinned);
  const std::array<int64_t, 4> s = {steps_done, steps_done / per_epoch, steps_done % per_epoch,
                                    opt_.steps_taken()};
  std::array<float, kStateFloats> head{};
  std::memcpy(head.data(), s.data(), sizeof s);
  std::memcpy(head.data() + kUsefulAt, &useful_s, sizeof useful_s);
  if (gens_) {  // the head only: the update wrote the rest
    gens_->save(steps_done, head.data(), kStateFloats);
    const double stall = seconds_since(t0);
    stalls_.push_back(stall);
    return stall;
  }
  // On the copy thread, while the next step's forward and backward leave the state alone
  // (fence() before its update); a GPU's from the slot's buffer, once its copy is done.
  const Backend* bp = &be;
  auto fill = [this, head, device, bp](PartWriter& w, int slot) {
    w.put(head.data(), sizeof head);
    std::vector<const float*> from = {model_.host_values().data()};
    std::vector<int64_t> sizes = {model_.host_values().size()};
    for (auto& [name, t] : opt_.state()) from.push_back(t->data()), sizes.push_back(t->size());
    if (device) {
      // A poll, not an event wait: it gives up when the run ends on an error (a device that
      // never gets to the copy), and spins no core while the step's kernels run first.
      while (!bp->snapshot_ready(slot)) {
        if (mem_.stopping()) {
          staging_[slot].release();  // the copy may still land there: never freed
          throw std::runtime_error("the run ended before the GPU's copy was done");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      const float* at = reinterpret_cast<const float*>(staging_[slot].get());  // back to back
      for (size_t k = 0; k < from.size(); ++k) {
        from[k] = at;
        at += sizes[k];
      }
    }
    // Each at its place in the layout (part_layout), the gaps zeros.
    for (size_t k = 0; k < from.size(); ++k) {
      w.zeros(sizeof(float) * size_t(k == 0 ? layout_.values_at - kStateFloats : 0));
      w.put(from[k], sizeof(float) * size_t(sizes[k]));
      w.zeros(sizeof(float) * size_t(flat_span(sizes[k]) - sizes[k]));
    }
  };
  auto start = [&](int slot) {
    last_slot_ = slot;
    if (device) start_device_copy(be, slot);
  };
  double wait_s = 0;
  mem_.save(steps_done, start, fill, &wait_s);
  const double stall = seconds_since(t0);
  stalls_.push_back(stall);
  saved_ = std::chrono::steady_clock::now();
  return stall;
}

void MemoryState::after_step(int64_t steps_done, double step_s) {
  if (probe_.phase() != UpdateProbe::Phase::off) {
    if (probe_.step_ends(step_s)) decide(steps_done);
    return;
  }
  if (budget_ <= 0 || stalls_.empty() || gens_) return;
  step_times_.step(steps_done, step_s);
  if (stalls_.size() - window_ >= kAdaptSaves && steps_done % every_ == 0) adapt(steps_done);
}

namespace {
// The median of the last n values (all when fewer); 0 when there are none.
double median_of_last(const std::vector<double>& v, size_t n) {
  if (v.empty()) return 0.0;
  return median(std::vector<double>(v.end() - std::min(n, v.size()), v.end()));
}
}  // namespace

// Every kAdaptSaves saves: the interval their times ask for, agreed by every rank. The first
// window's saves start with the run (page faults, ranks out of step), so the interval is
// measured again over each later window; a change is printed.
void MemoryState::adapt(int64_t steps_done) {
  // The copy and exchange threads note a save when they finish it: the newest may be missing.
  const MemoryCheckpoints::Timings t = mem_.timings();
  const size_t saves = stalls_.size() - window_;
  const double stall = median_of_last(stalls_, saves);
  const double copy = median_of_last(t.copy_s, kAdaptSaves);
  const double exchange = median_of_last(t.exchange_s, kAdaptSaves);
  // A save's stall holds the next update's wait for its copy (fence()), which the step after
  // it took: only that part of the stall is in the steps' times, and in SaveWindow's slowdown.
  const double waited = std::min(median_of_last(fences_, saves), stall);
  const double step = std::max(step_times_.median_step() - waited * double(saves) /
                                                    double(step_times_.steps()), 1e-9);
  // What the copy costs the step after it, where that exceeds its own time (SaveWindow).
  const double slower = step_times_.slowdown();
  const double per_save = std::max(stall + copy + exchange, stall - waited + slower);
  const MemoryInterval mine = memory_interval(per_save, step, budget_, first_every_, kMaxRecomputeS);
  double agreed[2] = {double(mine.every), mine.capped ? 1.0 : 0.0};
  comm_.allreduce_max(agreed, 2);  // the rank that needs the longest interval sets it
  const int64_t before = every_, wanted = int64_t(agreed[0]);
  window_ = stalls_.size();
  step_times_.clear();
  // Within a quarter of the interval kept: no change (nor a line) for the windows' noise.
  if (4 * wanted >= 3 * before && 4 * wanted <= 5 * before) return;
  every_ = wanted;
  if (comm_.rank() != 0) return;
  fmt::print("memory checkpoints: every {} step{} from step {} (checkpoint.memory_budget {:g} %: a "
             "save takes {:.2f} ms, medians on rank 0: stall {:.2f}, copy {:.2f}, exchange {:.2f}{}, "
             "against steps of {:.2f} ms){}\n",
             every_, every_ == 1 ? "" : "s", steps_done, 100 * budget_, 1e3 * per_save, 1e3 * stall,
             1e3 * copy, 1e3 * exchange,
             slower < 0 ? "" : fmt::format(", the step after it {:.2f} slower than the others", 1e3 * slower),
             1e3 * step,
             agreed[1] > 0 ? fmt::format("; capped so that a fault redoes at most {:g} s of steps",
                                         kMaxRecomputeS)
                           : "");
}

// The update's cost in writing the generations (UpdateProbe) against the steps without memory
// checkpoints; over the budget on any rank, the state moves home and copies take over.
void MemoryState::decide(int64_t steps_done) {
  const double saves = median(stalls_) + median(fences_);
  const MemoryPairing& p = mem_.pairing();
  const UpdateProbe::Cost c = probe_.cost(saves, p.partner >= 0 || p.source >= 0);
  double worst = c.per_step / c.step;
  comm_.allreduce_max(&worst, 1);  // the rank that pays the most decides
  probe_.stop();
  const bool keep = worst <= budget_;
  if (comm_.rank() == 0)
    fmt::print("memory checkpoints: {} from step {} (checkpoint.memory_budget {:g} %: writing "
               "every generation costs {:.1f} % of a step at most, on rank 0 {:.3f} ms a step: "
               "the update {:.3f} ms against {:.3f} ms in place, the save {:.3f} ms, steps of "
               "{:.2f} ms)\n", keep ? "the update goes on writing every generation" : "copies",
               steps_done + (keep ? 0 : 1), 100 * budget_, 100 * worst, 1e3 * c.per_step,
               1e3 * c.writing, 1e3 * c.in_place, 1e3 * saves, 1e3 * c.step);
  if (keep) return;
  gens_->move_home();
  gens_.reset();
  // The copies' own statistics from here (fence() pairs each save with the update after it).
  earlier_saves_ = int64_t(stalls_.size());
  stalls_.clear(), fences_.clear(), windows_.clear();
  window_ = 0;
}

void MemoryState::after_update() {
  static const std::pair<int64_t, int> kill = test_kill_at("STRATA_TEST_KILL_IN_UPDATE");
  if (kill.second == comm_.rank() && kill.first == opt_.steps_taken()) {
    std::fflush(nullptr);
    ::raise(SIGKILL);
  }
  if (gens_) gens_->after_update();  // (nothing before its start(): the in-place phase)
  if (probe_.phase() != UpdateProbe::Phase::off) probe_.update_ends();
}

double MemoryState::fence() {
  if (probe_.phase() == UpdateProbe::Phase::in_place) {  // timed in place: no generations yet
    probe_.update_starts();
    return 0;
  }
  if (gens_ && !gens_->started()) {
    // Every rank or none (a file that cannot be made is warned): a rank saving copies beside
    // ranks that do not would call the budget's collectives alone.
    int64_t ok = gens_->start() ? 1 : 0;
    comm_.allreduce_min(&ok, 1);
    if (!ok) {
      gens_->move_home();
      gens_.reset();
      probe_.stop();  // copies from here, the budget's interval as theirs
    }
  }
  if (gens_) {
    double waited = 0;
    gens_->before_update(&waited);
    fences_.push_back(waited);
    if (probe_.phase() != UpdateProbe::Phase::off) probe_.update_starts();
    return waited;
  }
  const bool first = !stalls_.empty() && windows_.size() < stalls_.size();  // since the save
  if (first)
    windows_.push_back(seconds_since(saved_));
  // A GPU's update waits on the device for the copy stream; the copy thread reads the pinned
  // buffer, not the state, so the host goes on.
  if (device_) device_->snapshot_device_wait(last_slot_);
  const double waited = device_ ? 0.0 : mem_.fence();
  if (!stalls_.empty()) stalls_.back() += waited;
  if (first) fences_.push_back(waited);  // the save's stall: at its step and the next
  return waited;
}

void MemoryState::finish(bool remove) {
  if (finished_) return;
  finished_ = true;
  const bool saved_in_update = gens_ != nullptr;
  if (gens_) gens_->move_home();
  if (remove) mem_.remove_files();
  else mem_.drain();
  if (comm_.rank() != 0 || stalls_.empty()) return;
  const MemoryCheckpoints::Timings t = mem_.timings();
  const std::string exchange = exchange_words(t);
  if (saved_in_update) return print_in_update(stalls_, fences_, *gens_, exchange, remove);
  // Where a save's time goes off the training thread: with a spare core the copy and the
  // exchange cost the step only through what they share with it (memory bandwidth, MPI).
  fmt::print("memory checkpoints: {} saves in this launch{}, stall per save: median {:.2f} ms, "
             "max {:.2f} ms (medians: {:.2f} ms queueing, {:.2f} ms waking the copy, {:.2f} ms "
             "at the update); off the training thread per save: copy {:.2f} ms, {} (medians: "
             "{:.2f} ms from the save to the copy's start, {:.2f} ms packing, {:.2f} ms from the "
             "save to the update that waits for it){}\n",
             stalls_.size(),
             earlier_saves_ ? fmt::format(" copied, after {} the update wrote", earlier_saves_) : "",
             1e3 * median(stalls_),
             1e3 * *std::max_element(stalls_.begin(), stalls_.end()), 1e3 * median(t.queue_s),
             1e3 * median(t.wake_s), 1e3 * median(fences_), 1e3 * median(t.copy_s),
             exchange, 1e3 * median(t.start_s), 1e3 * median(t.fill_s),
             1e3 * median(windows_), remove ? "; this run's copies removed" : "");
}

std::unique_ptr<StepHook> memory_checkpoint_hook(MemoryState& m, int64_t per_epoch,
                                                 const Backend& be, GoodputLedger& goodput) {
  return std::make_unique<MemoryHook>(m, per_epoch, be, goodput, m.rank());
}

}  // namespace strata
