// LayerNorm forward and backward, on GPT-like shapes with odd sizes (C not a multiple of 32, N
// over several 64-row chunks and a partial one).
//
// Tolerances: 1e-5 (out, mean, rstd, dinp, dweight): the row sums run over C <= 771 terms in
// another order (warp lanes against the CPU's vector lanes) and a GPU contracts some products
// into FMAs: a few ulp of the row's scale, ~1e-6 at most. dbias exact: the same fp32 additions
// in the same order (rows in 64-row chunks, then chunk by chunk), the contract of ops.def.
// The CPU kernel's own tests ([cpu_kernel], cpu_kernel.h: against a double reference, null and
// accumulated gradients, threads) and the finite-difference check share kCpuLnCases.
#include <fmt/format.h>

#include "cpu_kernel.h"
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

// The CPU kernel's shapes (N rows of C) and seeds: against the double reference and by finite
// differences.
struct LnCase {
  int N, C;
  uint64_t seed;
};
const LnCase kCpuLnCases[] = {
    {5, 7, 31},     // C below one vector
    {4, 16, 32},    // exactly one vector
    {3, 37, 33},    // two vectors and a tail
    {130, 20, 34},  // three row chunks, the last partial
    {1, 1, 35},     // one element: xhat = 0
};

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
  for (const LnCase& s : kCpuLnCases) fd_layernorm(s.N, s.C, s.seed);
}

// ---- The CPU kernel ([cpu_kernel]) ---------------------------------------------------------

using namespace strata::cpu;

