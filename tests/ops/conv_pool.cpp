// conv2d (scratch size, forward, backward) and maxpool2d (forward, backward).
//
// Tolerances:
//  - conv fp32 1e-4: sums of C*KH*KW (forward, dinp) or B*OH*OW (dweight, up to 32768) fp32
//    products in other orders, and cuDNN may pick a Winograd or FFT algorithm whose transforms
//    add their own rounding (~1e-6..1e-5 relative). 1e-4 still fails any indexing error.
//  - conv bf16 1.5e-2: input, weight and dout rounded to bf16, fp32 accumulation, and the
//    result rounded to bf16 once more (cuDNN's legacy API writes y in the input type). A CPU
//    model of exactly that measured 3.2e-3..4.4e-3 on GEMMs of these sizes: ~3.5x margin.
//  - dbias 1e-5 in both precisions: an fp32 sum over B*OH*OW either way.
//  - An empty batch (B = 0) exact: parameter gradients zeroed, or kept when accumulating.
//  - maxpool exact (out, argmax, dinp): a max involves no rounding, and backward adds the same
//    values in the same order.
#include <fmt/format.h>

#include "finite_diff.h"
#include "harness.h"
#include "table.h"

namespace strata::optest {
namespace {

// {B, C, H, W, OC, KH, KW, stride, pad}
const Conv2dShape kConvShapes[] = {
    {4, 3, 17, 17, 8, 3, 3, 1, 1},    // stride 1, pad 1 ("same"), odd size
    {3, 8, 16, 16, 16, 3, 3, 2, 0},   // stride 2, no padding
    {2, 16, 9, 11, 5, 5, 3, 1, 2},    // rectangular image and kernel, pad 2
    {128, 4, 16, 16, 8, 3, 3, 1, 1},  // a bias gradient summed in chunks (two passes)
    {2, 1, 3, 4, 2, 3, 3, 2, 2},      // whole rows and columns of padding
    {2, 2, 4, 4, 3, 1, 1, 2, 0},      // 1x1, stride 2
    {1, 4, 8, 8, 5, 3, 3, 3, 1},      // stride 3, B = 1
};
const Tol kBiasTol = Tol::close(1e-5);
Tol conv_tol(Precision p) { return Tol::close(p == Precision::bf16 ? 1.5e-2 : 1e-4); }

std::string conv_label(const char* op, const Conv2dShape& s) {
  return fmt::format("{} {}x{}x{}x{} oc{} k{}x{} s{} p{}", op, s.B, s.C, s.H, s.W, s.OC, s.KH, s.KW,
                     s.stride, s.pad);
}

size_t n_in(const Conv2dShape& s) { return size_t(s.B) * s.C * s.H * s.W; }
size_t n_w(const Conv2dShape& s) { return size_t(s.OC) * s.C * s.KH * s.KW; }
size_t n_out(const Conv2dShape& s) { return size_t(s.B) * s.OC * s.OH() * s.OW(); }

struct ConvData {
  std::vector<float> x, w, bias, dy, dw_prior, db_prior;
  explicit ConvData(const Conv2dShape& s)
      : x(random_vector(11, n_in(s))),
        w(random_vector(12, n_w(s))),
        bias(random_vector(13, size_t(s.OC))),
        dy(random_vector(14, n_out(s))),
        dw_prior(random_vector(15, n_w(s))),
        db_prior(random_vector(16, size_t(s.OC))) {}
};

F32 conv_scratch(OpCase& c, const Conv2dShape& s) {
  return c.scratch([s](const Backend& be) { return be.conv2d_scratch_size(s); });
}

// An empty batch: the parameter gradients are zeroed, or kept when accumulating.
void check_conv_empty_batch() {
  const Conv2dShape s{0, 3, 8, 8, 4, 3, 3, 1, 1};
  const ConvData d(s);
  for (bool accumulate : {true, false}) {
    OpCase c(conv_label(accumulate ? "conv2d_backward accumulate" : "conv2d_backward", s));
    const F32 dy = c.in(d.dy), x = c.in(d.x), w = c.in(d.w), scratch = conv_scratch(c, s);
    const F32 dw = c.inout("dweight", d.dw_prior, Tol::exact());
    const F32 db = c.inout("dbias", d.db_prior, Tol::exact());
    c.run([&](const Backend& be, const Ptrs& p) {
      be.conv2d_backward(nullptr, p[dw], p[db], p[dy], p[x], p[w], s, p[scratch], accumulate);
    });
  }
}

}  // namespace

// Forward then backward in one scratch of the size the backend asks for (as a layer runs
// them), which neither may overrun.
void check_conv2d_scratch_size() {
  for (const Conv2dShape& s : kConvShapes) {
    const ConvData d(s);
    OpCase c(conv_label("conv2d_scratch_size: forward then backward in it", s));
    const F32 x = c.in(d.x), w = c.in(d.w), b = c.in(d.bias), dy = c.in(d.dy);
    const F32 out = c.out("out", n_out(s), conv_tol(Precision::fp32));
    const F32 dx = c.out("dinp", n_in(s), conv_tol(Precision::fp32));
    const F32 dw = c.out("dweight", n_w(s), conv_tol(Precision::fp32));
    const F32 db = c.out("dbias", size_t(s.OC), kBiasTol);
    const F32 scratch = conv_scratch(c, s);
    c.run([&](const Backend& be, const Ptrs& p) {
      be.conv2d_forward(p[out], p[x], p[w], p[b], s, p[scratch]);
      be.conv2d_backward(p[dx], p[dw], p[db], p[dy], p[x], p[w], s, p[scratch], false);
    });
  }
}

void check_conv2d_forward() {
  for (const Conv2dShape& s : kConvShapes) {
    const ConvData d(s);
    for (Precision prec : precisions(true))
      for (bool with_bias : {true, false}) {
        OpCase c(conv_label(with_bias ? "conv2d_forward" : "conv2d_forward nobias", s), prec);
        const F32 x = c.in(d.x), w = c.in(d.w), b = with_bias ? c.in(d.bias) : F32{};
        const F32 out = c.out("out", n_out(s), conv_tol(prec)), scratch = conv_scratch(c, s);
        c.run([&](const Backend& be, const Ptrs& p) {
          be.conv2d_forward(p[out], p[x], p[w], p[b], s, p[scratch]);
        });
      }
  }
}

// All three gradients; the parameter gradients accumulated without dinp; dinp alone (a frozen
// layer's input gradient).
void check_conv2d_backward() {
  const char* modes[] = {"conv2d_backward", "conv2d_backward accumulate, no dinp",
                         "conv2d_backward dinp only"};
  for (const Conv2dShape& s : kConvShapes) {
    const ConvData d(s);
    for (Precision prec : precisions(true))
      for (int mode : {0, 1, 2}) {
        OpCase c(conv_label(modes[mode], s), prec);
        const F32 dy = c.in(d.dy), x = c.in(d.x), w = c.in(d.w), scratch = conv_scratch(c, s);
        const F32 dx = mode != 1 ? c.out("dinp", n_in(s), conv_tol(prec)) : F32{};
        const F32 dw = mode != 2 ? c.inout("dweight", d.dw_prior, conv_tol(prec)) : F32{};
        const F32 db = mode != 2 ? c.inout("dbias", d.db_prior, kBiasTol) : F32{};
        c.run([&](const Backend& be, const Ptrs& p) {
          be.conv2d_backward(p[dx], p[dw], p[db], p[dy], p[x], p[w], s, p[scratch], mode == 1);
        });
      }
  }
  check_conv_empty_batch();
}

// ---- MaxPool2d ---------------------------------------------------------------------------

namespace {

struct PoolShape {
  int B, C, H, W, k, st;
  int OH() const { return (H - k) / st + 1; }
  int OW() const { return (W - k) / st + 1; }
  size_t n_in() const { return size_t(B) * C * H * W; }
  size_t n_out() const { return size_t(B) * C * OH() * OW(); }
};
const PoolShape kPoolShapes[] = {
    {2, 3, 8, 8, 2, 2},  // the common 2x2/2 (the CPU's SIMD path)
    {2, 3, 7, 9, 2, 2},  // odd sizes: a last row and column outside every window
    {2, 2, 9, 9, 3, 2},  // overlapping windows: backward adds up
    {1, 2, 6, 7, 3, 3},  // k = st = 3
    {0, 2, 4, 4, 2, 2},  // an empty batch
};

// Five levels only: many ties inside windows, so "first max wins" is exercised; with `nan`
// every 13th value is NaN (a NaN wins its window; of two, the later one).
std::vector<float> pool_inputs(const PoolShape& s, bool nan) {
  Rng rng(21);
  std::vector<float> x(s.n_in());
  for (auto& v : x) v = float(rng.below(5)) - 2.f;
  if (nan)
    for (size_t k = 0; k < x.size(); k += 13) x[k] = NAN;
  return x;
}

std::string pool_label(const char* op, const PoolShape& s, bool nan) {
  return fmt::format("{} {}x{}x{}x{} k{} s{}{}", op, s.B, s.C, s.H, s.W, s.k, s.st,
                     nan ? " nan" : "");
}

}  // namespace

void check_maxpool2d_forward() {
  for (const PoolShape& s : kPoolShapes)
    for (bool nan : {false, true}) {
      OpCase c(pool_label("maxpool2d_forward", s, nan));
      const F32 x = c.in(pool_inputs(s, nan)), out = c.out("out", s.n_out(), Tol::exact());
      const I32 argmax = c.out_i32("argmax", s.n_out());
      c.run([&](const Backend& be, const Ptrs& p) {
        be.maxpool2d_forward(p[out], p[argmax], p[x], s.B, s.C, s.H, s.W, s.k, s.st);
      });
    }
}

// From the reference's argmax, so a forward mismatch is not reported twice.
void check_maxpool2d_backward() {
  for (const PoolShape& s : kPoolShapes)
    for (bool nan : {false, true}) {
      const auto x = pool_inputs(s, nan);
      std::vector<float> y(s.n_out());
      std::vector<int32_t> am(s.n_out());
      reference().maxpool2d_forward(y.data(), am.data(), x.data(), s.B, s.C, s.H, s.W, s.k, s.st);
      OpCase c(pool_label("maxpool2d_backward", s, nan));
      const F32 dy = c.in(random_vector(22, s.n_out())), dx = c.out("dinp", s.n_in(), Tol::exact());
      const I32 argmax = c.in(am);
      c.run([&](const Backend& be, const Ptrs& p) {
        be.maxpool2d_backward(p[dx], p[dy], p[argmax], s.B, s.C, s.H, s.W, s.k, s.st);
      });
    }
}

// ---- Finite differences of the reference ---------------------------------------------------

namespace {

void fd_conv(const Conv2dShape& s, uint64_t seed) {
  const Backend& cpu = reference();
  Rng rng(seed);
  auto x = random_vector(rng.next(), n_in(s)), w = random_vector(rng.next(), n_w(s));
  auto bias = random_vector(rng.next(), size_t(s.OC));
  const auto r = random_vector(rng.next(), n_out(s));
  std::vector<float> scratch(size_t(cpu.conv2d_scratch_size(s)));
  auto loss = [&] {
    std::vector<float> y(n_out(s));
    cpu.conv2d_forward(y.data(), x.data(), w.data(), bias.data(), s, scratch.data());
    return dot(y, r);
  };
  auto dx = nan_vector(n_in(s)), dw = nan_vector(n_w(s)), db = nan_vector(size_t(s.OC));
  cpu.conv2d_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), s,
                      scratch.data(), false);
  const std::string tag = "fd " + conv_label("conv2d_backward", s) + ": ";
  check_grad(tag + "dinp", x, dx, loss, rng);
  check_grad(tag + "dweight", w, dw, loss, rng);
  check_grad(tag + "dbias", bias, db, loss, rng);
}

}  // namespace

