// GPT-2's ops, CUDA against the CPU: embedding, layernorm, residual add and causal
// self-attention, forward and backward, on GPT-like shapes with odd sizes (T not a multiple of
// 32, C not a multiple of 32, N over several 64-row chunks and a partial one).
//
// Tolerances (norm-wise, see cuda_test_util.h):
//  - embedding forward and backward exact: forward is one add per element; backward adds the
//    same terms in the same order as the CPU (b in order for dwpe, positions in order per
//    token for dwte), overwriting and accumulating. Out-of-range ids: NaN rows forward, no
//    contribution backward (the layer checks ids on the host first; this is the guard).
//  - residual add exact: one IEEE add.
//  - layernorm 1e-5 (out, mean, rstd, dinp, dweight): the row sums run over C <= 771 terms in
//    another order (warp lanes against the CPU's vector lanes) and the GPU contracts some
//    products into FMAs: a few ulp of the row's scale, ~1e-6 at most. dbias is exact: the same
//    fp32 additions in the same order (rows in 64-row chunks, then chunk by chunk).
//  - attention fp32: att 1e-5 (scores are dot products of hs <= 32 terms, expf and the CPU's
//    polynomial exp are within 2 ulp each), out 2e-5 (att @ v over T <= 130 keys), dqkv 5e-5
//    (chains of two products over T keys, the linear layers' GEMM tolerance).
//  - attention bf16 5e-2: every product's inputs are rounded to bf16 (2^-9 relative each) and
//    the chain is 2 products deep forward and 3 backward, through the softmax. NOT measured
//    (no GPU has run this yet): set from the linear layers' measured bf16 error (3e-3 per
//    product) times the depth of the chain with margin; a wrong index or head gives O(1).
#include <cmath>

#include "cuda_test_util.h"

using namespace strata;
using namespace strata::cuda_test;

namespace {

std::vector<int32_t> random_tokens(uint64_t seed, size_t n, int V) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = std::min(V - 1, int(rng.uniform(0.f, float(V))));
  return t;
}

std::string shape_tag(const char* op, int B, int T, int C, int extra_name, int extra) {
  return std::string(op) + " B" + std::to_string(B) + " T" + std::to_string(T) + " C" +
         std::to_string(C) + (extra_name == 'V' ? " V" : " NH") + std::to_string(extra);
}

}  // namespace

TEST_CASE("embedding forward/backward are bit for bit the CPU's", "[gpt][embedding]") {
  use_precision(false);
  struct S {
    int B, T, maxT, C, V;
  };
  for (const S s : {S{3, 37, 40, 48, 67}, S{2, 64, 64, 771, 256}, S{1, 1, 8, 5, 3}}) {
    const int N = s.B * s.T;
    auto tokens = random_tokens(7, size_t(N), s.V);
    tokens[0] = 0;
    tokens[size_t(N - 1)] = s.V - 1;
    const auto wte = random_vector(8, size_t(s.V) * s.C), wpe = random_vector(9, size_t(s.maxT) * s.C);
    const auto dout = random_vector(10, size_t(N) * s.C);
    const auto dwte_prior = random_vector(11, size_t(s.V) * s.C);
    const auto dwpe_prior = random_vector(12, size_t(s.maxT) * s.C);
    DeviceBuffer<int32_t> dtok(tokens);
    DeviceBuffer<float> dwte_(wte), dwpe_(wpe), ddout(dout), dout_(size_t(N) * s.C);

    std::vector<float> ref(size_t(N) * s.C);
    cpu::embedding_forward(ref.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C, s.V);
    cuda::embedding_forward(dout_.get(), dtok.get(), dwte_.get(), dwpe_.get(), s.B, s.T, s.C, s.V);
    check_equal(shape_tag("embedding_forward", s.B, s.T, s.C, 'V', s.V), false, dout_.download(),
                ref);

    for (bool accumulate : {false, true}) {
      std::vector<float> ref_dwte = dwte_prior, ref_dwpe = dwpe_prior;
      cpu::embedding_backward(ref_dwte.data(), ref_dwpe.data(), dout.data(), tokens.data(), s.B,
                              s.T, s.C, s.V, accumulate);
      DeviceBuffer<float> g_wte(dwte_prior), g_wpe(dwpe_prior);
      cuda::embedding_backward(g_wte.get(), g_wpe.get(), ddout.get(), dtok.get(), s.B, s.T, s.C,
                               s.V, accumulate);
      const std::string acc = accumulate ? " accumulate" : "";
      // dwpe rows from T on are left as they were, in both.
      check_equal(shape_tag("embedding_backward dwte", s.B, s.T, s.C, 'V', s.V) + acc, false,
                  g_wte.download(), ref_dwte);
      check_equal(shape_tag("embedding_backward dwpe", s.B, s.T, s.C, 'V', s.V) + acc, false,
                  g_wpe.download(), ref_dwpe);
      // The tied table: one gradient alone, then the other added to it.
      cpu::embedding_backward(ref_dwte.data(), nullptr, dout.data(), tokens.data(), s.B, s.T,
                              s.C, s.V, true);
      cuda::embedding_backward(g_wte.get(), nullptr, ddout.get(), dtok.get(), s.B, s.T, s.C, s.V,
                               true);
      check_equal(shape_tag("embedding_backward dwte again, accumulate", s.B, s.T, s.C, 'V', s.V),
                  false, g_wte.download(), ref_dwte);
    }
  }
}

