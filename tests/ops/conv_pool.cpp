// conv2d (scratch size, forward, backward) and maxpool2d (forward, backward).
//
// Tolerances:
//  - conv fp32 1e-4: sums of C*KH*KW (forward, dinp) or B*OH*OW (dweight, up to 32768) fp32
//    products in other orders (elementwise up to 3.7e-5 on an H200 for a dweight of 32768
//    products). cuDNN's Winograd and FFT algorithms are refused in fp32 (kernels/cuda/conv.cu);
//    bench_cuda_ops checks the larger shapes norm-wise at 2e-5. 1e-4 still fails any indexing
//    error.
//  - conv bf16 1.5e-2: input, weight and dout rounded to bf16, fp32 accumulation, and the
//    result rounded to bf16 once more (cuDNN's legacy API writes y in the input type). A CPU
//    model of exactly that measured 3.2e-3..4.4e-3 on GEMMs of these sizes: ~3.5x margin.
//  - dbias 1e-5 in both precisions: an fp32 sum over B*OH*OW either way.
//  - An empty batch (B = 0) exact: parameter gradients zeroed, or kept when accumulating.
//  - maxpool exact (out, argmax, dinp): a max involves no rounding, and backward adds the same
//    values in the same order.
// The CPU kernels' own tests ([cpu_kernel], cpu_kernel.h) and the finite-difference checks run
// on one shape list per op: kCpuConvShapes, kCpuPoolShapes.
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "cpu_kernel.h"
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
// The CPU kernel's shapes: against direct convolution (with null and accumulated gradients)
// and by finite differences, seeds 10, 11, ... in this order. {B, C, H, W, OC, KH, KW, stride,
// pad}.
const Conv2dShape kCpuConvShapes[] = {
    {2, 3, 5, 7, 4, 3, 3, 1, 0}, {2, 3, 5, 7, 4, 3, 3, 1, 1},  // stride 1 and 2, pad 0 and 1
    {2, 3, 5, 7, 4, 3, 3, 2, 0}, {2, 3, 5, 7, 4, 3, 3, 2, 1},
    {3, 2, 6, 5, 3, 2, 3, 1, 1},  // non-square kernel
    {2, 2, 4, 4, 3, 1, 1, 2, 0},  // 1x1, stride 2
    {2, 3, 5, 6, 4, 1, 1, 1, 0},  // 1x1, stride 1
    {2, 1, 3, 4, 2, 3, 3, 2, 2},  // pad 2: whole rows/columns of padding
    {1, 4, 8, 8, 5, 3, 3, 3, 1},  // stride 3, B = 1
    // Larger images: the CPU kernels switch from multi-sample chunks to per-sample GEMMs as the
    // image grows (kernels/cpu/conv.cpp, chunk_samples); these cover a partial last chunk
    // (P = 80, B = 3), per-sample chunks (P >= 110), and the "same"-padding fast path with
    // pad 1 and 2.
    {3, 2, 8, 10, 3, 3, 3, 1, 1},
    {2, 2, 11, 12, 3, 3, 3, 1, 1},
    {2, 2, 12, 13, 3, 3, 3, 1, 0},
    {2, 2, 21, 23, 3, 3, 3, 2, 1},
    {2, 1, 10, 11, 2, 5, 5, 1, 2},
    // Few taps (CK <= 16, OC a multiple of 8: kernels/cpu/conv_few_taps.cpp on AVX-512; on a
    // CPU without it these run sgemm): the CNN's first layer (per-sample chunks, the bias
    // gradient fused); the same on 27 x 27 (a partial vector with the fused bias); P = 63 in
    // chunks of 3 samples (a partial vector); CK = 4, 12 (two gradient rows at once, the most)
    // and 13 (one row); CK = 16 with a partial vector per sample.
    {3, 1, 28, 28, 32, 3, 3, 1, 1},
    {2, 1, 27, 27, 16, 3, 3, 1, 1},
    {4, 1, 7, 9, 8, 3, 3, 1, 1},
    {2, 1, 6, 6, 8, 2, 2, 1, 0},
    {2, 3, 6, 5, 16, 2, 2, 1, 0},
    {2, 13, 5, 5, 8, 1, 1, 1, 0},
    {2, 1, 12, 12, 8, 4, 4, 1, 2},
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
    {1, 2, 4, 70, 2, 2},  // 35 windows a row: AVX-512's rounds of 16 and a masked end
    {1, 1, 3, 33, 2, 2},  // exactly 16 windows a row, an uncovered column and row
    {2, 2, 9, 9, 3, 2},  // overlapping windows: backward adds up
    {1, 2, 6, 7, 3, 3},  // k = st = 3
    {0, 2, 4, 4, 2, 2},  // an empty batch
};
// The CPU kernel's shapes: values and argmax against a plain window scan, and finite
// differences. 2x2/2 (the specialised path, with an uncovered row and column on 5x7),
// overlapping 3x3/2, and tiled 3x3/3 with uncovered rows and columns.
const PoolShape kCpuPoolShapes[] = {
    {2, 3, 6, 6, 2, 2}, {2, 2, 5, 7, 2, 2}, {2, 2, 8, 21, 2, 2}, {1, 2, 5, 69, 2, 2},
    {1, 2, 7, 6, 3, 2}, {2, 2, 7, 8, 3, 3}};

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
  for (const Conv2dShape& s : kCpuConvShapes) fd_conv(s, seed++);
}

