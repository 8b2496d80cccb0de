#include "plan/layer_bench.h"

#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>

#include <H5public.h>
#include <dnnl.h>
#include <fmt/format.h>

#include "base/files.h"
#include "base/stats.h"
#include "data/data.h"
#include "model/batch_on_backend.h"
#include "model/loss.h"
#include "model/model.h"
#include "model/optim.h"
#include "plan/step_time.h"
#include "strata/error.h"
#include "strata/rng.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

std::string cpuinfo_field(const std::string& text, const std::string& key) {
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    if (at > 0 && text[at - 1] != '\n') continue;
    const size_t colon = text.find(':', at), eol = text.find('\n', at);
    if (colon == std::string::npos || colon > eol) continue;
    if (text.substr(at, text.find_first_of("\t:", at) - at) != key) continue;
    std::string v = text.substr(colon + 1, eol - colon - 1);
    v.erase(0, v.find_first_not_of(' '));
    return v;
  }
  return "";
}

// Per layer, the phases' seconds of one run at one micro-batch.
struct Phases {
  std::vector<double> f, b, bi, bw;
};

// A micro-batch of b random samples (tokens for a token model), labels and a gradient at the
// model's output: what the timed passes run on.
struct PassData {
  PassData(Model& m, const Backend& be, int64_t b, const PlannedModel& pm)
      : b(b), head(m.classes(), m.rows_per_sample()) {
    Rng rng(11);
    host.x = Tensor(batched(b, pm.input));
    Tensor hdy(batched(b, m.stage_output_shape()));
    const bool tokens = pm.tokens_per_sample > 1 || pm.layers.front().name.rfind("emb", 0) == 0;
    for (int64_t i = 0; i < host.x.size(); ++i)
      host.x.data()[i] = tokens ? float(rng.next() % uint64_t(pm.classes)) : rng.uniform(0.f, 1.f);
    for (int64_t i = 0; i < hdy.size(); ++i) hdy.data()[i] = rng.uniform(-1e-3f, 1e-3f);
    dy = to_backend(be, hdy);
    host.y.resize(size_t(b * m.rows_per_sample()));
    for (auto& l : host.y) l = int32_t(rng.next() % uint64_t(m.classes()));
    // Inputs and labels where the backend computes (a GPU's memory), as training's are.
    const BatchOnBackend::View v = on_backend.put(be, host);
    x = &v.x, labels = v.y;
  }
  // The whole forward, loss and backward as training runs them: seconds per pass. On a device
  // (memory the host can't touch) `passes` run back to back before one synchronize, as a step's
  // micro-batches and the next step do: the host queues each pass's backward while the device
  // runs it (the loss's value is read back once per pass, as in training), and one pass with a
  // wait at its end would pay the queueing and the drain each time.
  double whole_pass(Model& m, const Backend& be) {
    const int passes = be.host_memory() ? 1 : 4;
    const auto t0 = Clock::now();
    for (int i = 0; i < passes; ++i) {
      head.loss_and_gradient(be, m.forward(be, *x, si), labels, b, b, dlogits);
      m.backward(be, dy, 0);
    }
    be.synchronize();
    return seconds_since(t0) / passes;
  }
  // The batch's copy into the backend's memory, as a training step makes it once: seconds.
  double upload(const Backend& be) {
    be.synchronize();
    const auto t0 = Clock::now();
    on_backend.put(be, host);
    be.synchronize();
    return seconds_since(t0);
  }
  // The median of `reps` whole passes after a warm-up.
  double median_pass(Model& m, const Backend& be, int reps) {
    std::vector<double> t;
    for (int r = 0; r <= reps; ++r) {
      const double s = whole_pass(m, be);
      if (r > 0) t.push_back(s);
    }
    return median(t);
  }
  int64_t b;
  Loader::Batch host;
  BatchOnBackend on_backend;
  const Tensor* x = nullptr;          // host.x, or its copy in the backend's memory
  const int32_t* labels = nullptr;    // likewise host.y
  Tensor dy, dlogits;
  SoftmaxXentHead head;
  const StepInfo si{.training = true};
};

// At least `reps` timed runs, more where a run is short: enough for a quarter of a second
// (up to 25 x reps), so that a sub-millisecond model's figures are not the medians of a few
// milliseconds in which another process happened to take the core.
int reps_for(double run_s, int reps) {
  constexpr double kSpan = 0.25;
  return std::clamp(int(kSpan / std::max(run_s, 1e-9)), reps, 25 * reps);
}

