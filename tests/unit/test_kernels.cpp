// CPU kernel tests: forwards against naive double-precision references; the backward ops'
// null-gradient and accumulate semantics, tie and NaN rules, dropout's mask. Every backward op
// is checked against central finite differences of its forward in the op table (tests/ops,
// "<op> vs finite differences").
//
// Tolerances. sgemm is checked with a bound proportional to the sum of the absolute values of
// the terms (fp32 rounding of a K-term dot product is at most ~K * 6e-8 of that sum); the
// other forwards with an absolute bound explained where it is used.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "strata/kernels_cpu.h"
#include "strata/rng.h"

using namespace strata;
using namespace strata::cpu;

namespace {

using Vec = std::vector<float>;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Vec rand_vec(Rng& rng, int64_t n, float lo = -1.f, float hi = 1.f) {
  Vec v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

// NaN-filled buffer: an output a kernel fails to overwrite shows up in the comparisons.
Vec nan_vec(int64_t n) { return Vec(n, kNaN); }

// Elementwise comparison with an absolute tolerance.
void check_close(const std::string& what, const Vec& got, const std::vector<double>& want,
                 double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << "[" << i << "]: got " << got[i] << ", want " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol);
  }
}

// ---- naive references ----------------------------------------------------------------------

// C = alpha op(A) op(B) + beta C in double; also returns the magnitude sum for the tolerance.
void ref_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const Vec& A, int lda,
              const Vec& B, int ldb, float beta, const Vec& C0, int ldc, std::vector<double>& C,
              std::vector<double>& mag) {
  C.assign(C0.size(), 0.0);
  mag.assign(C0.size(), 0.0);
  for (size_t i = 0; i < C0.size(); ++i) C[i] = C0[i];  // untouched entries outside (M,N)
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0, m = 0;
      for (int k = 0; k < K; ++k) {
        const double a = ta ? A[int64_t(k) * lda + i] : A[int64_t(i) * lda + k];
        const double b = tb ? B[int64_t(j) * ldb + k] : B[int64_t(k) * ldb + j];
        s += a * b;
        m += std::abs(a * b);
      }
      const double c = C0[int64_t(i) * ldc + j];
      C[int64_t(i) * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * c);
      mag[int64_t(i) * ldc + j] = std::abs(alpha) * m + (beta == 0 ? 0.0 : std::abs(beta * c));
    }
}

std::vector<double> ref_conv(const Vec& inp, const Vec& w, const Vec* bias, const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  std::vector<double> out(int64_t(s.B) * s.OC * OH * OW);
  for (int b = 0; b < s.B; ++b)
    for (int oc = 0; oc < s.OC; ++oc)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          double acc = bias ? (*bias)[oc] : 0.0;
          for (int c = 0; c < s.C; ++c)
            for (int kh = 0; kh < s.KH; ++kh)
              for (int kw = 0; kw < s.KW; ++kw) {
                const int ih = oh * s.stride + kh - s.pad, iw = ow * s.stride + kw - s.pad;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                acc += double(inp[((int64_t(b) * s.C + c) * s.H + ih) * s.W + iw]) *
                       w[((int64_t(oc) * s.C + c) * s.KH + kh) * s.KW + kw];
              }
          out[((int64_t(b) * s.OC + oc) * OH + oh) * OW + ow] = acc;
        }
  return out;
}

// Values spaced 0.05 apart in random order: a max never changes under a +-1e-2 perturbation.
Vec distinct_vec(Rng& rng, int64_t n) {
  Vec v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 0.05f * float(i - n / 2);
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(i + 1)]);
  return v;
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

}  // namespace

// ---- BLAS ----------------------------------------------------------------------------------

TEST_CASE("blas uses the widest vector kernels this CPU has", "[kernels][blas]") {
  blas_init(1);
  blas_init(1);  // a second call is harmless
  const std::string name = blas_corename();
  INFO("GEMM kernels: " << name);
  CHECK(!name.empty());
  // The OpenBLAS trap (FACTS.md): on a VM reporting a generic CPU model, name-based dispatch
  // falls back to SSE kernels. oneDNN dispatches on cpuid flags; check it sees AVX-512.
  if (cpu_has_avx512()) CHECK(name.find("avx512") != std::string::npos);
}

