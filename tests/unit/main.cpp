// The unit tests' main: Catch2's, with the exit code of tests/support/skip.h: 77 where every
// test case that ran skipped (ctest: Skipped), 1 where none ran.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "skip.h"

int main(int argc, char** argv) {
  Catch::Session session;
  const int rc = session.run(argc, argv);
  return strata::testing::exit_code(session.configData(), rc);
}