// One micro-batch size: every layer's phases over `reps` runs or more (reps_for) after a warm-up, the loss, and
// the whole forward, loss and backward without per-layer timing (MachineProfile::whole).
void measure_size(Model& m, const Backend& be, int64_t b, int reps, const PlannedModel& pm,
                  MachineProfile& prof) {
  std::vector<LayerProfile>& out = prof.layers;
  PassData d(m, be, b, pm);
  const Tensor &x = *d.x, &dy = d.dy;
  SoftmaxXentHead& head = d.head;
  const size_t L = m.layers().size();
  std::vector<Phases> runs;
  std::vector<double> loss_runs, whole_runs, input_runs;
  const StepInfo& si = d.si;
  int n_reps = reps;
  for (int r = 0; r <= n_reps; ++r) {  // run 0 warms caches and allocations up
    const auto rt = Clock::now();
    if (!be.host_memory()) input_runs.push_back(d.upload(be));
    const double wt = d.whole_pass(m, be);
    Phases p{std::vector<double>(L), std::vector<double>(L), std::vector<double>(L), std::vector<double>(L)};
    m.set_profile(&p.f);
    const Tensor& y = m.forward(be, x, si);
    m.set_profile(nullptr);
    const auto t0 = Clock::now();
    head.loss_and_gradient(be, y, d.labels, b, b, d.dlogits);
    be.synchronize();
    const double lt = seconds_since(t0);
    m.set_profile(&p.b);
    m.backward(be, dy, 0);
    m.set_profile(nullptr);
    m.forward(be, x, si);
    m.set_profile(&p.bi);
    m.backward_input(be, dy, 0, false);
    m.set_profile(&p.bw);
    m.backward_weight(be, 0, {}, false);
    m.set_profile(nullptr);
    if (r == 0) n_reps = reps_for(seconds_since(rt), reps);
    if (r > 0) {
      // The whole pass over the layers of the same run: other work that takes the core for a
      // while slows both sides of one run, and the median of the ratios leaves such runs out.
      double sum = lt;
      for (size_t i = 0; i < L; ++i) sum += p.f[i] + p.b[i];
      whole_runs.push_back(wt / std::max(sum, 1e-12));
      runs.push_back(std::move(p)), loss_runs.push_back(lt);
    }
  }
  const double n = double(b);
  for (size_t i = 0; i < L; ++i) {
    auto med = [&](std::vector<double> Phases::*ph) {
      std::vector<double> v;
      for (const Phases& p : runs) v.push_back((p.*ph)[i]);
      return median(v) / n;
    };
    out[i].at.push_back({.micro_batch = b, .forward_s = med(&Phases::f), .backward_s = med(&Phases::b),
                         .backward_input_s = med(&Phases::bi), .backward_weight_s = med(&Phases::bw)});
  }
  prof.loss.push_back({.micro_batch = b, .forward_s = median(loss_runs) / n});
  // Stored as seconds per sample: the median ratio times the layers' and the loss's medians.
  double layers = prof.loss.back().forward_s;
  for (const LayerProfile& l : out) layers += l.at.back().forward_s + l.at.back().backward_s;
  prof.whole.push_back({.micro_batch = b, .forward_s = median(whole_runs) * layers});
  if (input_runs.size() > 1) {
    input_runs.erase(input_runs.begin());  // the warm-up
    prof.input.push_back({.micro_batch = b, .forward_s = median(input_runs) / n});
  }
}

// A device idle a moment ago runs at low clocks for a fraction of a second: whole passes for a
// second first, or the sizes measured first (the smallest) look dearer than training sees them
// (on an H200 a CNN's pass at 16 samples measured 0.46-0.52 ms as a process's first work, 0.35
// after a second of other sizes).
void warm_up_device(Model& m, const Backend& be, int64_t b, const PlannedModel& pm) {
  PassData d(m, be, b, pm);
  const auto t0 = Clock::now();
  for (int i = 0; i < 2 || seconds_since(t0) < 1.0; ++i) d.whole_pass(m, be);
}