TEST_CASE("sgemm matches a naive triple loop", "[kernels][blas]") {
  Rng rng(1);
  struct Size {
    int M, N, K;
  };
  for (Size sz : {Size{1, 1, 1}, Size{7, 5, 3}, Size{13, 17, 19}, Size{33, 2, 65},
                  Size{2, 40, 9}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.f, 0.5f}) {
          const int M = sz.M, N = sz.N, K = sz.K;
          // Leading dimensions wider than the matrices, so ld is really used.
          const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
          const Vec A = rand_vec(rng, int64_t(ta ? K : M) * lda);
          const Vec B = rand_vec(rng, int64_t(tb ? N : K) * ldb);
          Vec C = rand_vec(rng, int64_t(M) * ldc);
          if (beta == 0)  // beta = 0 must overwrite, even NaN
            for (int i = 0; i < M; ++i)
              std::fill(C.begin() + int64_t(i) * ldc, C.begin() + int64_t(i) * ldc + N, kNaN);
          std::vector<double> want, mag;
          ref_gemm(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, beta, C, ldc, want, mag);
          sgemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          for (size_t i = 0; i < C.size(); ++i) {
            INFO("M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb
                      << " beta=" << beta << " C[" << i << "] = " << C[i] << ", want "
                      << want[i]);
            if (int64_t(i) % ldc >= N)  // padding column: untouched
              CHECK(C[i] == want[i]);
            else
              // K <= 65: the fp32 worst case 65 * 6e-8 * mag is 4e-6 * mag.
              CHECK(std::abs(C[i] - want[i]) <= 1e-5 * mag[i] + 1e-30);
          }
        }
}

TEST_CASE("sgemm on empty sizes", "[kernels][blas]") {
  Vec C = {kNaN, kNaN, 2.f, 4.f};
  // K == 0: C = beta * C; beta == 0 overwrites (NaN included). lda/ldb of 0 would be
  // rejected by BLAS, so this also checks BLAS is not called.
  sgemm(false, false, 1, 2, 0, 1.f, nullptr, 0, nullptr, 0, 0.f, C.data(), 2);
  CHECK(C[0] == 0.f);
  CHECK(C[1] == 0.f);
  sgemm(true, true, 1, 2, 0, 1.f, nullptr, 0, nullptr, 0, 0.5f, C.data() + 2, 2);
  CHECK(C[2] == 1.f);
  CHECK(C[3] == 2.f);
  // M == 0 or N == 0: nothing to do, nothing touched.
  sgemm(false, false, 0, 2, 3, 1.f, nullptr, 3, nullptr, 2, 0.f, C.data(), 2);
  sgemm(false, false, 2, 0, 3, 1.f, nullptr, 3, nullptr, 1, 0.f, C.data(), 1);
  CHECK(C[2] == 1.f);
}

// ---- Linear --------------------------------------------------------------------------------

