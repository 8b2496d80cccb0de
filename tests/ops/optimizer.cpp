// Optimizer ops: sgd_update and adamw_update over several steps (and their out-of-place forms,
// the CPU only), sum_squares, scale_inplace.
//
// Tolerances:
//  - SGD, AdamW 1e-6 after several steps: the CUDA kernels use the CPU's operations in its
//    order without FMA contraction, so the results are expected to be bitwise equal (the
//    "unequal" column); the tolerance leaves room only for a last-place difference.
//  - sum_squares 1e-12 relative: exact double products summed in double, in two orders.
//  - scale_inplace exact: one IEEE product per element.
// The CPU kernels' own tests at the end ([cpu_kernel], cpu_kernel.h: against torch.optim's
// formulas in double, sum_squares over padded pieces).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_kernel.h"
#include "strata/lane_sums.h"
#include "strata/tensor.h"
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

// The out-of-place forms (CPU only: their cases are hidden, table.cpp), three steps that
// alternate between two sets of buffers, as a memory checkpoint's generations do.
void check_sgd_update_to() {
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("sgd_update_to n{} 3 steps, alternating", n));
    const F32 p0 = c.inout("param", random_vector(81, size_t(n)), kUpdateTol);
    const F32 p1 = c.inout("param'", std::vector<float>(size_t(n)), kUpdateTol);
    const F32 b0 = c.inout("momentum", std::vector<float>(size_t(n)), kUpdateTol);
    const F32 b1 = c.inout("momentum'", std::vector<float>(size_t(n)), kUpdateTol);
    const F32 g = c.in(random_vector(82, size_t(n)));
    c.run([&](const Backend& be, const Ptrs& p) {
      for (int step = 0; step < 3; ++step) {
        const bool odd = step % 2 != 0;
        be.sgd_update_to(p[odd ? p1 : p0], p[g], p[odd ? b1 : b0], p[odd ? p0 : p1],
                         p[odd ? b0 : b1], n, 0.05f, 0.9f, 1e-2f, false, step == 0, nullptr,
                         false);
      }
    });
  }
}