TEST_CASE("embedding: ids outside the vocabulary give NaN rows and no gradient",
          "[gpt][embedding]") {
  use_precision(false);
  const int B = 2, T = 9, C = 33, V = 11, N = B * T;
  auto tokens = random_tokens(21, size_t(N), V);
  tokens[3] = V + 5;
  tokens[11] = -3;
  const auto wte = random_vector(22, size_t(V) * C), wpe = random_vector(23, size_t(T) * C);
  auto dout = random_vector(24, size_t(N) * C);
  DeviceBuffer<int32_t> dtok(tokens);
  DeviceBuffer<float> dwte_(wte), dwpe_(wpe), ddout(dout), dout_(size_t(N) * C);
  cuda::embedding_forward(dout_.get(), dtok.get(), dwte_.get(), dwpe_.get(), B, T, C, V);
  const auto y = dout_.download();
  size_t nan_rows = 0;
  for (int i = 0; i < N; ++i) nan_rows += std::isnan(y[size_t(i) * C]) && std::isnan(y[size_t(i) * C + C - 1]);
  CHECK(nan_rows == 2);
  // The reference: those positions' gradient rows zero, their ids any valid one.
  DeviceBuffer<float> g_wte(size_t(V) * C);
  cuda::embedding_backward(g_wte.get(), nullptr, ddout.get(), dtok.get(), B, T, C, V, false);
  for (int i : {3, 11}) {
    tokens[size_t(i)] = 0;
    std::fill(dout.begin() + int64_t(i) * C, dout.begin() + int64_t(i + 1) * C, 0.f);
  }
  std::vector<float> ref(size_t(V) * C);
  cpu::embedding_backward(ref.data(), nullptr, dout.data(), tokens.data(), B, T, C, V, false);
  check_equal("embedding_backward with 2 ids out of range", false, g_wte.download(), ref);
}

TEST_CASE("layernorm and the residual add match the CPU", "[gpt][layernorm]") {
  use_precision(false);
  struct S {
    int N, C;
  };
  for (const S s : {S{300, 48}, S{1, 771}, S{64, 771}, S{129, 5}}) {
    const size_t n = size_t(s.N) * s.C;
    auto x = random_vector(31, n, -2.f, 2.f);
    for (int c = 0; c < s.C; ++c) x[size_t(c)] += 100.f;  // a row with a large mean
    const auto w = random_vector(32, size_t(s.C), 0.5f, 1.5f), b = random_vector(33, size_t(s.C));
    const auto dy = random_vector(34, n);
    const auto dw_prior = random_vector(35, size_t(s.C)), db_prior = random_vector(36, size_t(s.C));
    DeviceBuffer<float> dx_(x), dw_(w), db_(b), ddy(dy), dout(n), dmean(size_t(s.N)),
        drstd(size_t(s.N)), dgrad(n);
    std::vector<float> ref(n), mean(size_t(s.N)), rstd(size_t(s.N)), ref_dx(n);
    const std::string tag = " N" + std::to_string(s.N) + " C" + std::to_string(s.C);

    cpu::layernorm_forward(ref.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                           s.N, s.C);
    cuda::layernorm_forward(dout.get(), dmean.get(), drstd.get(), dx_.get(), dw_.get(), db_.get(),
                            s.N, s.C);
    check_close("layernorm_forward out" + tag, false, dout.download(), ref, 1e-5);
    check_close("layernorm_forward mean" + tag, false, dmean.download(), mean, 1e-5);
    check_close("layernorm_forward rstd" + tag, false, drstd.download(), rstd, 1e-5);

    for (bool accumulate : {false, true}) {
      std::vector<float> ref_dw = dw_prior, ref_db = db_prior;
      cpu::layernorm_backward(ref_dx.data(), ref_dw.data(), ref_db.data(), dy.data(), x.data(),
                              w.data(), mean.data(), rstd.data(), s.N, s.C, accumulate);
      DeviceBuffer<float> g_w(dw_prior), g_b(db_prior);
      cuda::layernorm_backward(dgrad.get(), g_w.get(), g_b.get(), ddy.get(), dx_.get(), dw_.get(),
                               dmean.get(), drstd.get(), s.N, s.C, accumulate);
      const std::string t = tag + (accumulate ? " accumulate" : "");
      check_close("layernorm_backward dinp" + t, false, dgrad.download(), ref_dx, 1e-5);
      check_close("layernorm_backward dweight" + t, false, g_w.download(), ref_dw, 1e-5);
      check_equal("layernorm_backward dbias" + t, false, g_b.download(), ref_db);
    }
    // Parameter gradients only (no dinp), and dinp only.
    std::vector<float> ref_db(size_t(s.C));
    cpu::layernorm_backward(nullptr, nullptr, ref_db.data(), dy.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), s.N, s.C, false);
    DeviceBuffer<float> g_b(size_t(s.C));
    cuda::layernorm_backward(nullptr, nullptr, g_b.get(), ddy.get(), dx_.get(), dw_.get(),
                             dmean.get(), drstd.get(), s.N, s.C, false);
    check_equal("layernorm_backward dbias alone" + tag, false, g_b.download(), ref_db);
    cuda::layernorm_backward(dgrad.get(), nullptr, nullptr, ddy.get(), dx_.get(), dw_.get(),
                             dmean.get(), drstd.get(), s.N, s.C, false);
    check_close("layernorm_backward dinp alone" + tag, false, dgrad.download(), ref_dx, 1e-5);

    // residual: out = a + b, also in place.
    std::vector<float> ref_r(n);
    cpu::residual_forward(ref_r.data(), x.data(), dy.data(), int64_t(n));
    cuda::residual_forward(dout.get(), dx_.get(), ddy.get(), int64_t(n));
    check_equal("residual_forward" + tag, false, dout.download(), ref_r);
    cuda::residual_forward(dx_.get(), dx_.get(), ddy.get(), int64_t(n));
    check_equal("residual_forward in place" + tag, false, dx_.download(), ref_r);
  }
}

