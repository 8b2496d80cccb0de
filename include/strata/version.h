// The commit a binary was built from: provenance for --version, checkpoints and machine
// profiles, and the CUDA module's check that it belongs to this executable's build.
#pragma once

namespace strata {

// The source tree's git commit when this binary was built (12 hex digits, "-dirty" when
// tracked files differed from it, "unknown" outside git): generated at every build
// (cmake/version.cmake), not when CMake configured the build directory.
const char* git_commit();

}  // namespace strata
