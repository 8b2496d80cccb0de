// The backend seam: the op list (strata/ops.def), Backend::supports, and a model's check that
// the backend has every op its layers call.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "strata/backend.h"
#include "strata/model.h"

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
