// LayerNorm forward and backward, on GPT-like shapes with odd sizes (C not a multiple of 32, N
// over several 64-row chunks and a partial one).
//
// Tolerances: 1e-5 (out, mean, rstd, dinp, dweight): the row sums run over C <= 771 terms in
// another order (warp lanes against the CPU's vector lanes) and a GPU contracts some products
// into FMAs: a few ulp of the row's scale, ~1e-6 at most. dbias exact: the same fp32 additions
// in the same order (rows in 64-row chunks, then chunk by chunk), the contract of ops.def.
#include <fmt/format.h>

#include "finite_diff.h"
#include "harness.h"
#include "table.h"

namespace strata::optest {
namespace {

struct LnShape {
  int N, C;
};
const LnShape kShapes[] = {{300, 48}, {1, 771}, {64, 771}, {129, 5}, {0, 7}};
const Tol kTol = Tol::close(1e-5);

std::string ln_label(const char* op, const LnShape& s) {
  return fmt::format("{} N{} C{}", op, s.N, s.C);
}

// Rows uniform in [-2, 2], the first with a large mean (100).
struct LnData {
  std::vector<float> x, w, b, dy, dw_prior, db_prior, mean, rstd;
  explicit LnData(const LnShape& s)
      : x(random_vector(31, size_t(s.N) * s.C, -2.f, 2.f)),
        w(random_vector(32, size_t(s.C), 0.5f, 1.5f)),
        b(random_vector(33, size_t(s.C))),
        dy(random_vector(34, size_t(s.N) * s.C)),
        dw_prior(random_vector(35, size_t(s.C))),
        db_prior(random_vector(36, size_t(s.C))),
        mean(size_t(s.N)),
        rstd(size_t(s.N)) {
    for (int c = 0; c < s.C && s.N > 0; ++c) x[size_t(c)] += 100.f;
    std::vector<float> y(x.size());
    reference().layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                  s.N, s.C);
  }
};

}  // namespace

// With mean and rstd saved, and without (no backward follows).
void check_layernorm_forward() {
  for (const LnShape& s : kShapes)
    for (bool saved : {true, false}) {
      const LnData d(s);
      OpCase c(ln_label(saved ? "layernorm_forward" : "layernorm_forward no mean, rstd", s));
      const F32 x = c.in(d.x), w = c.in(d.w), b = c.in(d.b);
      const F32 out = c.out("out", d.x.size(), kTol);
      const F32 mean = saved ? c.out("mean", size_t(s.N), kTol) : F32{};
      const F32 rstd = saved ? c.out("rstd", size_t(s.N), kTol) : F32{};
      c.run([&](const Backend& be, const Ptrs& p) {
        be.layernorm_forward(p[out], p[mean], p[rstd], p[x], p[w], p[b], s.N, s.C);
      });
    }
}

// From the reference's mean and rstd. Into earlier parameter gradients (ignored, or added to
// when accumulating); then dbias alone, and dinp alone.
void check_layernorm_backward() {
  const char* modes[] = {"layernorm_backward", "layernorm_backward accumulate",
                         "layernorm_backward dbias only", "layernorm_backward dinp only"};
  for (const LnShape& s : kShapes)
    for (int mode : {0, 1, 2, 3}) {
      const LnData d(s);
      OpCase c(ln_label(modes[mode], s));
      const F32 dy = c.in(d.dy), x = c.in(d.x), w = c.in(d.w), mean = c.in(d.mean),
                rstd = c.in(d.rstd);
      const F32 dx = mode != 2 ? c.out("dinp", d.x.size(), kTol) : F32{};
      const F32 dw = mode < 2 ? c.inout("dweight", d.dw_prior, kTol) : F32{};
      const F32 db = mode < 3 ? c.inout("dbias", d.db_prior, Tol::exact()) : F32{};
      c.run([&](const Backend& be, const Ptrs& p) {
        be.layernorm_backward(p[dx], p[dw], p[db], p[dy], p[x], p[w], p[mean], p[rstd], s.N, s.C,
                              mode == 1);
      });
    }
}

// ---- Finite differences of the reference ---------------------------------------------------

namespace {

// Rows with their own offset and spread, as activations have.
void fd_layernorm(int N, int C, uint64_t seed) {
  const Backend& cpu = reference();
  Rng rng(seed);
  std::vector<float> x(size_t(N) * C);
  for (int n = 0; n < N; ++n) {
    const float off = rng.uniform(-2.f, 2.f), sc = rng.uniform(0.5f, 2.f);
    for (int c = 0; c < C; ++c) x[size_t(n) * C + c] = off + sc * rng.uniform(-1.f, 1.f);
  }
  auto w = random_vector(rng.next(), size_t(C), 0.5f, 1.5f),
       b = random_vector(rng.next(), size_t(C));
  const auto r = random_vector(rng.next(), x.size());
  std::vector<float> y(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  auto dx = nan_vector(x.size()), dw = nan_vector(size_t(C)), db = nan_vector(size_t(C));
  cpu.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  cpu.layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                         rstd.data(), N, C, false);
  auto loss = [&] {
    std::vector<float> out(x.size());
    cpu.layernorm_forward(out.data(), nullptr, nullptr, x.data(), w.data(), b.data(), N, C);
    return dot(out, r);
  };
  const std::string tag = fmt::format("fd layernorm_backward N{} C{}: ", N, C);
  check_grad(tag + "dinp", x, dx, loss, rng);
  check_grad(tag + "dweight", w, dw, loss, rng);
  check_grad(tag + "dbias", b, db, loss, rng);
}

}  // namespace

void fd_layernorm_backward() {
  fd_layernorm(5, 7, 31);     // C below one vector
  fd_layernorm(4, 16, 32);    // exactly one vector
  fd_layernorm(3, 37, 33);    // two vectors and a tail
  fd_layernorm(130, 20, 34);  // three row chunks, the last partial
  fd_layernorm(1, 1, 35);     // one element: xhat = 0
}

}  // namespace strata::optest
