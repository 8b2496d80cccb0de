// What the harnesses share: the input as a file (HDF5 reads files by name), and the rule that
// a UserError is the clean outcome for bad input while anything else is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "strata/error.h"

namespace strata::fuzz {

// The input written to a file in /dev/shm (memory), the same name every run of this process.
inline std::string as_file(const uint8_t* data, size_t size) {
  static const std::string path = "/dev/shm/strata-fuzz-" + std::to_string(::getpid()) + ".h5";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Runs f; a UserError (bad input, named) is expected. Any other exception escapes and libFuzzer
// reports it as a crash, as it does a sanitizer report.
template <typename F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const UserError&) {
  }
}

}  // namespace strata::fuzz