// The optimizer's step over the whole model, the median of reps, shared out to the layers by
// their parameters (its work is per float). Each step follows a whole pass at micro-batch b, as
// in training: the pass's activations have taken the caches the parameters, gradients and
// moments were in (the MLP's SGD step took 30-42 us timed back to back, 48 us in a step).
void measure_optimizer(const RunConfig& cfg, Model& m, const Backend& be, int reps, int64_t b,
                       const PlannedModel& pm, std::vector<LayerProfile>& out) {
  PassData d(m, be, b, pm);
  OptimConfig oc{.kind = cfg.train.optimizer, .lr = cfg.train.lr, .momentum = cfg.train.momentum,
                 .weight_decay = cfg.train.weight_decay, .nesterov = cfg.train.nesterov,
                 .beta1 = cfg.train.beta1, .beta2 = cfg.train.beta2, .eps = cfg.train.eps,
                 .grad_clip = cfg.train.grad_clip};
  Optimizer opt(oc, m.values().size());
  opt.place(be);  // its state where the updates run, as training's
  std::vector<double> t;
  int n_reps = reps;
  for (int r = 0; r <= n_reps; ++r) {
    const auto rt = Clock::now();
    d.whole_pass(m, be);
    const auto t0 = Clock::now();
    opt.step(be, m.values(), m.grads(), r);
    be.synchronize();
    if (r == 0) n_reps = reps_for(seconds_since(rt), reps);
    if (r > 0) t.push_back(seconds_since(t0));
  }
  int64_t total = 0;
  for (const LayerProfile& l : out) total += l.params;
  for (LayerProfile& l : out) l.optimizer_s = total ? median(t) * double(l.params) / double(total) : 0;
}

// The step's batch as the training thread gets it from the loader (the split in memory: the
// gather of its rows, converted to floats; streamed: the wait for the reader thread), per
// sample, added to p.input at every size (a device's upload there). A gather's cost is per row,
// so one Loader at the largest size the split holds times it: a Loader per size read the whole
// split again for each. Each batch after a whole pass, as in training (the step's weights and
// activations have taken the caches). Nothing for a preset without a data file. The MLP's 64
// Fashion-MNIST rows: 16 us, 2 % of its step.
void measure_loader(const RunConfig& cfg, Model& m, const Backend& be, int reps, const PlannedModel& pm,
                    MachineProfile& p) {
  const std::optional<DatasetInfo> info = planned_dataset(cfg);
  if (!info) return;
  int64_t b = 0;  // the largest size the loader accepts (no more samples than the split)
  for (const int64_t s : p.micro_batches) b = s <= info->train.n ? std::max(b, s) : b;
  if (b == 0) return;
  Loader loader(*info, "train", b, 0, 1, /*shuffle=*/true, cfg.train.seed);
  PassData d(m, be, b, pm);
  std::vector<double> t;
  for (int r = 0; r <= std::max(reps, 20); ++r) {
    d.whole_pass(m, be);
    const auto t0 = Clock::now();
    loader.next();
    if (r > 0) t.push_back(seconds_since(t0));
  }
  const double per_sample = median(t) / double(b);
  std::vector<LayerTiming> out;
  for (const int64_t s : p.micro_batches) {
    double up = 0;
    for (const LayerTiming& u : p.input) up += u.micro_batch == s ? u.forward_s : 0;
    out.push_back({.micro_batch = s, .forward_s = per_sample + up});
  }
  p.input = std::move(out);
}

// The layers at every micro-batch size, a progress line each.
void measure_sizes(Model& m, const Backend& be, int reps, const PlannedModel& pm, MachineProfile& p,
                   const std::function<void(const std::string&)>& say) {
  for (int64_t b : p.micro_batches) {
    const auto t0 = Clock::now();
    measure_size(m, be, b, reps, pm, p);
    double step = 0;
    for (const LayerProfile& l : p.layers) step += (l.at.back().forward_s + l.at.back().backward_s) * double(b);
    const std::string upload =
        p.input.empty() ? "" : fmt::format(", its upload {:.3f} ms", p.input.back().forward_s * double(b) * 1e3);
    say(fmt::format("bench layers: micro-batch {:>5}: forward + backward {:.3f} ms layer by layer, {:.3f} ms "
                    "whole with the loss{} ({:.1f} s measuring)", b, step * 1e3,
                    p.whole.back().forward_s * double(b) * 1e3, upload, seconds_since(t0)));
  }
}

// write + fsync of `bytes` to a file in dir, 3 times; the median bandwidth.
double checkpoint_bandwidth(const std::string& dir, int64_t bytes) {
  make_directories(dir);
  const std::string path = dir + "/.strata-bench-layers.tmp";
  std::vector<char> buf(size_t(std::min<int64_t>(bytes, 8 << 20)), 1);
  std::vector<double> bw;
  for (int r = 0; r < 3; ++r) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) fail_input("--checkpoint_dir {}: cannot write a file there: {}", dir, std::strerror(errno));
    const auto t0 = Clock::now();
    for (int64_t done = 0; done < bytes;) {
      const ssize_t w = ::write(fd, buf.data(), size_t(std::min<int64_t>(int64_t(buf.size()), bytes - done)));
      if (w <= 0) {
        ::close(fd);
        ::unlink(path.c_str());
        fail_input("--checkpoint_dir {}: writing failed: {}", dir, std::strerror(errno));
      }
      done += w;
    }
    ::fsync(fd);
    ::close(fd);
    bw.push_back(double(bytes) / std::max(seconds_since(t0), 1e-9));
  }
  ::unlink(path.c_str());
  return median(bw);
}