TEST_CASE("causal attention forward/backward match the CPU", "[gpt][attention]") {
  cpu::blas_init(1);
  struct S {
    int B, T, C, NH;
  };
  for (bool bf16 : {false, true}) {
    use_precision(bf16);
    const double tol_att = bf16 ? 5e-2 : 1e-5, tol_out = bf16 ? 5e-2 : 2e-5,
                 tol_d = bf16 ? 5e-2 : 5e-5;
    for (const S s : {S{2, 37, 48, 4}, S{1, 130, 96, 3}, S{3, 1, 8, 2}}) {
      const size_t nqkv = size_t(s.B) * s.T * 3 * s.C, nout = size_t(s.B) * s.T * s.C;
      const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
      const auto qkv = random_vector(41, nqkv, -2.f, 2.f), dy = random_vector(42, nout);
      std::vector<float> ref_out(nout), ref_att(natt), ref_dqkv(nqkv);
      cpu::attention_forward(ref_out.data(), ref_att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
      cpu::attention_backward(ref_dqkv.data(), dy.data(), qkv.data(), ref_att.data(), s.B, s.T,
                              s.C, s.NH);
      // Poison the outputs first: every element must be written (the zeros above the diagonal
      // included).
      DeviceBuffer<float> dqkv_in(qkv), ddy(dy), dout(std::vector<float>(nout, NAN)),
          datt(std::vector<float>(natt, NAN)), dgrad(std::vector<float>(nqkv, NAN));
      cuda::attention_forward(dout.get(), datt.get(), dqkv_in.get(), s.B, s.T, s.C, s.NH);
      const std::string tag = shape_tag("", s.B, s.T, s.C, 'H', s.NH);
      const auto att = datt.download();
      check_close("attention_forward att" + tag, bf16, att, ref_att, tol_att);
      check_close("attention_forward out" + tag, bf16, dout.download(), ref_out, tol_out);
      size_t upper_nonzero = 0;
      for (int bh = 0; bh < s.B * s.NH; ++bh)
        for (int t1 = 0; t1 < s.T; ++t1)
          for (int t2 = t1 + 1; t2 < s.T; ++t2)
            upper_nonzero += att[(size_t(bh) * s.T + t1) * s.T + t2] != 0.f;
      CHECK(upper_nonzero == 0);
      // Backward from the CPU's att, so that it measures backward alone.
      DeviceBuffer<float> datt_ref(ref_att);
      cuda::attention_backward(dgrad.get(), ddy.get(), dqkv_in.get(), datt_ref.get(), s.B, s.T,
                               s.C, s.NH);
      check_close("attention_backward dqkv" + tag, bf16, dgrad.download(), ref_dqkv, tol_d);
    }
  }
}
