// Where a training step of the benchmark MLP goes, phase by phase, robust to a shared machine.
// Runs strata's own loop pieces (Loader, Model, Optimizer with the per-layer update in
// backward that one rank uses) on Fashion-MNIST, one thread, batch 64, and reports for each
// phase the minimum and median over all steps of thread CPU time in microseconds. Minimum and
// median of CPU time move far less with other load than bench_train.sh's wall-clock epoch does,
// so they show what a kernel change did.
//   usage: bench_step [data.h5 (default data/fashion-mnist.h5)] [epochs (default 3)]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/data.h"
#include "model/model.h"
#include "model/optim.h"
#include "strata/backend.h"

using namespace strata;

namespace {

double thread_us() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

struct Phase {
  const char* name;
  std::vector<double> us;
  double at(double q) {
    std::vector<double> v = us;
    std::sort(v.begin(), v.end());
    return v[size_t(q * double(v.size() - 1))];
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "data/fashion-mnist.h5";
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 3;
  const int64_t G = 64;
  std::string why;
  const Backend& be = select_backend({.device = "cpu", .threads = 1}, &why);
  DatasetInfo info = open_dataset(path);
  Model model({"flatten", "linear 256", "relu", "linear 128", "relu", "linear 10"},
              info.train.sample_shape, info.classes);
  model.init(1);
  Loader loader(info, "train", G, 0, 1, true, 1);
  const int64_t steps = loader.batches_per_epoch() * epochs;
  OptimConfig oc{.kind = "sgd", .lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4};
  Optimizer opt(oc, model.num_params());
  Tensor probs, dlogits;
  Phase load{"loader next", {}}, fwd{"forward", {}}, loss{"softmax xent", {}},
      bwd{"backward + update", {}},
      all{"step", {}};
  double loss_sum = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const double t0 = thread_us();
    const auto& batch = loader.next();
    const double t1 = thread_us();
    StepInfo si{.training = true, .seed = 1, .step = uint64_t(step), .first_sample = 0};
    const Tensor& logits = model.forward(be, batch.x, si);
    const double t2 = thread_us();
    probs.resize(logits.shape);
    dlogits.resize(logits.shape);
    const int b = int(batch.y.size());
    loss_sum += be.softmax_xent_forward(probs.data(), logits.data(), batch.y.data(), b,
                                        info.classes);
    be.softmax_xent_backward(dlogits.data(), probs.data(), batch.y.data(), b, info.classes,
                             1.0f / float(G));
    const double t3 = thread_us();
    int64_t updated = 0;
    model.backward(be, dlogits, 0, [&](int64_t ready) {
      opt.apply(be, model.values(), model.grads(), updated, ready, step);
      updated = ready;
    });
    opt.end_step();
    const double t4 = thread_us();
    load.us.push_back(t1 - t0);
    fwd.us.push_back(t2 - t1);
    loss.us.push_back(t3 - t2);
    bwd.us.push_back(t4 - t3);
    all.us.push_back(t4 - t0);
  }
  std::printf("bench_step: MLP 784-256-128-10, batch %lld, %lld steps, %s\n", (long long)G,
              (long long)steps, why.c_str());
  std::printf("  mean training loss %.6f\n",
              loss_sum / double(steps * G));
  std::printf("  %-20s %9s %9s %9s   (thread CPU time per step, us)\n", "phase", "min", "p25",
              "median");
  for (Phase* p : {&load, &fwd, &loss, &bwd, &all})
    std::printf("  %-20s %9.1f %9.1f %9.1f\n", p->name, p->at(0), p->at(0.25), p->at(0.5));
  return 0;
}