namespace {

struct LnRef {
  DVec out, mean, rstd, dinp, dweight, dbias;
};

// Naive double LayerNorm (biased variance, eps inside the square root, as torch) and its
// analytic gradient: xhat = (x - mean) * rstd, g = w * dy,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), dw = sum dy * xhat, db = sum dy.
LnRef ref_layernorm(const Vec& x, const Vec& w, const Vec& b, const Vec& dy, int N, int C) {
  LnRef r;
  r.out.resize(size_t(N * C));
  r.dinp.resize(size_t(N * C));
  r.mean.resize(size_t(N));
  r.rstd.resize(size_t(N));
  r.dweight.assign(size_t(C), 0.0);
  r.dbias.assign(size_t(C), 0.0);
  for (int n = 0; n < N; ++n) {
    const float* xr = x.data() + n * C;
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += xr[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    r.mean[n] = m;
    r.rstd[n] = rs;
    double mg = 0, mgx = 0;
    for (int c = 0; c < C; ++c) {
      const double xh = (xr[c] - m) * rs, g = double(w[c]) * dy[n * C + c];
      r.out[n * C + c] = xh * w[c] + b[c];
      mg += g;
      mgx += g * xh;
      r.dweight[c] += dy[n * C + c] * xh;
      r.dbias[c] += dy[n * C + c];
    }
    mg /= C;
    mgx /= C;
    for (int c = 0; c < C; ++c) {
      const double xh = (xr[c] - m) * rs, g = double(w[c]) * dy[n * C + c];
      r.dinp[n * C + c] = rs * (g - mg - xh * mgx);
    }
  }
  return r;
}

// The kernels' forward, then backward from the forward's own mean and rstd (not accumulating).
struct LnRun {
  Vec out, mean, rstd, dinp, dweight, dbias;
};
LnRun run_layernorm(const Vec& x, const Vec& w, const Vec& b, const Vec& dy, int N, int C) {
  LnRun k{nan_vec(N * C), nan_vec(N), nan_vec(N), nan_vec(N * C), nan_vec(C), nan_vec(C)};
  layernorm_forward(k.out.data(), k.mean.data(), k.rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_backward(k.dinp.data(), k.dweight.data(), k.dbias.data(), dy.data(), x.data(),
                     w.data(), k.mean.data(), k.rstd.data(), N, C, false);
  return k;
}

void layernorm_case(int N, int C, uint64_t seed) {
  INFO("layernorm N=" << N << " C=" << C);
  Rng rng(seed);
  // Rows with their own offset and spread, as activations have.
  Vec x(size_t(N * C));
  for (int n = 0; n < N; ++n) {
    const float off = rng.uniform(-2.f, 2.f), sc = rng.uniform(0.5f, 2.f);
    for (int c = 0; c < C; ++c) x[n * C + c] = off + sc * rng.uniform(-1.f, 1.f);
  }
  Vec w = rand_vec(rng, C, 0.5f, 1.5f), b = rand_vec(rng, C);
  const Vec r = rand_vec(rng, N * C);
  const LnRef ref = ref_layernorm(x, w, b, r, N, C);

  const LnRun k = run_layernorm(x, w, b, r, N, C);
  const Vec &out = k.out, &mean = k.mean, &rstd = k.rstd, &dx = k.dinp, &dw = k.dweight,
            &db = k.dbias;
  // |x| <= 4 and rstd <= ~3.5 (316 for C = 1): mean and xhat carry a few ulp of 4, rstd a
  // few ulp relative. Measured: mean 3e-7, rstd 1.6e-7 relative, out 1.2e-6.
  check_close("layernorm mean", mean, ref.mean, 3e-6);
  check_rel("layernorm rstd", rstd, ref.rstd, 2e-6);
  check_close("layernorm out", out, ref.out, 1e-5);

  // dinp: two C-term row sums scaled by rstd <= ~3.5, measured 1.1e-6. dweight and dbias:
  // N-term sums (N <= 130) of terms <= ~4 with sums up to ~12, measured 2.6e-6.
  check_close("layernorm dinp", dx, ref.dinp, 1e-5);
  check_close("layernorm dweight", dw, ref.dweight, 3e-5);
  check_close("layernorm dbias", db, ref.dbias, 3e-5);

  // Null gradients: each alone is bitwise what it is with the others.
  Vec dx2 = nan_vec(N * C), dw2 = nan_vec(C), db2 = nan_vec(C);
  layernorm_backward(dx2.data(), nullptr, nullptr, r.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C, false);
  layernorm_backward(nullptr, dw2.data(), nullptr, r.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C, false);
  layernorm_backward(nullptr, nullptr, db2.data(), r.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C, false);
  CHECK(bitwise_equal(dx2, dx));
  CHECK(bitwise_equal(dw2, dw));
  CHECK(bitwise_equal(db2, db));

  // accumulate adds to the parameter gradients; dinp is still overwritten.
  Vec dx3 = nan_vec(N * C), dw3(size_t(C), 1.f), db3(size_t(C), 1.f);
  layernorm_backward(dx3.data(), dw3.data(), db3.data(), r.data(), x.data(), w.data(),
                     mean.data(), rstd.data(), N, C, true);
  CHECK(bitwise_equal(dx3, dx));
  for (int c = 0; c < C; ++c) {
    // 1 is added first instead of last: a few ulp of the sums' magnitude.
    CHECK(dw3[c] == Approx(dw[c] + 1.f).margin(1e-5));
    CHECK(db3[c] == Approx(db[c] + 1.f).margin(1e-5));
  }
}

}  // namespace

// (Finite differences on these shapes: "layernorm_backward vs finite differences".)
TEST_CASE("layernorm matches a double reference", "[cpu_kernel][layernorm]") {
  for (const LnCase& s : kCpuLnCases) layernorm_case(s.N, s.C, s.seed);
}

TEST_CASE("layernorm with a large mean keeps its precision", "[cpu_kernel][layernorm]") {
  // Values 1000 +- 1: E[x^2] - mean^2 would lose all of the variance (ulp(1e6) = 0.06 against
  // a variance of 0.33); the two-pass variance keeps it. What remains is the fp32 rounding of
  // the inputs' mean, ~ulp(1000) = 6e-5, against a spread of 0.58: ~1e-4 relative in out
  // (measured 8e-5).
  Rng rng(36);
  const int N = 4, C = 384;
  Vec x = rand_vec(rng, N * C);
  for (auto& v : x) v += 1000.f;
  const Vec w(size_t(C), 1.f), b(size_t(C), 0.f), dy = rand_vec(rng, N * C);
  const LnRef ref = ref_layernorm(x, w, b, dy, N, C);
  const LnRun k = run_layernorm(x, w, b, dy, N, C);
  for (int n = 0; n < N; ++n) CHECK(k.rstd[n] == Approx(ref.rstd[n]).epsilon(1e-4));
  check_close("layernorm out, mean 1000", k.out, ref.out, 1e-3);

  // Backward from the kernel's own mean and rstd, against the reference's gradients: xhat
  // carries the same ~1e-4 of the mean's rounding as out, into dweight (summed over N = 4 rows
  // of dout * xhat: measured 1.6e-4, bound out's 1e-3) and, mostly cancelled by the row means,
  // into dinp (measured 1.7e-5, bound 2e-4); dbias does not involve x (measured 2.4e-7, bound
  // layernorm_case's 3e-5). A backward that loses the mean's precision or a term is off by
  // 1e-2 to 1.
  check_close("layernorm dinp, mean 1000", k.dinp, ref.dinp, 2e-4);
  check_close("layernorm dweight, mean 1000", k.dweight, ref.dweight, 1e-3);
  check_close("layernorm dbias, mean 1000", k.dbias, ref.dbias, 3e-5);
}

TEST_CASE("layernorm is bitwise the same with 1 and 2 threads", "[cpu_kernel][layernorm]") {
  Rng rng(37);
  const int N = 300, C = 130;  // N * C = 39000: parallel; 5 chunks
  const Vec x = rand_vec(rng, N * C), w = rand_vec(rng, C), b = rand_vec(rng, C),
            r = rand_vec(rng, N * C);
  Vec res[2][6];
  for (int n : {1, 2}) {
    Threads threads(n);
    Vec* v = res[n - 1];
    v[0] = nan_vec(N * C), v[1] = nan_vec(N), v[2] = nan_vec(N);
    layernorm_forward(v[0].data(), v[1].data(), v[2].data(), x.data(), w.data(), b.data(), N, C);
    v[3] = nan_vec(N * C), v[4] = nan_vec(C), v[5] = nan_vec(C);
    layernorm_backward(v[3].data(), v[4].data(), v[5].data(), r.data(), x.data(), w.data(),
                       v[1].data(), v[2].data(), N, C, false);
  }
  for (int i = 0; i < 6; ++i) {
    INFO("output " << i << " (out, mean, rstd, dinp, dweight, dbias)");
    CHECK(bitwise_equal(res[0][i], res[1][i]));
  }
}

}  // namespace strata::optest
