// Memory round trips and the elementwise ops (relu, gelu, dropout, add_inplace,
// scale_inplace), CUDA against the CPU. These do not depend on the GEMM precision, so they
// run in fp32 mode only.
//
// Tolerances: exact wherever both sides perform the same single IEEE operation per element
// (relu, dropout's mask and product, add, scale; memory copies). gelu 5e-6 norm-wise: CUDA's
// erff/expf are within 2 ulp of the true value, glibc's within 1, plus nvcc's FMA contraction
// of cdf + x*pdf: a few ulp of the largest value, ~1e-6 at most.
#include "cuda_test_util.h"

using namespace strata;
using namespace strata::cuda_test;

TEST_CASE("memory round trips (upload copy zero download)", "[memory]") {
  use_precision(false);
  for (size_t n : {size_t(1), size_t(1000), (size_t(1) << 20) + 3}) {
    CAPTURE(n);
    const auto host = random_vector(31, n);
    DeviceBuffer<float> a(n), b(n);
    cuda::upload(a.get(), host.data(), sizeof(float) * n);
    cuda::copy(b.get(), a.get(), sizeof(float) * n);
    check_equal("upload + download n=" + std::to_string(n), false, a.download(), host);
    check_equal("copy n=" + std::to_string(n), false, b.download(), host);
    cuda::zero(b.get(), sizeof(float) * n);
    check_equal("zero n=" + std::to_string(n), false, b.download(), std::vector<float>(n, 0.f));
    cuda::synchronize();
  }
  // Zero bytes are a no-op, whatever the pointers.
  cuda::upload(nullptr, nullptr, 0);
  cuda::download(nullptr, nullptr, 0);
  cuda::copy(nullptr, nullptr, 0);
  cuda::zero(nullptr, 0);
  cuda::release(nullptr);
  CHECK(cuda::initialized());
  CHECK(cuda::current_device() == 0);
  CHECK(!cuda::device_name().empty());
  CHECK(cuda::stream() != nullptr);
}

TEST_CASE("relu and gelu forward/backward match the CPU", "[activation]") {
  use_precision(false);
  const size_t n = 100003;
  auto x = random_vector(41, n, -5.f, 5.f);
  x[0] = 0.f;
  x[1] = -0.f;
  x[2] = NAN;  // relu keeps NaN (x < 0 is false)
  const auto dy = random_vector(42, n);
  std::vector<float> ref(n), ref_d(n);
  DeviceBuffer<float> dx_(x), ddy(dy), dout(n), dgrad(n);

  cpu::relu_forward(ref.data(), x.data(), n);
  cuda::relu_forward(dout.get(), dx_.get(), n);
  check_equal("relu_forward", false, dout.download(), ref);
  cpu::relu_backward(ref_d.data(), dy.data(), ref.data(), n);
  DeviceBuffer<float> dref(ref);
  cuda::relu_backward(dgrad.get(), ddy.get(), dref.get(), n);
  check_equal("relu_backward", false, dgrad.download(), ref_d);
  // In place.
  cuda::relu_forward(dx_.get(), dx_.get(), n);
  check_equal("relu_forward in place", false, dx_.download(), ref);

  x[2] = 0.5f;  // gelu of NaN is NaN on both sides; keep the error figure about numbers
  dx_.upload(x);
  cpu::gelu_forward(ref.data(), x.data(), n);
  cuda::gelu_forward(dout.get(), dx_.get(), n);
  check_close("gelu_forward", false, dout.download(), ref, 5e-6);
  cpu::gelu_backward(ref_d.data(), dy.data(), x.data(), n);
  cuda::gelu_backward(dgrad.get(), ddy.get(), dx_.get(), n);
  check_close("gelu_backward", false, dgrad.download(), ref_d, 5e-6);
}

TEST_CASE("dropout mask and output are bit for bit the CPU's", "[dropout]") {
  use_precision(false);
  const int B = 5;
  const int64_t per_sample = 1001;
  const size_t n = size_t(B) * per_sample;
  const auto x = random_vector(51, n), dy = random_vector(52, n);
  for (float p : {0.f, 0.1f, 0.5f, 1.f}) {
    CAPTURE(p);
    const uint64_t seed = 42, step = 7;
    const int64_t first_sample = 13;
    std::vector<float> ref_y(n), ref_mask(n), ref_dx(n);
    cpu::dropout_forward(ref_y.data(), ref_mask.data(), x.data(), B, per_sample, p, seed, step,
                         first_sample);
    cpu::dropout_backward(ref_dx.data(), dy.data(), ref_mask.data(), int64_t(n));
    DeviceBuffer<float> dx_(x), ddy(dy), dout(n), dmask(n), dgrad(n);
    cuda::dropout_forward(dout.get(), dmask.get(), dx_.get(), B, per_sample, p, seed, step,
                          first_sample);
    const std::string tag = "dropout p=" + std::to_string(p).substr(0, 3);
    check_equal(tag + " mask", false, dmask.download(), ref_mask);
    check_equal(tag + " out", false, dout.download(), ref_y);
    cuda::dropout_backward(dgrad.get(), ddy.get(), dmask.get(), int64_t(n));
    check_equal(tag + " backward", false, dgrad.download(), ref_dx);
    // In place (out == inp), as the layer may run it.
    cuda::dropout_forward(dx_.get(), dmask.get(), dx_.get(), B, per_sample, p, seed, step,
                          first_sample);
    check_equal(tag + " out in place", false, dx_.download(), ref_y);
    if (p == 0.5f) {
      // The same global sample on another "rank" (a later slice of the batch) gets the same
      // mask row: rows 2..4 from first_sample 15.
      DeviceBuffer<float> dx2(std::vector<float>(x.begin() + 2 * per_sample, x.end()));
      DeviceBuffer<float> dout2(n - 2 * per_sample), dmask2(n - 2 * per_sample);
      cuda::dropout_forward(dout2.get(), dmask2.get(), dx2.get(), B - 2, per_sample, p, seed,
                            step, first_sample + 2);
      check_equal(tag + " mask of a batch slice", false, dmask2.download(),
                  std::vector<float>(ref_mask.begin() + 2 * per_sample, ref_mask.end()));
    }
  }
}

TEST_CASE("add_inplace and scale_inplace match the CPU", "[elementwise]") {
  use_precision(false);
  const size_t n = 77777;
  const auto a = random_vector(61, n), b = random_vector(62, n);
  std::vector<float> ref = a;
  for (size_t i = 0; i < n; ++i) ref[i] += b[i];
  DeviceBuffer<float> da(a), db(b);
  cuda::add_inplace(da.get(), db.get(), int64_t(n));
  check_equal("add_inplace", false, da.download(), ref);

  std::vector<float> ref_s = a;
  cpu::scale_inplace(ref_s.data(), int64_t(n), 0.37f);
  DeviceBuffer<float> ds(a);
  cuda::scale_inplace(ds.get(), int64_t(n), 0.37f);
  check_equal("scale_inplace", false, ds.download(), ref_s);
}