void fd_conv2d_backward() {
  uint64_t seed = 10;
  for (int stride : {1, 2})
    for (int pad : {0, 1}) fd_conv({2, 3, 5, 7, 4, 3, 3, stride, pad}, seed++);
  fd_conv({3, 2, 6, 5, 3, 2, 3, 1, 1}, seed++);  // non-square kernel
  fd_conv({2, 2, 4, 4, 3, 1, 1, 2, 0}, seed++);  // 1x1, stride 2
  fd_conv({2, 3, 5, 6, 4, 1, 1, 1, 0}, seed++);  // 1x1, stride 1
  fd_conv({2, 1, 3, 4, 2, 3, 3, 2, 2}, seed++);  // pad 2: whole rows/columns of padding
  fd_conv({1, 4, 8, 8, 5, 3, 3, 3, 1}, seed++);  // stride 3, B = 1
  // Larger images: the CPU kernels switch from multi-sample chunks to per-sample GEMMs as the
  // image grows (kernels/cpu/conv.cpp, chunk_samples); these cover a partial last chunk
  // (P = 80, B = 3), per-sample chunks (P >= 110), and the "same"-padding fast path with pad 1
  // and 2.
  fd_conv({3, 2, 8, 10, 3, 3, 3, 1, 1}, seed++);
  fd_conv({2, 2, 11, 12, 3, 3, 3, 1, 1}, seed++);
  fd_conv({2, 2, 12, 13, 3, 3, 3, 1, 0}, seed++);
  fd_conv({2, 2, 21, 23, 3, 3, 3, 2, 1}, seed++);
  fd_conv({2, 1, 10, 11, 2, 5, 5, 1, 2}, seed++);
}