// (The gradients' values: tests/ops, "linear_backward vs finite differences".)
TEST_CASE("linear forward, and backward's null and accumulated gradients", "[kernels][linear]") {
  Rng rng(2);
  const int B = 3, I = 5, O = 4;
  Vec x = rand_vec(rng, B * I), w = rand_vec(rng, O * I), bias = rand_vec(rng, O);
  const Vec r = rand_vec(rng, B * O);
  for (bool with_bias : {true, false}) {
    const float* bp = with_bias ? bias.data() : nullptr;
    Vec out = nan_vec(B * O);
    linear_forward(out.data(), x.data(), w.data(), bp, B, I, O);
    std::vector<double> want(B * O);
    for (int b = 0; b < B; ++b)
      for (int o = 0; o < O; ++o) {
        double s = with_bias ? bias[o] : 0.0;
        for (int i = 0; i < I; ++i) s += double(x[b * I + i]) * w[o * I + i];
        want[b * O + o] = s;
      }
    check_close("linear out", out, want, 1e-5);  // 6 terms in [-1,1]: ~1e-6 worst case

    Vec dx = nan_vec(B * I), dw = nan_vec(O * I), db = nan_vec(O);
    linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), B, I, O, false);

    // Null gradients are skipped; the others do not change.
    Vec dw2 = nan_vec(O * I);
    linear_backward(nullptr, dw2.data(), nullptr, r.data(), x.data(), w.data(), B, I, O, false);
    CHECK(dw2 == dw);

    // accumulate adds the parameter gradients to what is there (micro-batches of a step).
    Vec dw3(O * I, 1.f), db3(O, 1.f), dx3 = nan_vec(B * I);
    linear_backward(dx3.data(), dw3.data(), with_bias ? db3.data() : nullptr, r.data(), x.data(),
                    w.data(), B, I, O, true);
    for (int i = 0; i < O * I; ++i) CHECK(dw3[i] == Approx(dw[i] + 1.f).margin(1e-5));
    if (with_bias)
      for (int o = 0; o < O; ++o) CHECK(db3[o] == Approx(db[o] + 1.f).margin(1e-5));
    CHECK(dx3 == dx);
  }
}

// ---- Conv2d --------------------------------------------------------------------------------

namespace {

void conv_case(const Conv2dShape& s, uint64_t seed) {
  Rng rng(seed);
  const int64_t n_in = int64_t(s.B) * s.C * s.H * s.W, n_w = int64_t(s.OC) * s.C * s.KH * s.KW;
  const int64_t n_out = int64_t(s.B) * s.OC * s.OH() * s.OW();
  Vec x = rand_vec(rng, n_in), w = rand_vec(rng, n_w), bias = rand_vec(rng, s.OC);
  const Vec r = rand_vec(rng, n_out);
  // Scratch full of NaN: reading anything the kernel did not write poisons the result.
  Vec scratch = nan_vec(conv2d_scratch_size(s));
  std::ostringstream tag;
  tag << "conv B=" << s.B << " C=" << s.C << " H=" << s.H << " W=" << s.W << " OC=" << s.OC
      << " K=" << s.KH << "x" << s.KW << " stride=" << s.stride << " pad=" << s.pad;
  INFO(tag.str());

  Vec out = nan_vec(n_out);
  conv2d_forward(out.data(), x.data(), w.data(), bias.data(), s, scratch.data());
  // Outputs are sums of <= 37 terms in [-1,1]: the fp32 error is typically a few ulp of ~3,
  // ~1e-6; 3e-5 is a safe bound that a wrong index or missed term still exceeds by far.
  check_close("conv out", out, ref_conv(x, w, &bias, s), 3e-5);
  out = nan_vec(n_out);
  std::fill(scratch.begin(), scratch.end(), kNaN);
  conv2d_forward(out.data(), x.data(), w.data(), nullptr, s, scratch.data());
  check_close("conv out (no bias)", out, ref_conv(x, w, nullptr, s), 3e-5);

  Vec dx = nan_vec(n_in), dw = nan_vec(n_w), db = nan_vec(s.OC);
  std::fill(scratch.begin(), scratch.end(), kNaN);
  conv2d_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), s,
                  scratch.data(), false);

  // Each gradient alone gives the same values as all together.
  Vec dx2 = nan_vec(n_in), dw2 = nan_vec(n_w), db2 = nan_vec(s.OC);
  std::fill(scratch.begin(), scratch.end(), kNaN);
  conv2d_backward(nullptr, dw2.data(), nullptr, r.data(), x.data(), w.data(), s, scratch.data(), false);
  std::fill(scratch.begin(), scratch.end(), kNaN);
  conv2d_backward(dx2.data(), nullptr, nullptr, r.data(), x.data(), w.data(), s, scratch.data(), false);
  std::fill(scratch.begin(), scratch.end(), kNaN);
  conv2d_backward(nullptr, nullptr, db2.data(), r.data(), x.data(), w.data(), s, scratch.data(), false);
  CHECK(dx2 == dx);
  CHECK(dw2 == dw);
  CHECK(db2 == db);

  // accumulate adds the parameter gradients to what is there (micro-batches of a step).
  Vec dw3(n_w, 1.f), db3(s.OC, 1.f);
  std::fill(scratch.begin(), scratch.end(), kNaN);
  conv2d_backward(nullptr, dw3.data(), db3.data(), r.data(), x.data(), w.data(), s, scratch.data(), true);
  for (int64_t i = 0; i < n_w; ++i) CHECK(dw3[size_t(i)] == Approx(dw[size_t(i)] + 1.f).margin(1e-4));
  for (int o = 0; o < s.OC; ++o) CHECK(db3[size_t(o)] == Approx(db[size_t(o)] + 1.f).margin(1e-4));
}

}  // namespace