// Values 0.05 apart (distinct_vector): no max changes under the step.
void fd_maxpool2d_backward() {
  const Backend& cpu = reference();
  uint64_t seed = 3;
  for (const PoolShape& s : kCpuPoolShapes) {
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

// ---- The CPU kernels ([cpu_kernel]) --------------------------------------------------------

namespace {

std::vector<double> ref_conv(const Vec& inp, const Vec& w, const Vec* bias, const Conv2dShape& s) {
  const int OH = s.OH(), OW = s.OW();
  std::vector<double> out(size_t(s.B) * s.OC * OH * OW);
  for (int b = 0; b < s.B; ++b)
    for (int oc = 0; oc < s.OC; ++oc)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          double acc = bias ? (*bias)[size_t(oc)] : 0.0;
          for (int c = 0; c < s.C; ++c)
            for (int kh = 0; kh < s.KH; ++kh)
              for (int kw = 0; kw < s.KW; ++kw) {
                const int ih = oh * s.stride + kh - s.pad, iw = ow * s.stride + kw - s.pad;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                acc += double(inp[((size_t(b) * s.C + c) * s.H + ih) * s.W + iw]) *
                       w[((size_t(oc) * s.C + c) * s.KH + kh) * s.KW + kw];
              }
          out[((size_t(b) * s.OC + oc) * OH + oh) * OW + ow] = acc;
        }
  return out;
}

void conv_case(const Conv2dShape& s, uint64_t seed) {
  Rng rng(seed);
  const int64_t n_in = int64_t(s.B) * s.C * s.H * s.W, n_w = int64_t(s.OC) * s.C * s.KH * s.KW;
  const int64_t n_out = int64_t(s.B) * s.OC * s.OH() * s.OW();
  Vec x = rand_vec(rng, n_in), w = rand_vec(rng, n_w), bias = rand_vec(rng, s.OC);
  const Vec r = rand_vec(rng, n_out);
  // Scratch full of NaN: reading anything the kernel did not write poisons the result.
  Vec scratch = nan_vec(cpu::conv2d_scratch_size(s));
  auto fresh_scratch = [&] { std::fill(scratch.begin(), scratch.end(), NAN); };
  INFO(conv_label("conv", s));

  Vec out = nan_vec(n_out);
  cpu::conv2d_forward(out.data(), x.data(), w.data(), bias.data(), s, scratch.data());
  // Outputs are sums of <= 37 terms in [-1,1]: the fp32 error is typically a few ulp of ~3,
  // ~1e-6; 3e-5 is a safe bound that a wrong index or missed term still exceeds by far.
  check_close("conv out", out, ref_conv(x, w, &bias, s), 3e-5);
  out = nan_vec(n_out);
  fresh_scratch();
  cpu::conv2d_forward(out.data(), x.data(), w.data(), nullptr, s, scratch.data());
  check_close("conv out (no bias)", out, ref_conv(x, w, nullptr, s), 3e-5);

  Vec dx = nan_vec(n_in), dw = nan_vec(n_w), db = nan_vec(s.OC);
  fresh_scratch();
  cpu::conv2d_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), s,
                       scratch.data(), false);

  // Each gradient alone gives the same values as all together.
  Vec dx2 = nan_vec(n_in), dw2 = nan_vec(n_w), db2 = nan_vec(s.OC);
  fresh_scratch();
  cpu::conv2d_backward(nullptr, dw2.data(), nullptr, r.data(), x.data(), w.data(), s,
                       scratch.data(), false);
  fresh_scratch();
  cpu::conv2d_backward(dx2.data(), nullptr, nullptr, r.data(), x.data(), w.data(), s,
                       scratch.data(), false);
  fresh_scratch();
  cpu::conv2d_backward(nullptr, nullptr, db2.data(), r.data(), x.data(), w.data(), s,
                       scratch.data(), false);
  CHECK(dx2 == dx);
  CHECK(dw2 == dw);
  CHECK(db2 == db);

  // accumulate adds the parameter gradients to what is there (micro-batches of a step).
  Vec dw3(size_t(n_w), 1.f), db3(size_t(s.OC), 1.f);
  fresh_scratch();
  cpu::conv2d_backward(nullptr, dw3.data(), db3.data(), r.data(), x.data(), w.data(), s,
                       scratch.data(), true);
  for (int64_t i = 0; i < n_w; ++i)
    CHECK(dw3[size_t(i)] == Approx(dw[size_t(i)] + 1.f).margin(1e-4));
  for (int o = 0; o < s.OC; ++o) CHECK(db3[size_t(o)] == Approx(db[size_t(o)] + 1.f).margin(1e-4));
}