void check_adamw_update_to() {
  for (int64_t n : kSizes) {
    OpCase c(fmt::format("adamw_update_to n{} 2 steps, alternating", n));
    const F32 p0 = c.inout("param", random_vector(91, size_t(n)), kUpdateTol);
    const F32 p1 = c.inout("param'", std::vector<float>(size_t(n)), kUpdateTol);
    F32 s[4];
    for (F32& x : s) x = c.inout("state", std::vector<float>(size_t(n)), kUpdateTol);
    const F32 g = c.in(random_vector(92, size_t(n)));
    c.run([&](const Backend& be, const Ptrs& p) {
      be.adamw_update_to(p[p0], p[g], p[s[0]], p[s[1]], p[p1], p[s[2]], p[s[3]], n, 1e-3f, 0.9f,
                         0.999f, 1e-8f, 1e-2f, 1, nullptr, false);
      be.adamw_update_to(p[p1], p[g], p[s[2]], p[s[3]], p[p0], p[s[0]], p[s[1]], n, 1e-3f, 0.9f,
                         0.999f, 1e-8f, 1e-2f, 2, nullptr, false);
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

// ---- The CPU kernels ([cpu_kernel]) --------------------------------------------------------

using namespace strata::cpu;

TEST_CASE("sgd_update follows torch.optim.SGD for two steps", "[cpu_kernel][optim]") {
  const float lr = 0.1f, mom = 0.9f, wd = 0.01f;
  const Vec g1 = {0.5f, -1.f, 2.f}, g2 = {-0.25f, 0.5f, 1.f};
  for (bool nesterov : {false, true}) {
    Vec p = {1.f, -2.f, 0.5f}, buf = nan_vec(3);  // buf is not read on the first step
    std::vector<double> hp(p.begin(), p.end()), hb(3);
    for (int step = 0; step < 2; ++step) {
      const Vec& g = step == 0 ? g1 : g2;
      sgd_update(p.data(), g.data(), buf.data(), 3, lr, mom, wd, nesterov, step == 0);
      for (int i = 0; i < 3; ++i) {
        const double d = g[i] + double(wd) * hp[i];
        hb[i] = step == 0 ? d : double(mom) * hb[i] + d;
        hp[i] -= double(lr) * (nesterov ? d + double(mom) * hb[i] : hb[i]);
      }
    }
    for (int i = 0; i < 3; ++i) {
      INFO("nesterov " << nesterov << " i " << i);
      // fp32 rounding of O(1) values: a few 1e-7 absolute (p can cancel to near 0).
      CHECK(p[i] == Approx(hp[i]).margin(1e-6));
      CHECK(buf[i] == Approx(hb[i]).margin(1e-6));
    }
  }
  // Momentum 0: plain (weight-decayed) gradient step, buffer unused.
  Vec p = {1.f, -2.f, 0.5f};
  sgd_update(p.data(), g1.data(), nullptr, 3, lr, 0.f, 0.f, false, true);
  CHECK(p == Vec{1.f - 0.05f, -2.f + 0.1f, 0.5f - 0.2f});
}

TEST_CASE("adamw_update follows torch.optim.AdamW for two steps", "[cpu_kernel][optim]") {
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
  Rng rng(11);
  // n = 3 by hand-picked values; n = 600 also crosses the kernel's 256-element blocks and its
  // 4-wide sqrt with a remainder.
  for (int n : {3, 600}) {
    Vec g1 = {0.5f, -1.f, 2e-3f}, g2 = {-0.25f, 0.5f, 1.f}, p = {1.f, -2.f, 0.5f};
    if (n > 3) g1 = rand_vec(rng, n), g2 = rand_vec(rng, n), p = rand_vec(rng, n);
    Vec m(n, 0.f), v(n, 0.f);
    std::vector<double> hp(p.begin(), p.end()), hm(n, 0.0), hv(n, 0.0);
    for (int t = 1; t <= 2; ++t) {
      const Vec& g = t == 1 ? g1 : g2;
      adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, t);
      for (int i = 0; i < n; ++i) {
        hp[i] *= 1.0 - double(lr) * wd;
        hm[i] = double(b1) * hm[i] + (1.0 - b1) * g[i];
        hv[i] = double(b2) * hv[i] + (1.0 - b2) * double(g[i]) * g[i];
        const double bc1 = 1.0 - std::pow(double(b1), t), bc2 = 1.0 - std::pow(double(b2), t);
        hp[i] -= double(lr) / bc1 * hm[i] / (std::sqrt(hv[i]) / std::sqrt(bc2) + eps);
      }
    }
    for (int i = 0; i < n; ++i) {
      INFO("n " << n << " i " << i);
      // fp32 against double: a few ulp relative, plus a few ulp of the terms summed for values
      // that cancel to near 0 (p terms are O(1), m terms O(0.1)).
      CHECK(p[i] == Approx(hp[i]).epsilon(1e-6).margin(3e-7));
      CHECK(m[i] == Approx(hm[i]).epsilon(1e-6).margin(3e-8));
      CHECK(v[i] == Approx(hv[i]).epsilon(1e-5).margin(1e-12));
    }
  }
}

// The vector kernel (AVX-512 where the CPU has it) against the formula's float operations one
// element at a time, bit for bit: the same operations in the same order, none fused. Both lerp
// forms (beta1 0.9: from m; 0.3: from g), lengths around the 16-lane vector and a long one.
TEST_CASE("adamw_update: bitwise the formula's float operations, element by element",
          "[cpu_kernel][optim]") {
  Rng rng(12);
  const float lr = 1e-3f, b2 = 0.99f, eps = 1e-8f, wd = 0.1f;
  const int64_t t = 7;
  for (float b1 : {0.9f, 0.3f})
    for (int n : {1, 15, 16, 17, 600, 10007}) {
      const Vec g = rand_vec(rng, n), p0 = rand_vec(rng, n), m0 = rand_vec(rng, n);
      Vec v0 = rand_vec(rng, n);
      for (float& x : v0) x = std::fabs(x);
      Vec p = p0, m = m0, v = v0;
      adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, t);
      const float decay = float(1.0 - double(lr) * wd), w = float(1.0 - double(b1));
      const float omb2 = float(1.0 - double(b2));
      const float neg_step = float(-(double(lr) / (1.0 - std::pow(double(b1), double(t)))));
      const float bc2 = float(std::sqrt(1.0 - std::pow(double(b2), double(t))));
      int bad = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = g[i] - m0[i];
        const float mi = w < 0.5f ? m0[i] + w * diff : g[i] - diff * (1.f - w);
        const float vi = v0[i] * b2 + omb2 * g[i] * g[i];
        const float denom = std::sqrt(vi) / bc2 + eps;
        const float pi = p0[i] * decay + neg_step * mi / denom;
        bad += std::memcmp(&pi, &p[i], 4) != 0 || std::memcmp(&mi, &m[i], 4) != 0 ||
               std::memcmp(&vi, &v[i], 4) != 0;
      }
      INFO("beta1 " << b1 << " n " << n);
      CHECK(bad == 0);
    }
}

TEST_CASE("sum_squares and scale_inplace", "[cpu_kernel][optim]") {
  Rng rng(9);
  Vec x = rand_vec(rng, 1001);
  double want = 0;
  for (float v : x) want += double(v) * v;
  // Both sum exact double products; only the summation order differs.
  const double packed = sum_squares(x.data(), {{0, int64_t(x.size())}});
  CHECK(packed == Approx(want).epsilon(1e-12));
  // The same floats as padded pieces (as the flat buffers hold tensors of 13, 700 and 288)
  // sum bit for bit as the packed array: the padding shifts no lane.
  Vec padded(64 + 704 + 288, 0.f);
  std::copy_n(x.begin(), 13, padded.begin());
  std::copy_n(x.begin() + 13, 700, padded.begin() + 64);
  std::copy_n(x.begin() + 713, 288, padded.begin() + 768);
  CHECK(sum_squares(padded.data(), {{0, 13}, {64, 700}, {768, 288}}) == packed);
  CHECK(sum_squares(padded.data(), {{64, 700}}) == sum_squares(x.data() + 13, {{0, 700}}));
  const Vec x0 = x;
  scale_inplace(x.data(), int64_t(x.size()), 0.5f);
  for (size_t i = 0; i < x.size(); ++i) CHECK(x[i] == x0[i] * 0.5f);
}

namespace {

// want's bits in got's first want.size() floats.
bool bits_equal(const Vec& want, const Tensor& got) {
  return std::memcmp(want.data(), got.data(), sizeof(float) * want.size()) == 0;
}
// lane_sums_run over each output's first n floats, each output's sums after the last's.
std::vector<uint32_t> lane_sums_of(const std::vector<const Tensor*>& outs, int64_t n) {
  std::vector<uint32_t> r(outs.size() * kRunningWords, 0);
  for (size_t k = 0; k < outs.size(); ++k) lane_sums_run(outs[k]->data(), n, r.data() + k * kRunningWords);
  return r;
}

}  // namespace

// Out of place, the update writes the same bits it writes in place, and its lane sums are
// those of lane_sums_run over what it wrote (the vector body's, the tail's, AdamW's blocks'),
// with stores through the cache or past it (into 256-byte aligned outputs, as the flat
// buffers are: streaming stores need 64).
TEST_CASE("sgd_update_to and adamw_update_to: the in-place bits, and lane sums of the outputs",
          "[cpu_kernel][optim]") {
  Rng rng(13);
  const bool stream = GENERATE(false, true);
  for (int n : {1, 16, 600, 10007}) {
    const Vec g = rand_vec(rng, n), p0 = rand_vec(rng, n), s0 = rand_vec(rng, n),
              v0 = rand_vec(rng, n);
    Vec v_abs(v0);
    for (float& x : v_abs) x = std::fabs(x);
    auto same = bits_equal;
    auto reference = [n](const std::vector<const Tensor*>& outs) { return lane_sums_of(outs, n); };
    for (bool first : {true, false}) {
      INFO("n " << n << " first step " << first << " stream " << stream);
      Vec p = p0, b = s0;
      Tensor po({n}), bo({n});
      std::vector<uint32_t> sums(2 * kRunningWords, 0);
      sgd_update(p.data(), g.data(), b.data(), n, 0.05f, 0.9f, 1e-2f, false, first);
      sgd_update_to(p0.data(), g.data(), s0.data(), po.data(), bo.data(), n, 0.05f, 0.9f, 1e-2f,
                    false, first, sums.data(), stream);
      CHECK(same(p, po));
      CHECK(same(b, bo));
      CHECK(sums == reference({&po, &bo}));
      // In two calls that go on from the sums (a whole number of blocks first), per output.
      if (n < 4096) continue;
      std::vector<uint32_t> halves(2 * kRunningWords, 0);
      for (int64_t at : {int64_t(0), int64_t(4096)}) {
        const int64_t k = at == 0 ? 4096 : n - 4096;
        sgd_update_to(p0.data() + at, g.data() + at, s0.data() + at, po.data() + at, bo.data() + at,
                      k, 0.05f, 0.9f, 1e-2f, false, first, halves.data(), stream);
      }
      CHECK(halves == sums);
    }
    Vec p = p0, m = s0, v = v_abs;
    Tensor po({n}), mo({n}), vo({n});
    std::vector<uint32_t> sums(3 * kRunningWords, 0);
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 3);
    adamw_update_to(p0.data(), g.data(), s0.data(), v_abs.data(), po.data(), mo.data(),
                    vo.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 3, sums.data(), stream);
    INFO("adamw n " << n << " stream " << stream);
    CHECK(same(p, po));
    CHECK(same(m, mo));
    CHECK(same(v, vo));
    CHECK(sums == reference({&po, &mo, &vo}));
  }
}

