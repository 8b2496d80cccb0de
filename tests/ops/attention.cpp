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
#include <fmt/format.h>

#include "finite_diff.h"
#include "harness.h"
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
  const AttnShape shapes[] = {
      {1, 1, 8, 2},    // one position: att = 1, out = v
      {2, 5, 12, 3},   // hs = 4, rows shorter than a vector
      {2, 17, 32, 2},  // hs = 16, rows cross a vector boundary
      {1, 67, 40, 2},  // hs = 20, two row blocks (64 + 3)
  };
  uint64_t seed = 51;
  for (const AttnShape& s : shapes) {
    Rng rng(seed++);
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

}  // namespace strata::optest