// (The gradients' values, on these shapes: tests/ops, "conv2d_backward vs finite differences".)
TEST_CASE("conv2d forward matches direct convolution, "
          "and backward's null and accumulated gradients",
          "[kernels][conv]") {
  uint64_t seed = 10;
  for (int stride : {1, 2})
    for (int pad : {0, 1}) conv_case({2, 3, 5, 7, 4, 3, 3, stride, pad}, seed++);
  conv_case({3, 2, 6, 5, 3, 2, 3, 1, 1}, seed++);  // non-square kernel
  conv_case({2, 2, 4, 4, 3, 1, 1, 2, 0}, seed++);  // 1x1, stride 2
  conv_case({2, 3, 5, 6, 4, 1, 1, 1, 0}, seed++);  // 1x1, stride 1
  conv_case({2, 1, 3, 4, 2, 3, 3, 2, 2}, seed++);  // pad 2: whole rows/columns of padding
  conv_case({1, 4, 8, 8, 5, 3, 3, 3, 1}, seed++);  // stride 3, B = 1
  // Larger images: the kernels switch from multi-sample chunks to per-sample gemms as the
  // image grows (conv.cpp, chunk_samples); these cover a partial last chunk (P = 80, B = 3),
  // per-sample chunks (P >= 110), and the "same"-padding fast path with pad 1 and 2.
  conv_case({3, 2, 8, 10, 3, 3, 3, 1, 1}, seed++);
  conv_case({2, 2, 11, 12, 3, 3, 3, 1, 1}, seed++);
  conv_case({2, 2, 12, 13, 3, 3, 3, 1, 0}, seed++);
  conv_case({2, 2, 21, 23, 3, 3, 3, 2, 1}, seed++);
  conv_case({2, 1, 10, 11, 2, 5, 5, 1, 2}, seed++);
}

// ---- MaxPool2d -----------------------------------------------------------------------------

// (Backward, on these shapes: tests/ops, "maxpool2d_backward vs finite differences".)
TEST_CASE("maxpool2d forward: values and argmax", "[kernels][pool]") {
  Rng rng(3);
  struct Case {
    int B, C, H, W, k, st;
  };
  // 2x2/2 (the specialised path, with an uncovered row and column on 5x7), overlapping 3x3/2,
  // and tiled 3x3/3 with uncovered rows and columns.
  for (Case c : {Case{2, 3, 6, 6, 2, 2}, Case{2, 2, 5, 7, 2, 2}, Case{2, 2, 8, 21, 2, 2},
                 Case{1, 2, 7, 6, 3, 2}, Case{2, 2, 7, 8, 3, 3}}) {
    INFO("maxpool " << c.H << "x" << c.W << " k=" << c.k << " st=" << c.st);
    const int OH = (c.H - c.k) / c.st + 1, OW = (c.W - c.k) / c.st + 1;
    const int64_t n_in = int64_t(c.B) * c.C * c.H * c.W, n_out = int64_t(c.B) * c.C * OH * OW;
    Vec x = distinct_vec(rng, n_in);
    Vec out = nan_vec(n_out);
    std::vector<int32_t> am(n_out, -1);
    maxpool2d_forward(out.data(), am.data(), x.data(), c.B, c.C, c.H, c.W, c.k, c.st);
    for (int64_t pl = 0; pl < int64_t(c.B) * c.C; ++pl)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          float best = -1e30f;
          for (int i = 0; i < c.k; ++i)
            for (int j = 0; j < c.k; ++j)
              best = std::max(best, x[pl * c.H * c.W + (oh * c.st + i) * c.W + ow * c.st + j]);
          const int64_t o = pl * OH * OW + oh * OW + ow;
          CHECK(out[o] == best);
          CHECK(x[pl * c.H * c.W + am[o]] == best);
        }
  }
}

