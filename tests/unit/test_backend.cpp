// The backend seam: the op list (strata/ops.def), Backend::supports, the providers behind
// select_backend, a backend's precision as a field, and a model's check that the backend has
// every op its layers call.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>

#include "backends/provider.h"
#include "model/model.h"
#include "strata/backend.h"
#include "strata/error.h"
#include "strata/kernels_cpu.h"
#include "strata/tensor.h"

using namespace strata;

TEST_CASE("the CPU backend has every op of the list, each with its own name", "[backend]") {
  std::set<std::string> names;
  for (int i = 0; i < kNumOps; ++i) {
    CHECK(cpu_backend().supports(Op(i)));
    names.insert(op_name(Op(i)));
  }
  CHECK(int(names.size()) == kNumOps);
  CHECK(std::string(op_name(Op::linear_forward)) == "linear_forward");
}

// The providers of this build (provider.h), in --device auto's order: the GPU first, the CPU
// always available; test-only ones (cpu-staged) accepted by name but not advertised.
TEST_CASE("select_backend: providers by name, auto's order, unknown devices listed", "[backend]") {
  std::vector<std::string> names;
  for (const BackendProvider* p : backend_providers()) names.push_back(p->name);
  CHECK(names == std::vector<std::string>{"cuda", "cpu", "cpu-staged"});
  std::string why;
  CHECK(&select_backend({.device = "cpu"}, &why) == &cpu_backend());
  CHECK(why.rfind("cpu (1 thread, ", 0) == 0);
  CHECK(&provider_of(cpu_backend()) == backend_providers()[1]);
  CHECK(provider_of(cpu_backend()).transport == nullptr);  // host memory: plain MPI
  const Backend& staged = select_backend({.device = "cpu-staged"}, nullptr);
  CHECK(std::string(staged.name) == "cpu-staged");
  CHECK(provider_of(staged).transport != nullptr);
  CHECK_THROWS_WITH(select_backend({.device = "tpu"}, nullptr),
                    "--device tpu: expected auto, cuda or cpu");
  CHECK_THROWS_WITH(select_backend({.device = "cpu", .precision = "fp16"}, nullptr),
                    "train.precision = \"fp16\": expected \"fp32\" or \"bf16\"");
  // auto on a node without a GPU (CI) takes the CPU and says why the GPU was passed over.
  std::string no_gpu;
  if (backend_providers()[0]->available(&no_gpu)) return;  // a GPU node: auto takes the GPU
  const Backend& be = select_backend({.device = "auto"}, &why);
  CHECK(&be == &cpu_backend());
  CHECK(why.find("; no GPU: " + no_gpu) != std::string::npos);
}

