// Token + position embedding, forward and backward: every comparison exact. Forward is one add
// per element; backward adds the same terms in the same order as the CPU (b in order for dwpe,
// positions in order per token for dwte), overwriting and accumulating.
// The CPU kernel's own tests ([cpu_kernel], cpu_kernel.h: against the documented summation
// order and double sums, null and accumulated gradients, threads) and the finite-difference
// check share one shape and its tokens (kCpuEmb, cpu_emb_tokens).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cpu_kernel.h"
#include "finite_diff.h"
#include "harness.h"
#include "strata/error.h"
#include "table.h"

namespace strata::optest {
namespace {

struct EmbShape {
  int B, T, maxT, C, V;
  int N() const { return B * T; }
};
// T below maxT (dwpe rows from T on must be left alone); C = 771 (not a multiple of 32) over
// V = 256; one token; an empty batch.
const EmbShape kShapes[] = {
    {3, 37, 40, 48, 67}, {2, 64, 64, 771, 256}, {1, 1, 8, 5, 3}, {0, 5, 8, 4, 3}};

// The CPU kernel's shape: against the documented summation order and by finite differences.
const EmbShape kCpuEmb{.B = 3, .T = 5, .maxT = 8, .C = 19, .V = 7};
// Its tokens: 5 and 6 never occur (their rows of dwte are 0), 2 on several rows.
std::vector<int32_t> cpu_emb_tokens() {
  auto tok = random_ints(21, size_t(kCpuEmb.N()), 5);
  tok[0] = tok[7] = tok[14] = 2;
  return tok;
}

std::string emb_label(const char* op, const EmbShape& s) {
  return fmt::format("{} B{} T{} maxT{} C{} V{}", op, s.B, s.T, s.maxT, s.C, s.V);
}

// Random ids with the first 0 and the last V-1.
std::vector<int32_t> tokens(const EmbShape& s) {
  auto t = random_ints(7, size_t(s.N()), s.V);
  if (s.N() > 0) t.front() = 0, t.back() = s.V - 1;
  return t;
}

// Ids outside [0, V) at rows 3 and 11. The CPU's ops throw a UserError; a GPU cannot throw,
// so its ops must write NaN rows for them forward and leave them out backward (the layer checks
// ids on the host first; this is the GPU's guard).
constexpr int kB = 2, kT = 9, kC = 33, kV = 11, kN = kB * kT;
std::vector<int32_t> bad_ids() {
  auto tok = random_ints(21, size_t(kN), kV);
  tok[3] = kV + 5, tok[11] = -3;
  return tok;
}
// Whether the backend under test runs the CPU's kernel (cpu-staged), which throws: deferred,
// as a GPU's ops are, so its error surfaces at the next wait (synchronize).
bool throws_on_bad_ids(const Backend& be) { return std::string(be.name) == "cpu-staged"; }

void check_bad_ids_forward() {
  const auto tok = bad_ids();
  Tensor ids({kN}), wte({kV, kC}), wpe({kT, kC}), out({kN, kC});
  std::copy(tok.begin(), tok.end(), ids.i32());
  const Backend& be = select_target(Precision::fp32);
  const Tensor d_ids = to_backend(be, ids), d_wte = to_backend(be, wte),
               d_wpe = to_backend(be, wpe);
  Tensor d_out({kN, kC}, *be.memory);
  auto forward = [&] {
    be.embedding_forward(d_out.data(), d_ids.i32(), d_wte.data(), d_wpe.data(), kB, kT, kC, kV);
    be.synchronize();
  };
  if (throws_on_bad_ids(be)) {
    CHECK_THROWS_AS(forward(), UserError);
    return;
  }
  forward();
  be.download(out.data(), d_out.data(), sizeof(float) * size_t(kN) * kC);
  for (int row = 0; row < kN; ++row) {
    const bool bad = row == 3 || row == 11;
    INFO("embedding_forward, id " << tok[size_t(row)] << " of V " << kV << " at row " << row);
    CHECK(std::isnan(out[int64_t(row) * kC]) == bad);
    CHECK(std::isnan(out[int64_t(row) * kC + kC - 1]) == bad);
  }
}

// A GPU's gradient is the reference's with those rows of dout zeroed and their ids valid.
void check_bad_ids_backward() {
  const auto tok = bad_ids();
  const Backend& be = select_target(Precision::fp32);
  if (throws_on_bad_ids(be)) {
    Tensor ids({kN}), dout({kN, kC});
    std::copy(tok.begin(), tok.end(), ids.i32());
    const Tensor d_ids = to_backend(be, ids), d_dout = to_backend(be, dout);
    Tensor d_dwte({kV, kC}, *be.memory);
    CHECK_THROWS_AS((be.embedding_backward(d_dwte.data(), nullptr, d_dout.data(), d_ids.i32(),
                                           kB, kT, kC, kV, false),
                     be.synchronize()),
                    UserError);
    return;
  }
  auto ok = tok;
  ok[3] = 0, ok[11] = 0;
  auto dout = random_vector(24, size_t(kN) * kC);
  OpCase c("embedding_backward with 2 ids out of range");
  const I32 t = c.in(tok), t_ok = c.in(ok);
  const F32 dy = c.in(dout);
  for (int row : {3, 11}) std::fill_n(dout.begin() + int64_t(row) * kC, kC, 0.f);
  const F32 dy_ok = c.in(dout), dwte = c.out("dwte", size_t(kV) * kC, Tol::exact());
  c.run([&](const Backend& b, const Ptrs& p) {
    const bool ref = &b == &reference();
    b.embedding_backward(p[dwte], nullptr, p[ref ? dy_ok : dy], p[ref ? t_ok : t], kB, kT, kC, kV,
                         false);
  });
}

}  // namespace

void check_embedding_forward() {
  for (const EmbShape& s : kShapes) {
    OpCase c(emb_label("embedding_forward", s));
    const I32 tok = c.in(tokens(s));
    const F32 wte = c.in(random_vector(8, size_t(s.V) * s.C));
    const F32 wpe = c.in(random_vector(9, size_t(s.maxT) * s.C));
    const F32 out = c.out("out", size_t(s.N()) * s.C, Tol::exact());
    c.run([&](const Backend& be, const Ptrs& p) {
      be.embedding_forward(p[out], p[tok], p[wte], p[wpe], s.B, s.T, s.C, s.V);
    });
  }
  check_bad_ids_forward();
}

// Into earlier gradients (ignored, or added to when accumulating); and each followed by the
// tied table's second share: dwte alone, added on top (the LM head's), in the same case.
void check_embedding_backward() {
  for (const EmbShape& s : kShapes)
    for (bool accumulate : {false, true})
      for (bool tied : {false, true}) {
        OpCase c(emb_label(accumulate ? "embedding_backward accumulate" : "embedding_backward", s) +
                 (tied ? ", then dwte again" : ""));
        const I32 tok = c.in(tokens(s));
        const F32 dout = c.in(random_vector(10, size_t(s.N()) * s.C));
        const F32 dwte = c.inout("dwte", random_vector(11, size_t(s.V) * s.C), Tol::exact());
        const F32 dwpe = c.inout("dwpe", random_vector(12, size_t(s.maxT) * s.C), Tol::exact());
        c.run([&](const Backend& be, const Ptrs& p) {
          be.embedding_backward(p[dwte], p[dwpe], p[dout], p[tok], s.B, s.T, s.C, s.V, accumulate);
          if (tied)
            be.embedding_backward(p[dwte], nullptr, p[dout], p[tok], s.B, s.T, s.C, s.V, true);
        });
      }
  check_bad_ids_backward();
}

// dwte and dwpe by central differences; tokens 5 and 6 never occur (their rows of dwte are 0),
// token 2 occurs on several rows; dwpe rows from T on do not affect the loss (0).
void fd_embedding_backward() {
  const int B = kCpuEmb.B, T = kCpuEmb.T, C = kCpuEmb.C, V = kCpuEmb.V, maxT = kCpuEmb.maxT;
  const Backend& cpu = reference();
  const auto tok = cpu_emb_tokens();
  auto wte = random_vector(22, size_t(V) * C), wpe = random_vector(23, size_t(maxT) * C);
  const auto r = random_vector(24, size_t(B) * T * C);
  // dwpe rows from T on are not written (their gradient is 0: the loss does not read them).
  auto dwte = nan_vector(wte.size()), dwpe = nan_vector(size_t(T) * C);
  dwpe.resize(wpe.size(), 0.f);
  cpu.embedding_backward(dwte.data(), dwpe.data(), r.data(), tok.data(), B, T, C, V, false);
  auto loss = [&] {
    std::vector<float> y(r.size());
    cpu.embedding_forward(y.data(), tok.data(), wte.data(), wpe.data(), B, T, C, V);
    return dot(y, r);
  };
  Rng rng(25);
  check_grad("fd embedding_backward B3 T5 maxT8 C19 V7: dwte", wte, dwte, loss, rng);
  check_grad("fd embedding_backward B3 T5 maxT8 C19 V7: dwpe", wpe, dwpe, loss, rng);
}

// ---- The CPU kernel ([cpu_kernel]) ---------------------------------------------------------

using namespace strata::cpu;

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

// (Finite differences on this shape: "embedding_backward vs finite differences".)
TEST_CASE("embedding forward and backward", "[cpu_kernel][embedding]") {
  Rng rng(21);
  const int B = kCpuEmb.B, T = kCpuEmb.T, C = kCpuEmb.C, V = kCpuEmb.V, maxT = kCpuEmb.maxT;
  const std::vector<int32_t> tok = cpu_emb_tokens();
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

TEST_CASE("embedding is bitwise the same with 1 and 2 threads", "[cpu_kernel][embedding]") {
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

}  // namespace strata::optest