// The 2x2/2 path compares four windows at a time in SIMD lanes, pairwise; it must give the
// value and argmax of the sequential window scan, including its tie rule (first max wins) and
// NaN rule (a NaN wins), on rows long enough for the vector loop and its scalar tail.
TEST_CASE("maxpool2d 2x2 matches a sequential scan with ties and NaN", "[kernels][pool]") {
  Rng rng(11);
  const int H = 6, W = 22, OH = 3, OW = 11;
  for (int trial = 0; trial < 20; ++trial) {
    Vec x(H * W);
    for (auto& v : x) {  // few distinct values: many ties; some NaN
      const uint64_t r = rng.below(10);
      v = r == 9 && trial % 2 ? kNaN : float(r % 3);
    }
    Vec out(OH * OW);
    std::vector<int32_t> am(OH * OW);
    maxpool2d_forward(out.data(), am.data(), x.data(), 1, 1, H, W, 2, 2);
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        int best_i = 2 * oh * W + 2 * ow;
        for (int o : {1, W, W + 1}) {
          const int i = 2 * oh * W + 2 * ow + o;
          if (x[i] > x[best_i] || x[i] != x[i]) best_i = i;
        }
        INFO("trial " << trial << " window (" << oh << ", " << ow << ")");
        CHECK(am[oh * OW + ow] == best_i);
        const float got = out[oh * OW + ow], want = x[best_i];
        CHECK((got == want || (got != got && want != want)));
      }
  }
}

TEST_CASE("maxpool2d ties and overlapping windows", "[kernels][pool]") {
  const Vec x = {1, 1, 1, 1};
  float out = 0;
  int32_t am = -1;
  maxpool2d_forward(&out, &am, x.data(), 1, 1, 2, 2, 2, 2);
  CHECK(am == 0);  // first maximum
  // k=2, st=1 on 3x3 with the max in the centre: all four windows pick it and backward adds.
  const Vec y = {0, 1, 0, 2, 9, 3, 0, 4, 0}, dy = {1, 2, 3, 4};
  Vec o(4), dx = nan_vec(9);
  std::vector<int32_t> a(4);
  maxpool2d_forward(o.data(), a.data(), y.data(), 1, 1, 3, 3, 2, 1);
  CHECK(o == Vec{9, 9, 9, 9});
  maxpool2d_backward(dx.data(), dy.data(), a.data(), 1, 1, 3, 3, 2, 1);
  CHECK(dx == Vec{0, 0, 0, 0, 10, 0, 0, 0, 0});
}

// ---- Activations ---------------------------------------------------------------------------

// (Backward: tests/ops, "relu_backward vs finite differences".)
TEST_CASE("relu forward", "[kernels][activation]") {
  Rng rng(4);
  const int n = 50;
  Vec x = rand_vec(rng, n);
  for (auto& v : x) v += v < 0 ? -0.05f : 0.05f;  // away from the kink at 0
  Vec out = nan_vec(n);
  relu_forward(out.data(), x.data(), n);
  for (int i = 0; i < n; ++i) CHECK(out[i] == std::max(x[i], 0.f));
}

