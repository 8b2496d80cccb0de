// GPT-2 kernels (embedding, layernorm, residual add, causal self-attention): forwards against
// naive double-precision references, backwards against the analytic gradients computed in
// double by naive loops (and against central finite differences in the op table, tests/ops);
// bitwise the same results with 1 and 2 OpenMP threads; accumulate and null-gradient
// semantics. The hidden [.bench] case times them on one thread.
//
// Tolerances, and why (each is stated again where it is used):
// - Comparisons with the double references are absolute, on values of magnitude ~1 (inputs
//   uniform in [-1,1]). fp32 rounding of a sum of K such terms is ~sqrt(K) * 6e-8 typically,
//   K * 6e-8 at worst (K is at most a few hundred here). Each tolerance is about 10x the
//   largest error measured on this machine (given beside it), while a wrong index, a missed
//   mask, a wrong scale or a transposed head is an error of 1e-2 to 1.
#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "strata/error.h"
#include "strata/kernels_cpu.h"
#include "strata/rng.h"
#include "skip.h"

using namespace strata;
using namespace strata::cpu;

namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Vec rand_vec(Rng& rng, int64_t n, float lo = -1.f, float hi = 1.f) {
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

// NaN-filled buffer: an output a kernel fails to overwrite shows up in the comparisons.
Vec nan_vec(int64_t n) { return Vec(size_t(n), kNaN); }

// Sets the OpenMP thread count for a scope and restores it after.
struct Threads {
  int saved = omp_get_max_threads();
  explicit Threads(int n) { blas_init(n); }
  ~Threads() { blas_init(saved); }
};

// max |got - want| over a tensor must be <= tol; reports the worst element.
void check_close(const std::string& what, const Vec& got, const DVec& want, double tol) {
  REQUIRE(got.size() == want.size());
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(double(got[i]) - want[i]);
    if (!(e <= worst)) {  // NaN counts as worst
      worst = e;
      at = i;
      if (e != e) break;
    }
  }
  INFO(what << ": max error " << worst << " at [" << at << "]: got " << got[at] << ", want "
            << want[at] << " (tolerance " << tol << ")");
  CHECK(worst <= tol);
}

// max |got / want - 1| over a tensor must be <= tol (want nonzero).
void check_rel(const std::string& what, const Vec& got, const DVec& want, double tol) {
  REQUIRE(got.size() == want.size());
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(double(got[i]) / want[i] - 1.0);
    if (!(e <= worst)) {
      worst = e;
      at = i;
      if (e != e) break;
    }
  }
  INFO(what << ": max relative error " << worst << " at [" << at << "]: got " << got[at]
            << ", want " << want[at] << " (tolerance " << tol << ")");
  CHECK(worst <= tol);
}

bool bitwise_equal(const Vec& a, const Vec& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// ---- Embedding -----------------------------------------------------------------------------

namespace {

// The documented summation order: rows in order, in fp32, from `init` (0, or the old gradient
// when accumulating). The kernel must match it bitwise.
void ref_embedding_backward(Vec& dwte, Vec& dwpe, const Vec& dout,
                            const std::vector<int32_t>& tok, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int64_t i = int64_t(b) * T + t;
      for (int c = 0; c < C; ++c) {
        dwte[tok[i] * C + c] += dout[i * C + c];
        dwpe[t * C + c] += dout[i * C + c];
      }
    }
}

}  // namespace

