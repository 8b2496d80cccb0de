// Dropout: every comparison is exact. The mask is a pure function of (seed, step, global
// sample, element) (strata/rng.h), the same integer hash and the same float threshold on every
// backend; out = inp * mask and dinp = dout * mask are one IEEE product each.
// The CPU kernel's own tests at the end ([cpu_kernel], cpu_kernel.h: the mask's independence
// of the batch split, the kept fraction).
#include <fmt/format.h>

#include <algorithm>

#include "cpu_kernel.h"
#include "finite_diff.h"
#include "harness.h"
#include "table.h"

namespace strata::optest {
namespace {

constexpr uint64_t kSeed = 42, kStep = 7;
constexpr int64_t kFirstSample = 13;

struct DropoutShape {
  int B;
  int64_t per_sample;
};
// An empty batch; 5 samples of an odd size.
const DropoutShape kShapes[] = {{0, 1001}, {5, 1001}};
const float kRates[] = {0.f, 0.1f, 0.5f, 1.f};

// Rows [first, B) of a batch that starts at global sample kFirstSample, run as a batch of
// their own from global sample kFirstSample + first (a later rank's slice of the same batch).
void check_slice(const DropoutShape& s, float p, int first, const std::vector<float>& x,
                 const std::vector<float>& whole_mask) {
  const size_t off = size_t(first) * size_t(s.per_sample), n = x.size() - off;
  OpCase c(fmt::format("dropout_forward B{} per{} p{} rows {}.. as a batch", s.B, s.per_sample, p,
                       first));
  const F32 inp = c.in(std::vector<float>(x.begin() + int64_t(off), x.end()));
  const F32 out = c.out("out", n, Tol::exact()), mask = c.out("mask", n, Tol::exact());
  c.run([&](const Backend& be, const Ptrs& q) {
    be.dropout_forward(q[out], q[mask], q[inp], s.B - first, s.per_sample, p, kSeed, kStep,
                       kFirstSample + first);
  });
  INFO("dropout p " << p << ": a sample's mask row depends on its global index alone");
  CHECK(c.got(mask) == std::vector<float>(whole_mask.begin() + int64_t(off), whole_mask.end()));
}

}  // namespace

void check_dropout_forward() {
  for (const DropoutShape& s : kShapes)
    for (float p : kRates) {
      const size_t n = size_t(s.B) * size_t(s.per_sample);
      const auto x = random_vector(51, n);
      const std::string shape = fmt::format("B{} per{} p{}", s.B, s.per_sample, p);
      OpCase c("dropout_forward " + shape);
      const F32 inp = c.in(x), out = c.out("out", n, Tol::exact()),
                mask = c.out("mask", n, Tol::exact());
      c.run([&](const Backend& be, const Ptrs& q) {
        be.dropout_forward(q[out], q[mask], q[inp], s.B, s.per_sample, p, kSeed, kStep,
                           kFirstSample);
      });
      OpCase in_place("dropout_forward in place " + shape);  // out == inp, as a layer may run it
      const F32 io = in_place.inout("out", x, Tol::exact()),
                m2 = in_place.out("mask", n, Tol::exact());
      in_place.run([&](const Backend& be, const Ptrs& q) {
        be.dropout_forward(q[io], q[m2], q[io], s.B, s.per_sample, p, kSeed, kStep, kFirstSample);
      });
      if (p == 0.5f && s.B > 2) check_slice(s, p, 2, x, c.ref(mask));
    }
}

void check_dropout_backward() {
  for (const DropoutShape& s : kShapes)
    for (float p : kRates) {
      const int64_t n = int64_t(s.B) * s.per_sample;
      const auto x = random_vector(51, size_t(n));
      std::vector<float> y(static_cast<size_t>(n)), m(static_cast<size_t>(n));
      reference().dropout_forward(y.data(), m.data(), x.data(), s.B, s.per_sample, p, kSeed, kStep,
                                  kFirstSample);
      OpCase c(fmt::format("dropout_backward B{} per{} p{}", s.B, s.per_sample, p));
      const F32 dout = c.in(random_vector(52, size_t(n))), mask = c.in(m);
      const F32 dinp = c.out("dinp", size_t(n), Tol::exact());
      c.run([&](const Backend& be, const Ptrs& q) {
        be.dropout_backward(q[dinp], q[dout], q[mask], n);
      });
    }
}

// L = sum(dropout(x) * r) is linear in x for the fixed mask of (seed, step, samples).
void fd_dropout_backward() {
  const int B = 3;
  const int64_t per = 20, n = B * per;
  const float p = 0.4f;
  auto x = random_vector(53, size_t(n));
  const auto r = random_vector(54, size_t(n));
  const Backend& cpu = reference();
  std::vector<float> y(static_cast<size_t>(n)), mask(static_cast<size_t>(n)),
      dx = nan_vector(size_t(n));
  cpu.dropout_forward(y.data(), mask.data(), x.data(), B, per, p, kSeed, kStep, kFirstSample);
  cpu.dropout_backward(dx.data(), r.data(), mask.data(), n);
  auto loss = [&] {
    std::vector<float> out(static_cast<size_t>(n)), m(static_cast<size_t>(n));
    cpu.dropout_forward(out.data(), m.data(), x.data(), B, per, p, kSeed, kStep, kFirstSample);
    return dot(out, r);
  };
  Rng rng(55);
  check_grad("fd dropout_backward B3 per20 p0.4: dinp", x, dx, loss, rng);
}

// ---- The CPU kernels ([cpu_kernel]) --------------------------------------------------------

using namespace strata::cpu;

TEST_CASE("dropout mask is independent of the batch split", "[cpu_kernel][dropout]") {
  Rng rng(6);
  const int64_t per = 300;
  const float p = 0.4f;
  const Vec x = rand_vec(rng, 4 * per);
  Vec out_all(4 * per), mask_all(4 * per), out_split(4 * per), mask_split(4 * per);
  dropout_forward(out_all.data(), mask_all.data(), x.data(), 4, per, p, 7, 3, 0);
  dropout_forward(out_split.data(), mask_split.data(), x.data(), 2, per, p, 7, 3, 0);
  dropout_forward(out_split.data() + 2 * per, mask_split.data() + 2 * per, x.data() + 2 * per,
                  2, per, p, 7, 3, 2);
  CHECK(mask_all == mask_split);
  CHECK(out_all == out_split);

  const float keep_scale = 1.f / (1.f - p);
  for (int64_t i = 0; i < 4 * per; ++i) {
    INFO("element " << i << " mask " << mask_all[i]);
    CHECK((mask_all[i] == 0.f || mask_all[i] == keep_scale));
    CHECK(out_all[i] == x[i] * mask_all[i]);
  }
  // Different samples, steps and seeds get different masks.
  CHECK(!std::equal(mask_all.begin(), mask_all.begin() + per, mask_all.begin() + per));
  Vec out2(4 * per), mask2(4 * per);
  dropout_forward(out2.data(), mask2.data(), x.data(), 4, per, p, 7, 4, 0);
  CHECK(mask2 != mask_all);
  dropout_forward(out2.data(), mask2.data(), x.data(), 4, per, p, 8, 3, 0);
  CHECK(mask2 != mask_all);

  // Backward is dout * mask.
  const Vec dy = rand_vec(rng, 4 * per);
  Vec dx = nan_vec(4 * per);
  dropout_backward(dx.data(), dy.data(), mask_all.data(), 4 * per);
  for (int64_t i = 0; i < 4 * per; ++i) CHECK(dx[i] == dy[i] * mask_all[i]);
}

TEST_CASE("dropout keeps a fraction 1-p and p=0 is the identity", "[cpu_kernel][dropout]") {
  const int B = 8;
  const int64_t per = 12500;  // 1e5 draws: the kept fraction has std <= 0.0016
  Vec x(B * per, 1.f), out(B * per), mask(B * per);
  for (float p : {0.1f, 0.5f, 0.8f}) {
    dropout_forward(out.data(), mask.data(), x.data(), B, per, p, 42, 1, 5);
    const double kept = double(std::count_if(mask.begin(), mask.end(), [](float m) {
                          return m != 0.f;
                        })) / double(B * per);
    INFO("p=" << p << " kept " << kept);
    CHECK(std::abs(kept - (1.0 - p)) < 0.01);  // > 6 standard deviations
  }
  Rng rng(7);
  const Vec y = rand_vec(rng, B * per);
  dropout_forward(out.data(), mask.data(), y.data(), B, per, 0.f, 42, 1, 0);
  CHECK(out == y);
  CHECK(std::all_of(mask.begin(), mask.end(), [](float m) { return m == 1.f; }));
}

}  // namespace strata::optest