// Values spaced 0.05 apart in random order: a max never changes under a +-1e-2 perturbation.
Vec distinct_vec(Rng& rng, int64_t n) {
  Vec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = 0.05f * float(i - n / 2);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(v[size_t(i)], v[size_t(rng.below(uint64_t(i) + 1))]);
  return v;
}

}  // namespace

// (The gradients' values, on these shapes: "conv2d_backward vs finite differences".)
TEST_CASE("conv2d forward matches direct convolution, "
          "and backward's null and accumulated gradients",
          "[cpu_kernel][conv]") {
  uint64_t seed = 10;
  for (const Conv2dShape& s : kCpuConvShapes) conv_case(s, seed++);
}

// 3x3 "same" convolutions (stride 1, pad 1) have their own im2col and col2im
// (kernels/cpu/conv_same3x3.cpp, AVX-512). They copy and add what the general ones do, in the
// same order, so they match the pad-0 convolution of the input zero-padded beforehand (which
// takes the general copies) bit for bit: output, weight and bias gradients, and the inside of
// the input gradient. Planes narrower than a vector, of two vectors, and chunks of several
// samples (small planes).
TEST_CASE("conv2d 3x3 same: bitwise the pad-0 convolution of the zero-padded input",
          "[cpu_kernel][conv]") {
  const Conv2dShape shapes[] = {{3, 4, 14, 14, 8, 3, 3, 1, 1},   // the CNN's conv2, smaller
                                {2, 1, 28, 28, 8, 3, 3, 1, 1},   // conv1's plane: 2 vectors
                                {5, 3, 5, 7, 4, 3, 3, 1, 1},     // 5 samples per chunk
                                {2, 2, 17, 16, 5, 3, 3, 1, 1}};  // W = 16: padded rows of 32
  Rng rng(31);
  for (const Conv2dShape& s : shapes) {
    Conv2dShape z = s;  // the same on the padded input, unpadded
    z.H += 2, z.W += 2, z.pad = 0;
    const Vec x = rand_vec(rng, n_in(s)), w = rand_vec(rng, n_w(s)), b = rand_vec(rng, s.OC),
              dy = rand_vec(rng, n_out(s));
    Vec xz(n_in(z), 0.f);
    for (int i = 0; i < s.B * s.C; ++i)
      for (int h = 0; h < s.H; ++h)
        std::copy_n(x.begin() + (int64_t(i) * s.H + h) * s.W, s.W,
                    xz.begin() + (int64_t(i) * z.H + h + 1) * z.W + 1);
    Vec y(n_out(s)), yz(n_out(z)), dx(n_in(s)), dxz(n_in(z)), dw(n_w(s)), dwz(n_w(z)),
        db(size_t(s.OC)), dbz(size_t(s.OC));
    Vec scratch(size_t(cpu::conv2d_scratch_size(s)));
    Vec scratch_z(size_t(cpu::conv2d_scratch_size(z)));
    cpu::conv2d_forward(y.data(), x.data(), w.data(), b.data(), s, scratch.data());
    cpu::conv2d_forward(yz.data(), xz.data(), w.data(), b.data(), z, scratch_z.data());
    cpu::conv2d_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), s,
                    scratch.data(), false);
    cpu::conv2d_backward(dxz.data(), dwz.data(), dbz.data(), dy.data(), xz.data(), w.data(), z,
                    scratch_z.data(), false);
    Vec inside(n_in(s));
    for (int i = 0; i < s.B * s.C; ++i)
      for (int h = 0; h < s.H; ++h)
        std::copy_n(dxz.begin() + (int64_t(i) * z.H + h + 1) * z.W + 1, s.W,
                    inside.begin() + (int64_t(i) * s.H + h) * s.W);
    INFO(conv_label("conv2d", s));
    CHECK(bitwise_equal(y, yz));
    CHECK(bitwise_equal(dw, dwz));
    CHECK(bitwise_equal(db, dbz));
    CHECK(bitwise_equal(dx, inside));
  }
}

