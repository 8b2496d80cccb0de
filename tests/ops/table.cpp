// The op table as Catch2 tests: "<op>" [vs_cpu] runs on the backend under test (ctest:
// "cpu-staged:<op>", "cuda:<op>"); "<op> vs finite differences" [fd] checks the CPU reference
// alone (ctest: "ops:<op> vs finite differences"); [table] checks that the table covers the
// op list. The CPU kernels' own tests ([cpu_kernel], cpu_kernel.h; ctest "ops:<name>") are
// TEST_CASEs in the op's family file, on the shapes of its finite-difference check.
#include <algorithm>
#include <string>

#include "harness.h"
#include "table.h"

using namespace strata;
using namespace strata::optest;

#define STRATA_OP(name, ret, params)                            \
  TEST_CASE(#name, "[vs_cpu]") {                                \
    REQUIRE(select_target(Precision::fp32).supports(Op::name)); \
    check_##name();                                             \
  }
// A CPU-only op (int8 inference) has no device version, so no backend under test has it: its
// case is hidden ([.]: not in [vs_cpu], never a green case that checked nothing) and runs
// only when named, where it fails unless the backend has the op. int8.cpp checks the kernels.
#define STRATA_CPU_OP(name, ret, params)                        \
  TEST_CASE(#name, "[.][cpu_only]") {                           \
    REQUIRE(select_target(Precision::fp32).supports(Op::name)); \
    check_##name();                                             \
  }
#include "strata/ops.def"

#define STRATA_FD_TEST(name) \
  TEST_CASE(#name " vs finite differences", "[fd]") { fd_##name(); }
STRATA_FD_OPS(STRATA_FD_TEST)

TEST_CASE("every backward op of ops.def has a finite-difference check", "[table]") {
#define STRATA_FD_OP(name) Op::name,
  const Op checked[] = {STRATA_FD_OPS(STRATA_FD_OP)};
  int backward_ops = 0;
  for (int k = 0; k < kNumOps; ++k) {
    const std::string name = op_name(Op(k));
    const bool backward = name.ends_with("_backward");
    const bool has_fd =
        std::find(std::begin(checked), std::end(checked), Op(k)) != std::end(checked);
    backward_ops += backward;
    INFO(name << (backward ? " is a backward op without an fd_ check (table.h)"
                           : " is not a backward op, yet listed in STRATA_FD_OPS"));
    CHECK(backward == has_fd);
  }
  CHECK(backward_ops == int(std::size(checked)));
}
