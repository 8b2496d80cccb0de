// Skipping a Catch2 test case that cannot run here (Catch2 2.13 has no SKIP). STRATA_SKIP(reason)
// prints "SKIPPED: <reason>" on stdout and returns from the test case; `reason` is streamed, as
// INFO's is ("no bf16: " << why). A run whose every test case skipped, with no failure, exits 77
// (exit_code, called by main), which the tests' SKIP_RETURN_CODE makes ctest report as Skipped,
// by name (ctest runs one test case per process); tests/skip_reasons.py prints the reason. A
// failure anywhere in the run is a failure, never hidden by a skip.
//
// Use it at the top of a TEST_CASE body, before any check: in a helper function its `return`
// would leave the helper, not the test case.
//
// And a run in which no test case ran at all fails: Catch2 exits 0 when its command line
// matches no test, so a ctest test whose name does not select its case (catch_discover_tests
// splits a name at ';') would pass without running anything.
#pragma once
#include <sstream>
#include <string>

namespace Catch {
struct ConfigData;
}

namespace strata::testing {

// Prints "SKIPPED: <reason>" and marks the current test case skipped (STRATA_SKIP calls it).
void note_skip(const std::string& reason);
// main's exit code from Catch's result `rc` of session.run() with session.configData() `cfg`:
// 77 where every test case that ran skipped and none failed; 1 where no test case ran (listing
// aside); a failure count of exactly 77 becomes 78, so it is never taken for a skip.
int exit_code(const Catch::ConfigData& cfg, int rc);

}  // namespace strata::testing

#define STRATA_SKIP(reason)                                  \
  do {                                                       \
    std::ostringstream strata_skip_reason_;                  \
    strata_skip_reason_ << reason;                           \
    ::strata::testing::note_skip(strata_skip_reason_.str()); \
    return;                                                  \
  } while (false)