// (Finite differences: tests/ops, "embedding_backward vs finite differences".)
TEST_CASE("embedding forward and backward", "[gpt][embedding]") {
  Rng rng(21);
  const int B = 3, T = 5, C = 19, V = 7, maxT = 8;
  std::vector<int32_t> tok(B * T);
  for (auto& t : tok) t = int32_t(rng.below(5));  // tokens 5 and 6 never occur
  tok[0] = tok[7] = tok[14] = 2;                   // one token on several rows
  Vec wte = rand_vec(rng, V * C), wpe = rand_vec(rng, maxT * C);
  const Vec r = rand_vec(rng, B * T * C);

  Vec out = nan_vec(B * T * C);
  embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, V);
  for (int i = 0; i < B * T; ++i)
    for (int c = 0; c < C; ++c) {
      INFO("row " << i << " column " << c);
      // One fp32 addition: exact equality.
      CHECK(out[i * C + c] == wte[tok[i] * C + c] + wpe[(i % T) * C + c]);
    }

  // Backward: dwte rows of absent tokens become 0; dwpe rows from T on are not touched.
  Vec dwte = nan_vec(V * C), dwpe = nan_vec(maxT * C);
  std::fill(dwpe.begin() + T * C, dwpe.end(), 7.f);
  embedding_backward(dwte.data(), dwpe.data(), r.data(), tok.data(), B, T, C, V, false);
  Vec want_te(size_t(V * C), 0.f), want_pe(size_t(maxT * C), 0.f);
  std::fill(want_pe.begin() + T * C, want_pe.end(), 7.f);
  ref_embedding_backward(want_te, want_pe, r, tok, B, T, C);
  CHECK(bitwise_equal(dwte, want_te));
  CHECK(bitwise_equal(dwpe, want_pe));
  // And against double sums: at most 3 terms per dwte row here, 3 per dwpe row.
  DVec dte(size_t(V * C), 0.0), dpe(size_t(maxT * C), 0.0);
  for (int i = 0; i < B * T; ++i)
    for (int c = 0; c < C; ++c) {
      dte[tok[i] * C + c] += r[i * C + c];
      dpe[(i % T) * C + c] += r[i * C + c];
    }
  std::fill(dpe.begin() + T * C, dpe.end(), 7.0);
  check_close("dwte", dwte, dte, 1e-6);  // few-term sums of [-1,1]: a few ulp
  check_close("dwpe", dwpe, dpe, 1e-6);

  // Null gradients: the other one is the same.
  Vec te2 = nan_vec(V * C), pe2 = dwpe;
  embedding_backward(te2.data(), nullptr, r.data(), tok.data(), B, T, C, V, false);
  CHECK(bitwise_equal(te2, dwte));
  embedding_backward(nullptr, pe2.data(), r.data(), tok.data(), B, T, C, V, false);
  CHECK(bitwise_equal(pe2, dwpe));

  // accumulate: added to what is there, in row order after it.
  Vec te3(size_t(V * C), 1.f), pe3(size_t(maxT * C), 1.f);
  Vec want_te3 = te3, want_pe3 = pe3;
  embedding_backward(te3.data(), pe3.data(), r.data(), tok.data(), B, T, C, V, true);
  ref_embedding_backward(want_te3, want_pe3, r, tok, B, T, C);
  CHECK(bitwise_equal(te3, want_te3));
  CHECK(bitwise_equal(pe3, want_pe3));

  // Tokens outside the vocabulary are input errors, not out-of-bounds reads.
  for (int32_t bad : {V, -1}) {
    std::vector<int32_t> t2 = tok;
    t2[9] = bad;
    CHECK_THROWS_AS(embedding_forward(out.data(), t2.data(), wte.data(), wpe.data(), B, T, C, V),
                    UserError);
    CHECK_THROWS_AS(embedding_backward(dwte.data(), nullptr, r.data(), t2.data(), B, T, C, V,
                                       false), UserError);
  }
}

TEST_CASE("embedding is bitwise the same with 1 and 2 threads", "[gpt][embedding]") {
  Rng rng(22);
  // N * C = 51200: above the kernels' threshold for going parallel. C = 200 is 12.5 cache
  // lines: the column split has a partial line.
  const int B = 4, T = 64, C = 200, V = 50;
  std::vector<int32_t> tok(B * T);
  for (auto& t : tok) t = int32_t(rng.below(V));
  const Vec wte = rand_vec(rng, V * C), wpe = rand_vec(rng, T * C), r = rand_vec(rng, B * T * C);
  Vec out[2], dte[2], dpe[2];
  for (int n : {1, 2}) {
    Threads threads(n);
    Vec& o = out[n - 1] = nan_vec(B * T * C);
    embedding_forward(o.data(), tok.data(), wte.data(), wpe.data(), B, T, C, V);
    dte[n - 1] = nan_vec(V * C);
    dpe[n - 1] = nan_vec(T * C);
    embedding_backward(dte[n - 1].data(), dpe[n - 1].data(), r.data(), tok.data(), B, T, C, V,
                       false);
  }
  CHECK(bitwise_equal(out[0], out[1]));
  CHECK(bitwise_equal(dte[0], dte[1]));
  CHECK(bitwise_equal(dpe[0], dpe[1]));
  Vec want_te(size_t(V * C), 0.f), want_pe(size_t(T * C), 0.f);
  ref_embedding_backward(want_te, want_pe, r, tok, B, T, C);
  CHECK(bitwise_equal(dte[1], want_te));
  CHECK(bitwise_equal(dpe[1], want_pe));
}

