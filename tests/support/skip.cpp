// STRATA_SKIP's bookkeeping (skip.h): which test cases ran (a Catch2 listener) and which of them
// skipped.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include "skip.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <set>

namespace strata::testing {
namespace {

constexpr int kSkipped = 77;  // the tests' SKIP_RETURN_CODE

std::set<std::string>& ran() {
  static std::set<std::string> names;
  return names;
}
std::set<std::string>& skipped() {
  static std::set<std::string> names;
  return names;
}

struct RanListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    TestEventListenerBase::testCaseStarting(info);
    ran().insert(info.name);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(RanListener)

void note_skip(const std::string& reason) {
  skipped().insert(Catch::getResultCapture().getCurrentTestName());
  std::printf("SKIPPED: %s\n", reason.c_str());
  std::fflush(stdout);
}

int exit_code(const Catch::ConfigData& cfg, int rc) {
  if (rc != 0) return rc == kSkipped ? kSkipped + 1 : rc;
  if (cfg.listTests || cfg.listTestNamesOnly || cfg.listTags || cfg.listReporters ||
      cfg.showHelp || cfg.libIdentify)
    return 0;
  if (ran().empty()) {
    std::printf("no test case matches the command line: nothing ran\n");
    return 1;
  }
  return ran() == skipped() ? kSkipped : 0;
}

}  // namespace strata::testing