// (Backward: tests/ops, "gelu_backward vs finite differences".)
TEST_CASE("gelu forward", "[kernels][activation]") {
  Rng rng(5);
  const int n = 60;
  Vec x = rand_vec(rng, n, -4.f, 4.f);
  Vec out = nan_vec(n);
  gelu_forward(out.data(), x.data(), n);
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) want[i] = x[i] * 0.5 * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
  check_close("gelu out", out, want, 4e-6);  // a few ulp of |out| <= 4 (erff is ~1 ulp)
}

TEST_CASE("add_bias_rows", "[kernels][activation]") {
  Vec x = {1, 2, 3, 4, 5, 6};
  const Vec b = {10, 20, 30};
  add_bias_rows(x.data(), b.data(), 2, 3);
  CHECK(x == Vec{11, 22, 33, 14, 25, 36});
}

// ---- Dropout -------------------------------------------------------------------------------

TEST_CASE("dropout mask is independent of the batch split", "[kernels][dropout]") {
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

TEST_CASE("dropout keeps a fraction 1-p and p=0 is the identity", "[kernels][dropout]") {
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

// ---- Softmax cross-entropy -----------------------------------------------------------------

// (Backward: tests/ops, "softmax_xent_backward vs finite differences".)
TEST_CASE("softmax_xent matches the direct formula", "[kernels][xent]") {
  Rng rng(8);
  const int B = 5, C = 7;
  Vec logits = rand_vec(rng, B * C, -3.f, 3.f);
  std::vector<int32_t> labels(B);
  for (auto& l : labels) l = int32_t(rng.below(C));
  Vec probs = nan_vec(B * C);
  const double loss = softmax_xent_forward(probs.data(), logits.data(), labels.data(), B, C);
  double want = 0;
  std::vector<double> want_p(B * C);
  for (int b = 0; b < B; ++b) {
    double z = 0;
    for (int c = 0; c < C; ++c) z += std::exp(double(logits[b * C + c]));
    for (int c = 0; c < C; ++c) want_p[b * C + c] = std::exp(double(logits[b * C + c])) / z;
    want -= std::log(want_p[b * C + labels[b]]);
  }
  // fp32 exp/sum of 7 terms: probabilities within a few ulp (~1e-7); the loss is summed in
  // double from fp32 log-sum-exp pieces, relative error ~1e-7.
  CHECK(loss == Approx(want).epsilon(1e-6));
  check_close("probs", probs, want_p, 1e-6);
}

TEST_CASE("softmax_xent is stable for large logits", "[kernels][xent]") {
  const Vec logits = {1000.f, 0.f, -1000.f, 500.f, 500.f, 500.f};
  const std::vector<int32_t> labels = {1, 2};
  Vec probs(6);
  const double loss = softmax_xent_forward(probs.data(), logits.data(), labels.data(), 2, 3);
  CHECK(loss == Approx(1000.0 + std::log(3.0)).epsilon(1e-9));  // exact up to double rounding
  CHECK(probs[0] == 1.f);
  CHECK(probs[1] == 0.f);
  CHECK(probs[3] == Approx(1.0 / 3).epsilon(1e-6));
}

TEST_CASE("count_correct takes the first maximum", "[kernels][xent]") {
  const Vec logits = {0, 2, 1,   // argmax 1
                      3, 3, 0,   // tie: first (0)
                      1, 0, 5};  // argmax 2
  CHECK(count_correct(logits.data(), std::vector<int32_t>{1, 0, 2}.data(), 3, 3) == 3);
  CHECK(count_correct(logits.data(), std::vector<int32_t>{1, 1, 0}.data(), 3, 3) == 1);
}

// ---- Optimizers ----------------------------------------------------------------------------

TEST_CASE("sgd_update follows torch.optim.SGD for two steps", "[kernels][optim]") {
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

TEST_CASE("adamw_update follows torch.optim.AdamW for two steps", "[kernels][optim]") {
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

TEST_CASE("sum_squares and scale_inplace", "[kernels][optim]") {
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