// ---- LayerNorm -----------------------------------------------------------------------------

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

  Vec out = nan_vec(N * C), mean = nan_vec(N), rstd = nan_vec(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  // |x| <= 4 and rstd <= ~3.5 (316 for C = 1): mean and xhat carry a few ulp of 4, rstd a
  // few ulp relative. Measured: mean 3e-7, rstd 1.6e-7 relative, out 1.2e-6.
  check_close("layernorm mean", mean, ref.mean, 3e-6);
  check_rel("layernorm rstd", rstd, ref.rstd, 2e-6);
  check_close("layernorm out", out, ref.out, 1e-5);

  Vec dx = nan_vec(N * C), dw = nan_vec(C), db = nan_vec(C);
  layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C, false);
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

// (Finite differences on these shapes: tests/ops, "layernorm_backward vs finite differences".)
TEST_CASE("layernorm matches a double reference", "[gpt][layernorm]") {
  layernorm_case(5, 7, 31);    // C below one vector
  layernorm_case(4, 16, 32);   // exactly one vector
  layernorm_case(3, 37, 33);   // two vectors and a tail
  layernorm_case(130, 20, 34); // three row chunks, the last partial
  layernorm_case(1, 1, 35);    // one element: xhat = 0
}

TEST_CASE("layernorm with a large mean keeps its precision", "[gpt][layernorm]") {
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
  Vec out = nan_vec(N * C), mean = nan_vec(N), rstd = nan_vec(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (int n = 0; n < N; ++n) CHECK(rstd[n] == Approx(ref.rstd[n]).epsilon(1e-4));
  check_close("layernorm out, mean 1000", out, ref.out, 1e-3);

  // Backward from the kernel's own mean and rstd, against the reference's gradients: xhat
  // carries the same ~1e-4 of the mean's rounding as out, into dweight (summed over N = 4 rows
  // of dout * xhat: measured 1.6e-4, bound out's 1e-3) and, mostly cancelled by the row means,
  // into dinp (measured 1.7e-5, bound 2e-4); dbias does not involve x (measured 2.4e-7, bound
  // layernorm_case's 3e-5). A backward that loses the mean's precision or a term is off by
  // 1e-2 to 1.
  Vec dx = nan_vec(N * C), dw = nan_vec(C), db = nan_vec(C);
  layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C, false);
  check_close("layernorm dinp, mean 1000", dx, ref.dinp, 2e-4);
  check_close("layernorm dweight, mean 1000", dw, ref.dweight, 1e-3);
  check_close("layernorm dbias, mean 1000", db, ref.dbias, 3e-5);
}

