// Optimizer ops: sgd_update and adamw_update over several steps, sum_squares, scale_inplace.
//
// Tolerances:
//  - SGD, AdamW 1e-6 after several steps: the CUDA kernels use the CPU's operations in its
//    order without FMA contraction, so the results are expected to be bitwise equal (the
//    "unequal" column); the tolerance leaves room only for a last-place difference.
//  - sum_squares 1e-12 relative: exact double products summed in double, in two orders.
//  - scale_inplace exact: one IEEE product per element.
#include <fmt/format.h>

#include "harness.h"
#include "table.h"

namespace strata::optest {
namespace {

const Tol kUpdateTol = Tol::close(1e-6);
// One element (no vector body), and an odd size over several blocks.
const int64_t kSizes[] = {1, 10007};

}  // namespace

// Three steps (the first one fills the momentum buffer) from the same gradients on both sides.
void check_sgd_update() {
  struct Config {
    float momentum, wd;
    bool nesterov, with_buffer;
  };
  const Config configs[] = {{0.9f, 0.f, false, true},
                            {0.9f, 1e-2f, false, true},
                            {0.9f, 1e-2f, true, true},
                            {0.f, 1e-2f, false, false},
                            {0.5f, 0.f, false, false}};  // momentum without a buffer: plain step
  for (int64_t n : kSizes)
    for (const Config& k : configs) {
      OpCase c(fmt::format("sgd_update n{} m={} wd={}{}{} 3 steps", n, k.momentum, k.wd,
                           k.nesterov ? " nesterov" : "", k.with_buffer ? "" : " no buffer"));
      const F32 param = c.inout("param", random_vector(81, size_t(n)), kUpdateTol);
      const F32 buf =
          k.with_buffer ? c.inout("momentum", std::vector<float>(size_t(n)), kUpdateTol) : F32{};
      const F32 g[3] = {c.in(random_vector(82, size_t(n))), c.in(random_vector(83, size_t(n))),
                        c.in(random_vector(84, size_t(n)))};
      c.run([&](const Backend& be, const Ptrs& p) {
        for (int step = 0; step < 3; ++step)
          be.sgd_update(p[param], p[g[step]], p[buf], n, 0.05f, k.momentum, k.wd, k.nesterov,
                        step == 0);
      });
    }
}

// Five steps (bias corrections 1..5). beta1 0.3: the lerp weight 1 - beta1 >= 0.5 takes
// torch.lerp's other branch.
void check_adamw_update() {
  struct Config {
    float lr, beta1, beta2, eps, wd;
  };
  const Config configs[] = {{1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f}, {3e-2f, 0.3f, 0.99f, 1e-6f, 0.f}};
  for (int64_t n : kSizes)
    for (const Config& k : configs) {
      OpCase c(fmt::format("adamw_update n{} lr={} b1={} wd={} 5 steps", n, k.lr, k.beta1, k.wd));
      const F32 param = c.inout("param", random_vector(91, size_t(n)), kUpdateTol);
      const F32 m = c.inout("m", std::vector<float>(size_t(n)), kUpdateTol);
      const F32 v = c.inout("v", std::vector<float>(size_t(n)), kUpdateTol);
      std::vector<F32> g;
      for (int t = 1; t <= 5; ++t) g.push_back(c.in(random_vector(uint64_t(92 + t), size_t(n))));
      c.run([&](const Backend& be, const Ptrs& p) {
        for (int64_t t = 1; t <= 5; ++t)
          be.adamw_update(p[param], p[g[size_t(t - 1)]], p[m], p[v], n, k.lr, k.beta1, k.beta2,
                          k.eps, k.wd, t);
      });
    }
}

// Sizes across one block, several, and many (a two-level reduction); none at all.
void check_sum_squares() {
  for (int64_t n :
       {int64_t(0), int64_t(1), int64_t(1000), (int64_t(1) << 20) + 5, int64_t(5) << 20}) {
    OpCase c(fmt::format("sum_squares n{}", n));
    const F32 x = c.in(random_vector(101, size_t(n)));
    c.run([&](const Backend& be, const Ptrs& p) { return be.sum_squares(p[x], {{0, n}}); },
          Tol::close(1e-12));
  }
  // Pieces of a padded flat buffer (zeros between them): 3 tensors of 37, 64 and 1000 floats,
  // each at a multiple of 64.
  {
    const FlatPieces pieces = {{0, 37}, {64, 64}, {128, 1000}};
    auto x = random_vector(102, 1128);
    std::fill(x.begin() + 37, x.begin() + 64, 0.f);
    OpCase c("sum_squares 3 pieces, padded");
    const F32 in = c.in(x);
    c.run([&](const Backend& be, const Ptrs& p) { return be.sum_squares(p[in], pieces); },
          Tol::close(1e-12));
  }
  const Backend& be = select_target(Precision::fp32);
  INFO("sum_squares of nothing, at a null pointer, on " << be.name);
  CHECK(be.sum_squares(nullptr, {}) == 0.0);
}

void check_scale_inplace() {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(77777)}) {
    OpCase c(fmt::format("scale_inplace n{}", n));
    const F32 x = c.inout("x", random_vector(61, size_t(n)), Tol::exact());
    c.run([&](const Backend& be, const Ptrs& p) { be.scale_inplace(p[x], n, 0.37f); });
  }
}

}  // namespace strata::optest