// The state an update may write over its gradient (Optimizer::state_over_grad: SGD's momentum,
// AdamW's exp_avg_sq; memory checkpoints put the gradients there, run/update_generations.h):
// that output in the gradient's buffer gives the in-place bits and the same lane sums.
TEST_CASE("sgd_update_to and adamw_update_to: the state written over the gradient, the in-place bits",
          "[cpu_kernel][optim]") {
  Rng rng(17);
  const bool stream = GENERATE(false, true);
  for (int n : {1, 16, 600, 10007}) {
    const Vec g = rand_vec(rng, n), p0 = rand_vec(rng, n), s0 = rand_vec(rng, n);
    Vec v_abs = rand_vec(rng, n);
    for (float& x : v_abs) x = std::fabs(x);
    auto same = bits_equal;
    auto gradient = [&] {  // an aligned buffer holding g, as the target's state is
      Tensor t({n});
      std::copy(g.begin(), g.end(), t.data());
      return t;
    };
    auto sums_of = [n](const std::vector<const Tensor*>& outs) { return lane_sums_of(outs, n); };
    for (bool first : {true, false}) {
      INFO("sgd n " << n << " first step " << first << " stream " << stream);
      Vec p = p0, b = s0;
      sgd_update(p.data(), g.data(), b.data(), n, 0.05f, 0.9f, 1e-2f, false, first);
      Tensor po({n}), gb = gradient();
      std::vector<uint32_t> sums(2 * kRunningWords, 0);
      sgd_update_to(p0.data(), gb.data(), s0.data(), po.data(), gb.data(), n, 0.05f, 0.9f, 1e-2f,
                    false, first, sums.data(), stream);
      CHECK(same(p, po));
      CHECK(same(b, gb));
      CHECK(sums == sums_of({&po, &gb}));
    }
    INFO("adamw n " << n << " stream " << stream);
    Vec p = p0, m = s0, v = v_abs;
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 3);
    Tensor po({n}), mo({n}), gv = gradient();
    std::vector<uint32_t> sums(3 * kRunningWords, 0);
    adamw_update_to(p0.data(), gv.data(), s0.data(), v_abs.data(), po.data(), mo.data(), gv.data(),
                    n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 3, sums.data(), stream);
    CHECK(same(p, po));
    CHECK(same(m, mo));
    CHECK(same(v, gv));
    CHECK(sums == sums_of({&po, &mo, &gv}));
  }
}

