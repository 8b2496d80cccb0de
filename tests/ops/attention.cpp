// Causal multi-head self-attention, forward and backward, fp32 and bf16, on shapes with T not a
// multiple of 32 and head sizes of 12, 32 and 4.
//
// Tolerances:
//  - fp32: att 1e-5 (scores are dot products of hs <= 32 terms; expf and the CPU's polynomial
//    exp are within 2 ulp each), out 2e-5 (att @ v over T <= 130 keys), dqkv 5e-5 (chains of
//    two products over T keys, the linear layers' GEMM tolerance).
//  - bf16 1.5e-2: every product's inputs are rounded to bf16 (2^-9 relative each), the chain
//    2 products deep forward and 3 backward, through the softmax. Measured on the CPU (AMD EPYC,
//    AVX512_BF16): max_rel 3.8e-3 (out), 1.8e-3 (att), 1.7e-3 (dqkv) over these shapes, NMSE
//    <= 9e-6; 4x margin, still ~100x below a wrong index or head. Not yet run on a GPU.
// The CPU kernel's own tests ([cpu_kernel], cpu_kernel.h: against a naive double reference,
// large scores, threads) and the finite-difference check share kCpuAttnCases.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "cpu_kernel.h"
#include "finite_diff.h"
#include "harness.h"
#include "skip.h"
#include "table.h"

namespace strata::optest {
namespace {

struct AttnShape {
  int B, T, C, NH;
  size_t n_qkv() const { return size_t(B) * T * 3 * C; }
  size_t n_out() const { return size_t(B) * T * C; }
  size_t n_att() const { return size_t(B) * NH * T * T; }
};
const AttnShape kShapes[] = {{2, 37, 48, 4}, {1, 130, 96, 3}, {3, 1, 8, 2}, {0, 5, 8, 2}};

// The CPU kernel's shapes and seeds: against the naive double reference, and those marked fd
// by finite differences too.
struct AttnCase {
  int B, T, C, NH;
  uint64_t seed;
  bool fd;
};
const AttnCase kCpuAttnCases[] = {
    {1, 1, 8, 2, 51, true},       // one position: att = 1, out = v
    {2, 5, 12, 3, 52, true},      // hs = 4, rows shorter than a vector
    {2, 17, 32, 2, 53, true},     // hs = 16, rows cross a vector boundary
    {1, 67, 40, 2, 54, true},     // hs = 20, two row blocks (64 + 3)
    {2, 130, 64, 4, 55, false},   // three row blocks, the last partial
    {1, 256, 128, 2, 56, false},  // GPT's T, hs = 64, four full blocks
};

Tol att_tol(Precision p) { return Tol::close(p == Precision::bf16 ? 1.5e-2 : 1e-5); }
Tol out_tol(Precision p) { return Tol::close(p == Precision::bf16 ? 1.5e-2 : 2e-5); }
Tol dqkv_tol(Precision p) { return Tol::close(p == Precision::bf16 ? 1.5e-2 : 5e-5); }

std::string attn_label(const char* op, const AttnShape& s) {
  return fmt::format("{} B{} T{} C{} NH{}", op, s.B, s.T, s.C, s.NH);
}

}  // namespace

// att above the diagonal must be written as exact zeros (outputs start as NaN).
void check_attention_forward() {
  for (const AttnShape& s : kShapes)
    for (Precision prec : precisions(true)) {
      OpCase c(attn_label("attention_forward", s), prec);
      const F32 qkv = c.in(random_vector(41, s.n_qkv(), -2.f, 2.f));
      const F32 out = c.out("out", s.n_out(), out_tol(prec)),
                att = c.out("att", s.n_att(), att_tol(prec));
      c.run([&](const Backend& be, const Ptrs& p) {
        be.attention_forward(p[out], p[att], p[qkv], s.B, s.T, s.C, s.NH);
      });
      size_t upper_nonzero = 0;
      for (size_t bh = 0; bh < size_t(s.B) * s.NH; ++bh)
        for (int t1 = 0; t1 < s.T; ++t1)
          for (int t2 = t1 + 1; t2 < s.T; ++t2)
            upper_nonzero += c.got(att)[(bh * s.T + size_t(t1)) * s.T + size_t(t2)] != 0.f;
      INFO(attn_label("attention_forward", s) << ": entries of att above the diagonal not 0");
      CHECK(upper_nonzero == 0);
    }
}

// From the reference's att, so that it measures backward alone.
void check_attention_backward() {
  for (const AttnShape& s : kShapes) {
    const auto qkv = random_vector(41, s.n_qkv(), -2.f, 2.f);
    std::vector<float> out(s.n_out()), att(s.n_att());
    reference().attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    for (Precision prec : precisions(true)) {
      OpCase c(attn_label("attention_backward", s), prec);
      const F32 dy = c.in(random_vector(42, s.n_out())), q = c.in(qkv), a = c.in(att);
      const F32 dqkv = c.out("dqkv", s.n_qkv(), dqkv_tol(prec));
      c.run([&](const Backend& be, const Ptrs& p) {
        be.attention_backward(p[dqkv], p[dy], p[q], p[a], s.B, s.T, s.C, s.NH);
      });
    }
  }
}

// dqkv by central differences of L = sum(out * r).
void fd_attention_backward() {
  const Backend& cpu = reference();
  for (const AttnCase& c : kCpuAttnCases) {
    if (!c.fd) continue;
    const AttnShape s{c.B, c.T, c.C, c.NH};
    Rng rng(c.seed);
    auto qkv = random_vector(rng.next(), s.n_qkv());
    const auto r = random_vector(rng.next(), s.n_out());
    std::vector<float> out(s.n_out()), att(s.n_att()), dqkv = nan_vector(s.n_qkv());
    cpu.attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    cpu.attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
    auto loss = [&] {
      std::vector<float> y(s.n_out()), a(s.n_att());
      cpu.attention_forward(y.data(), a.data(), qkv.data(), s.B, s.T, s.C, s.NH);
      return dot(y, r);
    };
    check_grad("fd " + attn_label("attention_backward", s) + ": dqkv", qkv, dqkv, loss, rng);
  }
}

// ---- The CPU kernel ([cpu_kernel]) ---------------------------------------------------------

using namespace strata::cpu;

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
          "[cpu_kernel][attention]") {
  // (Those marked fd also by finite differences: "attention_backward vs finite differences".)
  for (const AttnCase& s : kCpuAttnCases) attention_case(s.B, s.T, s.C, s.NH, s.seed);
}

TEST_CASE("attention is stable for large scores", "[cpu_kernel][attention]") {
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

TEST_CASE("attention is bitwise the same with 1 and 2 threads", "[cpu_kernel][attention]") {
  attention_threads_case({attention_forward, attention_backward});
}

// Its products are oneDNN matmul primitives, run on the calling thread inside the per-head loop
// as the sgemms are.
TEST_CASE("attention in bf16 is bitwise the same with 1 and 2 threads",
          "[cpu_kernel][attention]") {
  if (std::string why; !bf16_supported(&why)) STRATA_SKIP("bf16 not checked on this CPU: " << why);
  attention_threads_case({bf16::attention_forward, bf16::attention_backward});
}

}  // namespace strata::optest