// Values 0.05 apart (distinct_vector): no max changes under the step.
void fd_maxpool2d_backward() {
  const Backend& cpu = reference();
  // 2x2/2 (the specialised path, with an uncovered row and column on 5x7), overlapping 3x3/2,
  // and tiled 3x3/3 with uncovered rows and columns.
  const PoolShape shapes[] = {{2, 3, 6, 6, 2, 2},
                              {2, 2, 5, 7, 2, 2},
                              {2, 2, 8, 21, 2, 2},
                              {1, 2, 7, 6, 3, 2},
                              {2, 2, 7, 8, 3, 3}};
  uint64_t seed = 3;
  for (const PoolShape& s : shapes) {
    auto x = distinct_vector(seed++, s.n_in());
    const auto r = random_vector(seed++, s.n_out());
    std::vector<float> y(s.n_out()), dx = nan_vector(s.n_in());
    std::vector<int32_t> am(s.n_out());
    cpu.maxpool2d_forward(y.data(), am.data(), x.data(), s.B, s.C, s.H, s.W, s.k, s.st);
    cpu.maxpool2d_backward(dx.data(), r.data(), am.data(), s.B, s.C, s.H, s.W, s.k, s.st);
    auto loss = [&] {
      std::vector<float> out(s.n_out());
      std::vector<int32_t> a(s.n_out());
      cpu.maxpool2d_forward(out.data(), a.data(), x.data(), s.B, s.C, s.H, s.W, s.k, s.st);
      return dot(out, r);
    };
    Rng rng(seed++);
    check_grad("fd " + pool_label("maxpool2d_backward", s, false) + ": dinp", x, dx, loss, rng);
  }
}

}  // namespace strata::optest
