// strata_op_tests' main: Catch2 with --backend cpu-staged|cuda|cpu, the backend under test (the
// reference is always the CPU; cpu runs the CPU-only ops' cases, against fp32). Listing tests
// needs no GPU (catch_discover_tests lists them at build time); running on cuda where none is
// visible prints one line ("skipped: <why>") and returns 77, which the tests' SKIP_RETURN_CODE
// turns into "Skipped", test by test. A case that cannot run here says so with STRATA_SKIP
// (tests/support/skip.h): 77 too, where every case that ran skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "backends/cuda_api.h"
#include "harness.h"
#include "skip.h"
#include "strata/backend.h"

int main(int argc, char** argv) {
  Catch::Session session;
  std::string backend = "cpu-staged";
  using Catch::clara::Opt;
  session.cli(session.cli() | Opt(backend, "cpu-staged|cuda|cpu")["--backend"](
                                  "the backend under test (default cpu-staged; cpu: the "
                                  "CPU-only ops' hidden cases, [cpu_only])"));
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& cfg = session.configData();
  const bool listing = cfg.listTests || cfg.listTestNamesOnly || cfg.listTags ||
                       cfg.listReporters || cfg.showHelp || cfg.libIdentify;
  if (backend != "cpu-staged" && backend != "cuda" && backend != "cpu") {
    std::fprintf(stderr, "--backend %s: expected cpu-staged, cuda or cpu\n", backend.c_str());
    return 2;
  }
  if (!listing && backend == "cuda") {
    std::string why;
    if (strata::cuda_devices(&why) == 0) {
      std::printf("skipped: %s\n", why.c_str());
      return 77;
    }
  }
  strata::optest::set_device(backend);
  const int rc = session.run();
  const auto& t = strata::optest::tally();
  if (t.cases > 0)
    std::printf("op table on %s: %d cases (op, shape, variant), %d outputs compared\n",
                backend.c_str(), t.cases, t.comparisons);
  return strata::testing::exit_code(cfg, rc);
}
