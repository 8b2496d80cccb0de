// strata_cuda_tests' main: Catch2 as usual when listing tests (catch_discover_tests does so at
// build time, GPU or not); otherwise, without a visible GPU, one line and exit code 77, which
// the tests' SKIP_RETURN_CODE turns into "Skipped" in ctest.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "strata/kernels_cuda.h"

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& cfg = session.configData();
  const bool listing = cfg.listTests || cfg.listTestNamesOnly || cfg.listTags ||
                       cfg.listReporters || cfg.showHelp || cfg.libIdentify;
  if (!listing) {
    std::string why;
    if (strata::cuda::device_count(&why) == 0) {
      std::printf("skipped: no GPU visible (%s)\n", why.c_str());
      return 77;
    }
  }
  return session.run();
}