// (Backward, on these shapes: "maxpool2d_backward vs finite differences".)
TEST_CASE("maxpool2d forward: values and argmax", "[cpu_kernel][pool]") {
  Rng rng(3);
  for (const PoolShape& c : kCpuPoolShapes) {
    INFO(pool_label("maxpool2d_forward", c, false));
    const int OH = c.OH(), OW = c.OW();
    Vec x = distinct_vec(rng, int64_t(c.n_in()));
    Vec out = nan_vec(int64_t(c.n_out()));
    std::vector<int32_t> am(c.n_out(), -1);
    cpu::maxpool2d_forward(out.data(), am.data(), x.data(), c.B, c.C, c.H, c.W, c.k, c.st);
    for (int64_t pl = 0; pl < int64_t(c.B) * c.C; ++pl)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          float best = -1e30f;
          for (int i = 0; i < c.k; ++i)
            for (int j = 0; j < c.k; ++j)
              best = std::max(
                  best, x[size_t(pl * c.H * c.W + (oh * c.st + i) * c.W + ow * c.st + j)]);
          const size_t o = size_t(pl * OH * OW + oh * OW + ow);
          CHECK(out[o] == best);
          CHECK(x[size_t(pl * c.H * c.W + am[o])] == best);
        }
  }
}

// The 2x2/2 path compares four windows at a time in SIMD lanes, pairwise; it must give the
// value and argmax of the sequential window scan, including its tie rule (first max wins) and
// NaN rule (a NaN wins), on rows long enough for the vector loops and their ends (SSE2: 4
// windows a round and a scalar tail; AVX-512: 16 a round, the end masked), an odd last column
// outside every window on the widest.
// Three planes: the first two take the whole-vector path (vectors that run past a row, into
// the next plane, in pool.cpp), the last the masked one; widths of the CNN's (28, 14) and others.
TEST_CASE("maxpool2d 2x2 matches a sequential scan with ties and NaN", "[cpu_kernel][pool]") {
  Rng rng(11);
  const int H = 6, OH = 3, C = 3;
  const int widths[] = {22, 40, 69, 28, 14};
  for (int trial = 0; trial < 30; ++trial) {
    const int W = widths[trial % 5], OW = W / 2, n_in = H * W, n_out = OH * OW;
    Vec x(size_t(C) * n_in);
    for (auto& v : x) {  // few distinct values: many ties; some NaN
      const uint64_t r = rng.below(10);
      v = r == 9 && trial % 2 ? NAN : float(r % 3);
    }
    Vec out(size_t(C) * n_out), dy(size_t(C) * n_out), dx(size_t(C) * n_in, NAN),
        want_dx(size_t(C) * n_in, 0.f);
    std::vector<int32_t> am(size_t(C) * n_out);
    cpu::maxpool2d_forward(out.data(), am.data(), x.data(), 1, C, H, W, 2, 2);
    for (int c = 0; c < C; ++c)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          const size_t at = size_t(c * n_out + oh * OW + ow);
          const float* xc = x.data() + c * n_in;
          int best_i = 2 * oh * W + 2 * ow;
          for (int o : {1, W, W + 1}) {
            const int i = 2 * oh * W + 2 * ow + o;
            if (xc[i] > xc[best_i] || xc[i] != xc[i]) best_i = i;
          }
          INFO("trial " << trial << " plane " << c << " window (" << oh << ", " << ow << ")");
          CHECK(am[at] == best_i);
          const float got = out[at], want = xc[best_i];
          CHECK((got == want || (got != got && want != want)));
          dy[at] = float(at + 1);
          want_dx[size_t(c * n_in + best_i)] = float(at + 1);
        }
    // Backward writes every input element (the gradient at its window's max, else 0).
    cpu::maxpool2d_backward(dx.data(), dy.data(), am.data(), 1, C, H, W, 2, 2);
    INFO("trial " << trial << " backward, W " << W);
    CHECK(dx == want_dx);
  }
}

TEST_CASE("maxpool2d ties and overlapping windows", "[cpu_kernel][pool]") {
  const Vec x = {1, 1, 1, 1};
  float out = 0;
  int32_t am = -1;
  cpu::maxpool2d_forward(&out, &am, x.data(), 1, 1, 2, 2, 2, 2);
  CHECK(am == 0);  // first maximum
  // k=2, st=1 on 3x3 with the max in the centre: all four windows pick it and backward adds.
  const Vec y = {0, 1, 0, 2, 9, 3, 0, 4, 0}, dy = {1, 2, 3, 4};
  Vec o(4), dx = nan_vec(9);
  std::vector<int32_t> a(4);
  cpu::maxpool2d_forward(o.data(), a.data(), y.data(), 1, 1, 3, 3, 2, 1);
  CHECK(o == Vec{9, 9, 9, 9});
  cpu::maxpool2d_backward(dx.data(), dy.data(), a.data(), 1, 1, 3, 3, 2, 1);
  CHECK(dx == Vec{0, 0, 0, 0, 10, 0, 0, 0, 0});
}

}  // namespace strata::optest