double memory_bandwidth() {
  std::vector<char> a(64 << 20, 1), b(64 << 20, 0);
  std::vector<double> bw;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), a.size());
    bw.push_back(2.0 * double(a.size()) / std::max(seconds_since(t0), 1e-9));  // read + write
    a[size_t(r)] = b[size_t(r) + 1];
  }
  return median(bw);
}

}  // namespace

std::vector<int64_t> default_micro_batches(int64_t G) {
  std::vector<int64_t> v;
  for (int64_t b = 1; b < G; b *= 2)
    if (b >= G / 16) v.push_back(b);
  v.push_back(std::max<int64_t>(1, G));
  return v;
}

void describe_node(MachineProfile& p) {
  std::ifstream f("/proc/cpuinfo");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  p.cpu_model = cpuinfo_field(text, "model name");
  p.cpu_family = cpuinfo_field(text, "cpu family");
  p.cpu_model_id = cpuinfo_field(text, "model");
  cpu_set_t set;
  p.cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : int(sysconf(_SC_NPROCESSORS_ONLN));
  const dnnl_version_t* v = dnnl_version();
  p.versions["onednn"] = fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string m(mpi, size_t(len));
  p.versions["mpi"] = m.substr(0, m.find_first_of(",\n"));
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  p.versions["hdf5"] = fmt::format("{}.{}.{}", maj, min, rel);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  p.date = date;
}

namespace {

// The busy node's message tag: rank 0's release of the other ranks.
constexpr int kReleaseTag = 7301;

// The micro-batch the node's ranks run at once: what each runs under D = ranks.
int64_t busy_micro_batch(const RunConfig& cfg, int ranks) {
  return std::max<int64_t>(1, cfg.train.batch_size / ranks);
}

// Every rank of the node runs whole passes at once (from a barrier): the median of each.
double busy_pass_s(Model& m, const Backend& be, PassData& d, int reps, Comm& node) {
  node.barrier();
  return d.median_pass(m, be, reps);
}

// Rounds of the busy node's measurement, each the passes together and then rank 0's alone:
// the slowdown is the median round's. One round taken in this VM's slow mode (two ranks
// run 1.5-2.5x slower for seconds at a time) measured the CNN's 1.40x against 1.00-1.02x in
// every other profile of the day, and its D = 2 grid was predicted 28 % slow.
constexpr int kBusyRounds = 3;

// Rank 0's side: per round the passes with the node busy, then alone while the others wait
// without spinning (yielding waits), then the others' next round or their release.
std::vector<double> measure_busy(Model& m, const Backend& be, const RunConfig& cfg,
                                 const PlannedModel& pm, int reps, Comm& node, MachineProfile& p) {
  PassData d(m, be, busy_micro_batch(cfg, node.size()), pm);
  std::vector<double> ratios;
  for (int round = 0; round < kBusyRounds; ++round) {
    const double together = busy_pass_s(m, be, d, reps, node);
    const double alone = d.median_pass(m, be, reps);
    ratios.push_back(together / std::max(alone, 1e-12));
    float more = round + 1 < kBusyRounds ? 1.0f : 0.0f;
    for (int r = 1; r < node.size(); ++r) node.wait(node.start_send(&more, 1, r, kReleaseTag));
  }
  p.busy_ranks = node.size();
  p.busy_slowdown = std::max(1.0, median(ratios));  // (noise below 1)
  return ratios;
}

// A model as bench layers times it: without recomputation (the step-time model adds it).
RunConfig profiled_config(const RunConfig& given) {
  RunConfig cfg = given;
  cfg.train.recompute = "none";
  return cfg;
}

}  // namespace

void bench_layers_busy_peer(const RunConfig& given, Comm& node, int reps) {
  const RunConfig cfg = profiled_config(given);
  const PlannedModel pm = plan_model(cfg);
  std::string note;
  const Backend& be = select_backend({.device = cfg.device, .threads = cfg.threads,
                                      .precision = cfg.train.precision}, &note);
  Model m(cfg.model_spec(pm.classes), pm.input, pm.classes);
  m.init(1);
  m.place(be);
  PassData d(m, be, busy_micro_batch(cfg, node.size()), pm);
  for (float more = 1; more != 0;) {
    busy_pass_s(m, be, d, reps, node);
    node.set_yielding_waits(true);
    node.wait(node.start_recv(&more, 1, 0, kReleaseTag));
    node.set_yielding_waits(false);
  }
}

