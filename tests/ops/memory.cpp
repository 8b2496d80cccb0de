// The backend's memory functions, which every case of the table relies on: allocations are
// zero-filled, upload/copy/download round trips are exact, zero clears, and zero bytes are a
// no-op whatever the pointers. Sizes: one float, 1000, and 2^20 + 3 (4 MiB and a tail).
#include <fmt/format.h>

#include "backends/cuda_api.h"
#include "harness.h"

using namespace strata;
using namespace strata::optest;

namespace {

std::vector<float> download(const Backend& be, const void* p, size_t n) {
  std::vector<float> host(n);
  be.download(host.data(), p, n * sizeof(float));
  return host;
}

}  // namespace

TEST_CASE("backend memory: alloc, upload, copy, zero, download", "[vs_cpu]") {
  const Backend& be = select_target(Precision::fp32);
  for (size_t n : {size_t(1), size_t(1000), (size_t(1) << 20) + 3}) {
    INFO(be.name << ", " << n << " floats");
    const size_t bytes = n * sizeof(float);
    const auto host = random_vector(31, n);
    void* a = be.memory->alloc(bytes);
    void* b = be.memory->alloc(bytes);
    CHECK(download(be, b, n) == std::vector<float>(n, 0.f));
    be.upload(a, host.data(), bytes);
    be.copy(b, a, bytes);
    CHECK(download(be, a, n) == host);
    CHECK(download(be, b, n) == host);
    be.memory->zero(b, bytes);
    CHECK(download(be, b, n) == std::vector<float>(n, 0.f));
    be.memory->zero(a, 0);
    CHECK(download(be, a, n) == host);
    be.synchronize();
    be.memory->release(a);
    be.memory->release(b);
  }
  be.upload(nullptr, nullptr, 0);
  be.download(nullptr, nullptr, 0);
  be.copy(nullptr, nullptr, 0);
  be.memory->zero(nullptr, 0);
  be.memory->release(nullptr);
  be.synchronize();
  if (device() == "cuda") CHECK(!cuda_device_name().empty());
}