// The checksum's promises (lane_sums.h): a changed word or byte changes it, words swapped
// between blocks change it, and pieces placed at their blocks add up to the whole's.
TEST_CASE("lane sums: pieces add up, a flipped byte or swapped words change them", "[cpu_kernel][optim]") {
  Rng rng(17);
  const Vec x = rand_vec(rng, 1000);
  auto whole = [](const Vec& v) {
    uint32_t total[kRunningWords] = {};
    lane_sums_place(total, v.data(), int64_t(v.size()), 0);
    return std::vector<uint32_t>(total, total + kRunningWords);
  };
  const std::vector<uint32_t> want = whole(x);
  uint32_t total[kRunningWords] = {};
  for (int64_t at : {int64_t(320), int64_t(0), int64_t(640)}) {  // any order, the last partial
    const int64_t n = at == 640 ? int64_t(x.size()) - at : 320;
    lane_sums_place(total, x.data() + at, n, at / kSumLanes);
  }
  CHECK(std::vector<uint32_t>(total, total + kRunningWords) == want);
  Vec flipped = x;
  reinterpret_cast<unsigned char*>(flipped.data())[1234] ^= 0x10;
  CHECK(whole(flipped) != want);
  Vec swapped = x;
  std::swap(swapped[3], swapped[3 + 5 * kSumLanes]);
  CHECK(whole(swapped) != want);
}

}  // namespace strata::optest