TEST_CASE("layernorm is bitwise the same with 1 and 2 threads", "[gpt][layernorm]") {
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

// ---- Residual ------------------------------------------------------------------------------

TEST_CASE("residual_forward adds, also in place", "[gpt][residual]") {
  Rng rng(41);
  for (int64_t n : {int64_t(1), int64_t(37), int64_t(1) << 16}) {
    const Vec a = rand_vec(rng, n), b = rand_vec(rng, n);
    Vec out = nan_vec(n);
    residual_forward(out.data(), a.data(), b.data(), n);
    bool exact = true;
    for (int64_t i = 0; i < n; ++i) exact = exact && out[i] == a[i] + b[i];
    CHECK(exact);
    Vec x = a;  // out aliases a
    residual_forward(x.data(), x.data(), b.data(), n);
    CHECK(bitwise_equal(x, out));
  }
}

// ---- Causal self-attention -----------------------------------------------------------------

namespace {

struct AttnRef {
  DVec out, att, dqkv;
};

// softmax(q k^T / sqrt(hs) + causal mask) v per (b, h) by naive loops in double, and its
// gradient: dP = dO v^T, dv = P^T dO, dS = P * (dP - rowsum(P * dP)), dq = dS k / sqrt(hs),
// dk = dS^T q / sqrt(hs). Head h of q, k, v is columns h*hs.. of the thirds of qkv (B,T,3C).
AttnRef ref_attention(const Vec& qkv, const Vec& dout, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(double(hs));
  AttnRef r;
  r.out.assign(size_t(B) * T * C, 0.0);
  r.att.assign(size_t(B) * NH * T * T, 0.0);
  r.dqkv.assign(size_t(B) * T * 3 * C, 0.0);
  auto at = [&](int b, int t, int part, int h, int d) {
    return (int64_t(b) * T + t) * 3 * C + int64_t(part) * C + int64_t(h) * hs + d;
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      double* P = r.att.data() + (int64_t(b) * NH + h) * T * T;
      std::vector<double> dP(size_t(T) * T, 0.0);
      for (int t1 = 0; t1 < T; ++t1) {
        double mx = -1e300;
        for (int t2 = 0; t2 <= t1; ++t2) {
          double s = 0;
          for (int d = 0; d < hs; ++d)
            s += double(qkv[at(b, t1, 0, h, d)]) * qkv[at(b, t2, 1, h, d)];
          P[t1 * T + t2] = s * scale;
          mx = std::max(mx, s * scale);
        }
        double z = 0;
        for (int t2 = 0; t2 <= t1; ++t2) z += std::exp(P[t1 * T + t2] - mx);
        for (int t2 = 0; t2 <= t1; ++t2) P[t1 * T + t2] = std::exp(P[t1 * T + t2] - mx) / z;
        for (int d = 0; d < hs; ++d) {
          double o = 0;
          for (int t2 = 0; t2 <= t1; ++t2) o += P[t1 * T + t2] * qkv[at(b, t2, 2, h, d)];
          r.out[(int64_t(b) * T + t1) * C + h * hs + d] = o;
        }
      }
      auto dO = [&](int t, int d) { return double(dout[(int64_t(b) * T + t) * C + h * hs + d]); };
      for (int t1 = 0; t1 < T; ++t1) {
        double rowdot = 0;
        for (int t2 = 0; t2 <= t1; ++t2) {
          double s = 0;
          for (int d = 0; d < hs; ++d) s += dO(t1, d) * qkv[at(b, t2, 2, h, d)];
          dP[t1 * T + t2] = s;
          rowdot += P[t1 * T + t2] * s;
          for (int d = 0; d < hs; ++d) r.dqkv[at(b, t2, 2, h, d)] += P[t1 * T + t2] * dO(t1, d);
        }
        for (int t2 = 0; t2 <= t1; ++t2) {
          const double dS = P[t1 * T + t2] * (dP[t1 * T + t2] - rowdot) * scale;
          for (int d = 0; d < hs; ++d) {
            r.dqkv[at(b, t1, 0, h, d)] += dS * qkv[at(b, t2, 1, h, d)];
            r.dqkv[at(b, t2, 1, h, d)] += dS * qkv[at(b, t1, 0, h, d)];
          }
        }
      }
    }
  return r;
}

// Tolerances: att and out 1e-6 (measured <= 1.2e-7), dqkv 5e-6 (measured <= 5.4e-7): see
// the top of the file.
void attention_case(int B, int T, int C, int NH, uint64_t seed, float qk_scale = 1.f,
                    double tol_fwd = 1e-6, double tol_bwd = 5e-6) {
  INFO("attention B=" << B << " T=" << T << " C=" << C << " NH=" << NH << " q,k scale "
                      << qk_scale);
  Rng rng(seed);
  Vec qkv = rand_vec(rng, int64_t(B) * T * 3 * C);
  for (int64_t i = 0; i < int64_t(B) * T; ++i)
    for (int c = 0; c < 2 * C; ++c) qkv[i * 3 * C + c] *= qk_scale;
  const Vec r = rand_vec(rng, int64_t(B) * T * C);
  const AttnRef ref = ref_attention(qkv, r, B, T, C, NH);

  Vec out = nan_vec(int64_t(B) * T * C), att = nan_vec(int64_t(B) * NH * T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  // att entries are in [0,1] with relative error ~ the scores' absolute fp32 error (~1e-7 of
  // |q||k| <= hs / sqrt(hs)); out sums up to T of them times |v| <= 1.
  check_close("att", att, ref.att, tol_fwd);
  check_close("out", out, ref.out, tol_fwd);
  bool upper_zero = true, rows_sum_to_1 = true;
  for (int64_t bh = 0; bh < int64_t(B) * NH; ++bh)
    for (int t1 = 0; t1 < T; ++t1) {
      double s = 0;
      for (int t2 = 0; t2 < T; ++t2) {
        const float p = att[(bh * T + t1) * T + t2];
        if (t2 > t1) upper_zero = upper_zero && p == 0.f;
        s += p;
      }
      rows_sum_to_1 = rows_sum_to_1 && std::abs(s - 1.0) <= 1e-5;  // T terms of <= 1 ulp
    }
  CHECK(upper_zero);  // written as exact zeros, not left as they were
  CHECK(rows_sum_to_1);

  Vec dqkv = nan_vec(int64_t(B) * T * 3 * C);
  attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  // Two and three chained sums of up to T (and hs) terms of magnitude <= 1 (see the top).
  check_close("dqkv", dqkv, ref.dqkv, tol_bwd);
}

}  // namespace

TEST_CASE("attention matches naive softmax(QK^T/sqrt(hs) + mask)V and its gradient",
          "[gpt][attention]") {
  // The first four also by finite differences: tests/ops, "attention_backward vs finite
  // differences".
  attention_case(1, 1, 8, 2, 51);     // one position: att = 1, out = v
  attention_case(2, 5, 12, 3, 52);    // hs = 4, rows shorter than a vector
  attention_case(2, 17, 32, 2, 53);   // hs = 16, rows cross a vector boundary
  attention_case(1, 67, 40, 2, 54);   // hs = 20, two row blocks (64 + 3)
  attention_case(2, 130, 64, 4, 55);  // three row blocks, the last partial
  attention_case(1, 256, 128, 2, 56); // GPT's T, hs = 64, four full blocks
}

TEST_CASE("attention is stable for large scores", "[gpt][attention]") {
  // q and k scaled by 30: scores up to ~900 / 4 = 225 in magnitude, so exp without the max
  // subtracted overflows. The scores' fp32 error (~1e-7 of |q||k|, ~4e-5 here) is an absolute
  // error in the exponent, i.e. a relative error of att: measured 8e-6 (att), 1.2e-5 (out);
  // the gradients are ~30x larger (dq carries k, dk carries q): measured 1.7e-4.
  attention_case(2, 33, 32, 2, 57, 30.f, 1e-4, 2e-3);
}

namespace {

using AttnKernels = std::pair<decltype(&attention_forward), decltype(&attention_backward)>;

void attention_threads_case(const AttnKernels& kernels) {
  const auto& [forward, backward] = kernels;
  Rng rng(58);
  const int B = 2, T = 100, C = 64, NH = 4;
  const Vec qkv = rand_vec(rng, B * T * 3 * C), r = rand_vec(rng, B * T * C);
  Vec out[2], att[2], dqkv[2];
  for (int n : {1, 2}) {
    Threads threads(n);
    out[n - 1] = nan_vec(B * T * C);
    att[n - 1] = nan_vec(B * NH * T * T);
    dqkv[n - 1] = nan_vec(B * T * 3 * C);
    forward(out[n - 1].data(), att[n - 1].data(), qkv.data(), B, T, C, NH);
    backward(dqkv[n - 1].data(), r.data(), qkv.data(), att[n - 1].data(), B, T, C, NH);
  }
  CHECK(bitwise_equal(out[0], out[1]));
  CHECK(bitwise_equal(att[0], att[1]));
  CHECK(bitwise_equal(dqkv[0], dqkv[1]));
}

}  // namespace

TEST_CASE("attention is bitwise the same with 1 and 2 threads", "[gpt][attention]") {
  attention_threads_case({attention_forward, attention_backward});
}

// Its products are oneDNN matmul primitives, run on the calling thread inside the per-head loop
// as the sgemms are.
TEST_CASE("attention in bf16 is bitwise the same with 1 and 2 threads", "[gpt][attention]") {
  if (std::string why; !bf16_supported(&why)) STRATA_SKIP("bf16 not checked on this CPU: " << why);
  attention_threads_case({bf16::attention_forward, bf16::attention_backward});
}

// ---- GELU: the vectorised kernels against the scalar std::erf form -------------------------
// (test_kernels.cpp checks gelu against a double reference on [-4, 4] and by FD; these cover
// the whole range, the tails and every tail length of the lane loop.)

namespace {

// Inputs: a grid over [-12, 12] (where Phi goes from 1.8e-33 to 1 - 1.8e-33) in steps of 1e-3,
// random values in [-6, 6], and a few of large magnitude; n is odd, so the last, partial vector
// of the lane loop is covered too.
Vec gelu_inputs(Rng& rng) {
  Vec x;
  for (int i = -12000; i <= 12000; ++i) x.push_back(float(i) * 1e-3f);
  for (int i = 0; i < 5001; ++i) x.push_back(rng.uniform(-6.f, 6.f));
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 20.f, -20.f, 1e4f, -1e4f, 3e38f, -3e38f})
    x.push_back(v);
  return x;
}

// Phi(x) and phi(x) in double (std::erfc keeps the tail's relative precision).
double cdf_d(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double pdf_d(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }

}  // namespace

// Tolerances. The reference itself is x * (1 + erff(z)) / 2 in fp32: 1 + erf rounds to 6e-8
// absolute, erff is within ~1 ulp, so its Phi is off the true one by up to ~1.2e-7 absolute;
// the vectorised Phi is within ~1.5e-7 (erfc's fit 1.2e-7 relative, the exp 2 ulp, the
// rounding of 1 - erfc/2). gelu = x * Phi then differs by up to ~3e-7 |x|, plus the rounding
// of the product. Measured here: 1.2e-7 max(1, |x|) at most (forward), 2.2e-7 (backward); the bound
// is 4e-7 max(1, |x|), while an erf that is wrong in its fit, sign or tail is off by 1e-3 to 1.
TEST_CASE("gelu: vectorised kernels match the scalar std::erf form over the whole range",
          "[gpt][activation]") {
  Rng rng(71);
  const Vec x = gelu_inputs(rng);
  const int64_t n = int64_t(x.size());
  REQUIRE(n % 16 != 0);
  const Vec dy = rand_vec(rng, n, -2.f, 2.f);
  Vec out = nan_vec(n), ref = nan_vec(n), dx = nan_vec(n), dref = nan_vec(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_forward_reference(ref.data(), x.data(), n);
  gelu_backward(dx.data(), dy.data(), x.data(), n);
  gelu_backward_reference(dref.data(), dy.data(), x.data(), n);
  double worst_f = 0, worst_b = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[size_t(i)], scale = std::max(1.0, std::abs(xi));
    const double ef = std::abs(double(out[size_t(i)]) - ref[size_t(i)]) / scale;
    const double eb = std::abs(double(dx[size_t(i)]) - dref[size_t(i)]) /
                      (scale * std::max(1.0, std::abs(double(dy[size_t(i)]))));
    worst_f = std::max(worst_f, ef);
    worst_b = std::max(worst_b, eb);
    INFO("x = " << xi << ": gelu " << out[size_t(i)] << " vs " << ref[size_t(i)] << ", dinp "
                << dx[size_t(i)] << " vs " << dref[size_t(i)]);
    CHECK(ef <= 4e-7);
    CHECK(eb <= 4e-7);
  }
  std::printf("gelu vs std::erf form: forward %.2e, backward %.2e (/ max(1,|x|))\n", worst_f,
              worst_b);
}

// Where x < 0, Phi = erfc(|z|)/2 is computed without cancellation: the result keeps its relative
// precision down to Phi ~ 1e-30 (x = -11.3), where the reference form (1 + erf) / 2 has none
// left (it is exactly 0 from x ~ -5.9). Bound: erfc's fit (1.2e-7) plus the exp's 2 ulp, the
// rounding of x*x (6e-8 of x^2/2 <= 64: up to 4e-6 relative at x = -11.3, the largest term)
// and of the product: 1e-5 relative; measured 3.9e-6 (forward), 1.9e-6 (backward).
TEST_CASE("gelu keeps its relative precision in the negative tail", "[gpt][activation]") {
  Vec x;
  for (float v = -0.5f; v >= -11.3f; v -= 0.01f) x.push_back(v);
  const int64_t n = int64_t(x.size());
  const Vec ones(size_t(n), 1.f);
  Vec out = nan_vec(n), dx = nan_vec(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_backward(dx.data(), ones.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[size_t(i)];
    const double want = xi * cdf_d(xi), dwant = cdf_d(xi) + xi * pdf_d(xi);
    INFO("x = " << xi << ": gelu " << out[size_t(i)] << " want " << want);
    CHECK(std::abs(out[size_t(i)] - want) <= 1e-5 * std::abs(want));
    // gelu' = Phi + x phi cancels (Phi ~ -x phi (1 - 1/x^2)): relative 1e-5 of the terms.
    CHECK(std::abs(dx[size_t(i)] - dwant) <= 1e-5 * (cdf_d(xi) + std::abs(xi) * pdf_d(xi)));
  }
}

TEST_CASE("gelu: special values and every tail length", "[gpt][activation]") {
  const float inf = std::numeric_limits<float>::infinity();
  const Vec x = {kNaN, inf, -inf, 0.f, -0.f, 1.f, -1.f};
  const int64_t n = int64_t(x.size());
  const Vec ones(size_t(n), 1.f);
  Vec out = nan_vec(n), dx = nan_vec(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_backward(dx.data(), ones.data(), x.data(), n);
  CHECK(std::isnan(out[0]));
  CHECK(std::isnan(dx[0]));
  CHECK(out[1] == inf);     // inf * Phi(inf) = inf * 1
  CHECK(std::isnan(out[2]));  // -inf * 0, as x * (1 + erf(-inf)) / 2
  CHECK(out[3] == 0.f);
  CHECK(dx[3] == 0.5f);     // Phi(0)
  CHECK(std::abs(out[5] - 0.8413447461f) <= 1e-7f);
  CHECK(std::abs(out[6] + 0.1586552539f) <= 1e-7f);
  // Lengths 1..40 at every offset 0..3: each element as when computed in one long array
  // (the kernels are elementwise: neither a vector's other lanes nor the tail path may matter).
  Rng rng(72);
  const Vec big = rand_vec(rng, 64, -5.f, 5.f), dbig = rand_vec(rng, 64);
  Vec all(64), dall(64);
  gelu_forward(all.data(), big.data(), 64);
  gelu_backward(dall.data(), dbig.data(), big.data(), 64);
  for (int off = 0; off < 4; ++off)
    for (int len = 1; len <= 40; ++len) {
      Vec o = nan_vec(len + 1), d = nan_vec(len + 1);
      gelu_forward(o.data(), big.data() + off, len);
      gelu_backward(d.data(), dbig.data() + off, big.data() + off, len);
      INFO("offset " << off << ", length " << len);
      CHECK(bitwise_equal(Vec(o.begin(), o.begin() + len),
                          Vec(all.begin() + off, all.begin() + off + len)));
      CHECK(bitwise_equal(Vec(d.begin(), d.begin() + len),
                          Vec(dall.begin() + off, dall.begin() + off + len)));
      CHECK(std::isnan(o[size_t(len)]));  // nothing written past the end
      CHECK(std::isnan(d[size_t(len)]));
    }
}

TEST_CASE("gelu is bitwise the same with 1 and 2 threads", "[gpt][activation]") {
  Rng rng(73);
  const int64_t n = (int64_t(1) << 17) + 5;  // above the kernels' parallel threshold
  const Vec x = rand_vec(rng, n, -6.f, 6.f), dy = rand_vec(rng, n);
  Vec out[2], dx[2];
  for (int t : {1, 2}) {
    Threads threads(t);
    out[t - 1] = nan_vec(n);
    dx[t - 1] = nan_vec(n);
    gelu_forward(out[t - 1].data(), x.data(), n);
    gelu_backward(dx[t - 1].data(), dy.data(), x.data(), n);
  }
  CHECK(bitwise_equal(out[0], out[1]));
  CHECK(bitwise_equal(dx[0], dx[1]));
}

// ---- Linear weight gradient through the matmul primitive ------------------------------------
// linear_backward sends the weight gradient of weights of at least 2^19 elements (the GPT's c_fc
// and mlp c_proj) through a oneDNN matmul primitive, with a sum post-op when accumulating; the
// linear tests in test_kernels.cpp use small weights (sgemm). Here both GPT shapes, against a
// double reference: each element is a dot product of B = 5 terms of magnitude <= 1, so fp32
// rounding is below 5 * 6e-8 * 5; tolerance 1e-5 (plus 1e-6 of the value accumulated onto).
TEST_CASE("linear weight gradient of a large weight (matmul primitive), also accumulating",
          "[gpt][linear]") {
  Rng rng(74);
  for (auto [I, O] : {std::pair{384, 1536}, std::pair{1536, 384}}) {
    const int B = 5;
    const Vec x = rand_vec(rng, int64_t(B) * I), w = rand_vec(rng, int64_t(O) * I),
              dy = rand_vec(rng, int64_t(B) * O), prior = rand_vec(rng, int64_t(O) * I);
    DVec want(size_t(O) * I);
    for (int o = 0; o < O; ++o)
      for (int i = 0; i < I; ++i) {
        double acc = 0;
        for (int b = 0; b < B; ++b) acc += double(dy[size_t(b) * O + o]) * x[size_t(b) * I + i];
        want[size_t(o) * I + i] = acc;
      }
    for (bool accumulate : {false, true}) {
      INFO("I " << I << ", O " << O << ", accumulate " << accumulate);
      Vec dw = accumulate ? prior : nan_vec(int64_t(O) * I);
      linear_backward(nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(), B, I, O,
                      accumulate);
      double worst = 0;
      for (size_t j = 0; j < want.size(); ++j) {
        const double expect = accumulate ? prior[j] + want[j] : want[j];
        worst = std::max(worst, std::abs(dw[j] - expect) - 1e-6 * std::abs(expect));
      }
      CHECK(worst <= 1e-5);
    }
  }
}

// ---- Timings (hidden: strata_unit_tests "[.bench]") ----------------------------------------

namespace {

// Median over `reps` runs of f, after one warm-up run, in ms: of the wall time, and of this
// thread's CPU time (all the work runs on the calling thread at one thread; on a shared,
// loaded machine the CPU time is the steadier figure).
struct Timing {
  double wall, cpu;
};

double thread_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

template <class F>
Timing median_ms(int reps, F f) {
  f();
  std::vector<double> wall, cpu;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_ms();
    f();
    cpu.push_back(thread_cpu_ms() - c0);
    const auto t1 = std::chrono::steady_clock::now();
    wall.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

}  // namespace

TEST_CASE("gpt kernel timings, one thread", "[.bench]") {
  Threads threads(1);
  Rng rng(61);
  const int B = 8, T = 256, C = 384, NH = 6, N = B * T, reps = 11;
  const Vec qkv = rand_vec(rng, int64_t(N) * 3 * C), dout = rand_vec(rng, int64_t(N) * C);
  Vec out(size_t(N) * C), att(size_t(B) * NH * T * T), dqkv(size_t(N) * 3 * C);
  const Timing fwd = median_ms(reps, [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  });
  const Timing bwd = median_ms(reps, [&] {
    attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  });
  // Causal work: each of the 2 forward and 4 backward products is T(T+1)/2 * hs multiply-adds
  // per (b, h); GFLOP/s from the CPU time.
  const double gflop = 2.0 * B * NH * T * (T + 1) / 2 * (C / NH) * 1e-9;
  std::printf("attention B=%d T=%d C=%d NH=%d, ms wall / cpu: forward %.2f / %.2f (%.1f causal "
              "GFLOP/s), backward %.2f / %.2f (%.1f), forward+backward %.2f / %.2f\n",
              B, T, C, NH, fwd.wall, fwd.cpu, 2 * gflop / fwd.cpu * 1e3, bwd.wall, bwd.cpu,
              4 * gflop / bwd.cpu * 1e3, fwd.wall + bwd.wall, fwd.cpu + bwd.cpu);

  // The same products on bf16 copies (train.precision = "bf16"), where the CPU has them.
  if (std::string why; !bf16_supported(&why)) {
    std::printf("attention bf16: skipped: %s\n", why.c_str());
  } else {
    const Timing f16 = median_ms(reps, [&] {
      bf16::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    });
    const Timing b16 = median_ms(reps, [&] {
      bf16::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    });
    std::printf("attention bf16, ms wall / cpu: forward %.2f / %.2f (%.1f causal GFLOP/s), "
                "backward %.2f / %.2f (%.1f), forward+backward %.2f / %.2f (%.2fx fp32)\n",
                f16.wall, f16.cpu, 2 * gflop / f16.cpu * 1e3, b16.wall, b16.cpu,
                4 * gflop / b16.cpu * 1e3, f16.wall + b16.wall, f16.cpu + b16.cpu,
                (fwd.cpu + bwd.cpu) / (f16.cpu + b16.cpu));
  }

  const Vec x = rand_vec(rng, int64_t(N) * C), w = rand_vec(rng, C), b = rand_vec(rng, C);
  Vec y(size_t(N) * C), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)),
      dx(size_t(N) * C), dw(static_cast<size_t>(C)), db(static_cast<size_t>(C));
  const Timing lf = median_ms(reps, [&] {
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  });
  const Timing lb = median_ms(reps, [&] {
    layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                       mean.data(), rstd.data(), N, C, true);
  });
  const double mb = double(N) * C * 4 / 1e6;  // MB of one (N,C) tensor
  std::printf("layernorm N=%d C=%d, ms wall / cpu: forward %.3f / %.3f (%.1f GB/s), backward "
              "%.3f / %.3f (%.1f GB/s), forward+backward %.3f / %.3f\n",
              N, C, lf.wall, lf.cpu, 2 * mb / lf.cpu, lb.wall, lb.cpu, 4 * mb / lb.cpu,
              lf.wall + lb.wall, lf.cpu + lb.cpu);

  std::vector<int32_t> tok(static_cast<size_t>(N));
  for (auto& t : tok) t = int32_t(rng.below(256));
  const Vec wte = rand_vec(rng, 256 * C), wpe = rand_vec(rng, T * C);
  Vec dwte(size_t(256) * C), dwpe(size_t(T) * C);
  const Timing ef = median_ms(reps, [&] {
    embedding_forward(y.data(), tok.data(), wte.data(), wpe.data(), B, T, C, 256);
  });
  const Timing eb = median_ms(reps, [&] {
    embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, 256, false);
  });
  const Timing rf = median_ms(reps, [&] {
    residual_forward(y.data(), x.data(), dout.data(), int64_t(N) * C);
  });
  std::printf("embedding V=256, ms cpu: forward %.3f, backward %.3f; residual_forward %.3f\n",
              ef.cpu, eb.cpu, rf.cpu);
  CHECK(std::isfinite(fwd.cpu + bwd.cpu + lf.cpu + lb.cpu));
}