// A table says its precision, and a bf16 table differs from its fp32 one exactly in the
// precision ops (ops.h's STRATA_PRECISION_OPS, and on the CPU STRATA_CPU_PRECISION_OPS).
TEST_CASE("a backend's precision is a field, and bf16 tables replace the precision ops only",
          "[backend]") {
  std::set<std::string> precision_ops;
#define STRATA_NAME(name) precision_ops.insert(#name);
  STRATA_PRECISION_OPS(STRATA_NAME)
#undef STRATA_NAME
  for (const char* device : {"cpu", "cpu-staged"}) {
    INFO(device);
    const Backend& fp32 = select_backend({.device = device}, nullptr);
    CHECK(fp32.precision == Precision::fp32);
    CHECK(fp32.processor == Processor::cpu);  // cpu-staged: the CPU runs its ops
    std::string no_bf16;
    if (!cpu::bf16_supported(&no_bf16)) {
      CHECK_THROWS_AS(select_backend({.device = device, .precision = "bf16"}, nullptr), UserError);
      continue;
    }
    const Backend& b16 = select_backend({.device = device, .precision = "bf16"}, nullptr);
    CHECK(b16.precision == Precision::bf16);
    CHECK(std::string(precision_name(b16.precision)) == "bf16");
    std::set<std::string> differ;
#define STRATA_OP(name, ret, params) \
  if (fp32.name != b16.name) differ.insert(#name);
#include "strata/ops.def"
    // The CPU's table also has the CPU-only ones; cpu-staged, like a device, has none of them.
    std::set<std::string> expected = precision_ops;
#define STRATA_NAME(name) \
  if (std::string(device) == "cpu") expected.insert(#name);
    STRATA_CPU_PRECISION_OPS(STRATA_NAME)
#undef STRATA_NAME
    CHECK(differ == expected);
  }
}

TEST_CASE("a model refuses a backend that lacks an op one of its layers calls", "[backend]") {
  Backend partial = cpu_backend();
  partial.name = "partial";
  partial.gelu_backward = nullptr;
  CHECK_FALSE(partial.supports(Op::gelu_backward));
  CHECK(partial.supports(Op::gelu_forward));
  Model gelu_mlp({"flatten", "linear 8", "gelu", "linear 10"}, {1, 4, 4}, 10);
  CHECK_NOTHROW(gelu_mlp.check_backend(cpu_backend()));
  CHECK_THROWS_WITH(gelu_mlp.check_backend(partial),
                    Catch::Contains("gelu1 (GELU) needs the op gelu_backward") &&
                        Catch::Contains("the partial backend"));
  Model relu_mlp({"flatten", "linear 8", "relu", "linear 10"}, {1, 4, 4}, 10);
  CHECK_NOTHROW(relu_mlp.check_backend(partial));  // calls no GELU
}

// cpu-staged's device memory cannot be touched by host code: a read crashes at once, and the
// crash names the caller (the stack is printed); ops given host memory are refused by name;
// deferred ops run only when waited for.
// External linkage: the crash stack can name only exported functions.
[[gnu::noinline]] float staged_host_read_for_test(const float* device);
[[gnu::noinline]] float staged_host_read_for_test(const float* device) {
  return *static_cast<const volatile float*>(device);
}

TEST_CASE("cpu-staged: host code touching device memory crashes naming the caller", "[backend]") {
  DeviceRequest req;
  req.device = "cpu-staged";
  const Backend& be = select_backend(req, nullptr);
  Tensor d({16}, *be.memory);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::dup2(fds[1], 2);
    volatile float v = staged_host_read_for_test(d.data());
    (void)v;
    ::_exit(0);  // not reached: the read faults
  }
  ::close(fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  INFO(err);
  CHECK(WIFSIGNALED(status));
  CHECK(err.find("cpu-staged: crashed") != std::string::npos);
  CHECK(err.find("staged_host_read_for_test") != std::string::npos);
}

TEST_CASE("cpu-staged: ops refuse host memory, deferred ops run when waited for", "[backend]") {
  DeviceRequest req;
  req.device = "cpu-staged";
  const Backend& be = select_backend(req, nullptr);
  Tensor host({8}), dev({8}, *be.memory);
  CHECK_THROWS_WITH(be.relu_forward(dev.data(), host.data(), 8),
                    Catch::Contains("relu_forward was given host memory"));
  CHECK_THROWS_WITH(be.upload(host.data(), dev.data(), 4), Catch::Contains("upload"));
  std::vector<float> x = {-1, 2, -3, 4, -5, 6, -7, 8}, y(8, 0.f);
  be.upload(dev.data(), x.data(), sizeof(float) * 8);
  be.relu_forward(dev.data(), dev.data(), 8);
  x.assign(8, 100.f);  // the upload took its copy: the source may be reused at once
  be.download(y.data(), dev.data(), sizeof(float) * 8);
  CHECK(y == std::vector<float>{0, 2, 0, 4, 0, 6, 0, 8});
  CHECK(cpu_backend().supports(Op::linear_int8_forward));
  CHECK_FALSE(be.supports(Op::linear_int8_forward));  // as on a GPU: int8 files are refused
}