MachineProfile bench_layers(const RunConfig& given, const LayerBenchOptions& o) {
  // The layers without recomputation: the step-time model adds a block's forward to its
  // backward for train.recompute = block.
  const RunConfig cfg = profiled_config(given);
  auto say = [&](const std::string& s) { if (o.progress) o.progress(s); };
  const PlannedModel pm = plan_model(cfg);
  std::string note;
  const Backend& be = select_backend({.device = cfg.device, .threads = cfg.threads,
                                      .precision = cfg.train.precision}, &note);
  MachineProfile p;
  describe_node(p);
  p.device = be.name;
  p.gpu = be.host_memory() ? "" : note;
  p.versions["backend"] = note;
  p.precision = cfg.train.precision;
  p.threads = cfg.threads;
  p.config = cfg.config_path;
  p.model_type = cfg.model.type;
  p.micro_batches = o.micro_batches;
  if (p.micro_batches.empty()) p.micro_batches = default_micro_batches(cfg.train.batch_size);
  std::sort(p.micro_batches.begin(), p.micro_batches.end());
  p.micro_batches.erase(std::unique(p.micro_batches.begin(), p.micro_batches.end()), p.micro_batches.end());
  Model m(cfg.model_spec(pm.classes), pm.input, pm.classes);
  m.init(1);
  m.place(be);
  const auto& layers = m.layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerInfo& li = pm.layers[i];
    p.layers.push_back({.index = int(i), .name = li.name, .kind = li.describe, .params = li.params,
                        .flops = li.flops, .splits = layers[i]->splits_backward(), .optimizer_s = 0, .at = {}});
  }
  say(fmt::format("bench layers: {} layers of {} on {} ({}, {} thread{}), micro-batches {}",
                  layers.size(), cfg.model.type, be.name, p.precision, p.threads,
                  p.threads == 1 ? "" : "s", fmt::join(p.micro_batches, ", ")));
  if (!be.host_memory()) warm_up_device(m, be, p.micro_batches.back(), pm);
  if (o.node && o.node->size() > 1) {
    const std::vector<double> rounds = measure_busy(m, be, cfg, pm, o.reps, *o.node, p);
    say(fmt::format("bench layers: the whole pass at micro-batch {} with the node's {} ranks at once: "
                    "{:.2f}x the pass alone (rounds {:.3f})", busy_micro_batch(cfg, p.busy_ranks),
                    p.busy_ranks, p.busy_slowdown, fmt::join(rounds, ", ")));
  }
  const auto wall0 = Clock::now();
  const double cpu0 = process_cpu_s();
  measure_sizes(m, be, o.reps, pm, p, say);
  if (be.host_memory())  // (the loader's reads of its file below are no other work's)
    p.cpu_share = std::min(1.0, (process_cpu_s() - cpu0) / std::max(seconds_since(wall0), 1e-9) / p.threads);
  measure_optimizer(cfg, m, be, o.reps, p.micro_batches.back(), pm, p.layers);
  measure_loader(cfg, m, be, o.reps, pm, p);
  std::vector<std::string> batches;
  for (const LayerTiming& t : p.input)
    batches.push_back(fmt::format("{}: {:.3f} ms", t.micro_batch, t.forward_s * double(t.micro_batch) * 1e3));
  if (!batches.empty())
    say(fmt::format("bench layers: the step's batch from the loader{}, per size: {}",
                    be.host_memory() ? "" : " and its upload", fmt::join(batches, ", ")));
  const int64_t state = m.num_params() * int64_t(sizeof(float)) *
                        (cfg.train.optimizer == "adamw" ? 3 : 2);
  p.checkpoint_bytes = std::max<int64_t>(state, 4 << 20);
  const std::string dir = o.checkpoint_dir.empty() ? cfg.checkpoint_dir() : o.checkpoint_dir;
  p.checkpoint_write_Bps = checkpoint_bandwidth(dir, p.checkpoint_bytes);
  p.memory_Bps = memory_bandwidth();
  say(fmt::format("bench layers: checkpoint write {:.0f} MB/s to {} ({:.1f} MB, with fsync); "
                  "memory copy {:.1f} GB/s; CPU share while timing {:.2f}{}", p.checkpoint_write_Bps / 1e6,
                  dir, double(p.checkpoint_bytes) / 1e6, p.memory_Bps / 1e9, p.cpu_share,
                  p.cpu_share < 0.9 ? " (other work shared the cores: the figures include it)" : ""));
  return p;
}

}  // namespace strata
