// The backend seam: the op list (strata/ops.def), Backend::supports, and a model's check that
// the backend has every op its layers call.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>

#include "model/model.h"
#include "strata/backend.h"
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
