// Helpers the unit tests share: a scratch directory, the UserError a call must throw, and a
// shell command's output.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "strata/error.h"

namespace strata::test {

// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           fmt::format("strata_unit_{}_{}", ::getpid(), counter++);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Runs f, which must throw UserError (kExitBadInput) with a one-line message; returns it.
inline std::string user_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    CHECK(e.code == kExitBadInput);
    std::string msg = e.what();
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  } catch (const std::exception& e) {
    FAIL("expected UserError, got: " << e.what());
  }
  FAIL("expected UserError, nothing was thrown");
  return "";
}

// A whole file's bytes.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The standard output of a shell command that must succeed, trailing blanks removed.
inline std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  REQUIRE(::pclose(p) == 0);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace strata::test
