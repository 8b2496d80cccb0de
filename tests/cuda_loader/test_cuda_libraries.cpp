// How strata finds the CUDA libraries (src/cuda_loader): the search order of the README's
// "Installing on a cluster", on a fake tree of directories and empty files made here (nothing
// is loaded: locating only looks at files), and the ELF reader that tells which libraries.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backends/cuda_loader/cuda_libraries.h"
#include "backends/cuda_loader/elf_needed.h"
#include "strata/error.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

// A fresh directory under the system's temporary directory, removed at the end.
struct TempTree {
  fs::path root;
  TempTree() {
    std::string t = (fs::temp_directory_path() / "strata-cuda-libs-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()));
    root = t;
  }
  ~TempTree() { fs::remove_all(root); }
  fs::path dir(const std::string& rel) const {
    fs::create_directories(root / rel);
    return root / rel;
  }
  fs::path file(const std::string& rel, bool executable = false) const {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << "";
    if (executable) ::chmod((root / rel).c_str(), 0755);
    return root / rel;
  }
};

// Only the variables the search reads, set as given (the rest unset).
void environment(std::vector<std::pair<const char*, std::string>> vars) {
  for (const char* v : {"STRATA_CUDA_LIBS", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH",
                        "VIRTUAL_ENV", "CONDA_PREFIX", "PATH", "HOME"})
    ::unsetenv(v);
  for (const auto& [name, value] : vars) ::setenv(name, value.c_str(), 1);
}

std::vector<std::string> sources_of(const std::vector<SearchDir>& dirs, const fs::path& under) {
  std::vector<std::string> out;
  for (const auto& d : dirs)
    if (d.dir.rfind(under.string(), 0) == 0) out.push_back(d.dir.substr(under.string().size()) + " " + d.source);
  return out;
}

}  // namespace

TEST_CASE("cuda libraries: the search order: LD_LIBRARY_PATH, CUDA_HOME, wheels of VIRTUAL_ENV, CONDA_PREFIX, python3 on PATH, ~/.local") {
  TempTree t;
  t.dir("ld");
  t.dir("cuda/lib64");
  t.dir("cuda/targets/x86_64-linux/lib");
  t.dir("venv/lib/python3.12/site-packages/nvidia/nccl/lib");
  t.dir("venv/lib/python3.12/site-packages/nvidia/cu13/lib");
  t.dir("venv/lib/python3.12/site-packages/nvidia/cudnn/lib");
  t.dir("conda/lib");
  t.file("py/bin/python3", true);
  t.dir("py/lib/python3.11/site-packages/nvidia/cublas/lib");
  t.dir("home/.local/lib/python3.12/site-packages/nvidia/cuda_runtime/lib");
  environment({{"LD_LIBRARY_PATH", (t.root / "ld").string() + "::" + (t.root / "absent").string()},
               {"CUDA_HOME", (t.root / "cuda").string()},
               {"VIRTUAL_ENV", (t.root / "venv").string()},
               {"CONDA_PREFIX", (t.root / "conda").string()},
               {"PATH", (t.root / "nobin").string() + ":" + (t.root / "py/bin").string()},
               {"HOME", (t.root / "home").string()}});
  const auto dirs = cuda_search_dirs();
  const std::vector<std::string> want = {
      "/ld LD_LIBRARY_PATH",
      "/cuda/lib64 CUDA_HOME",
      "/cuda/targets/x86_64-linux/lib CUDA_HOME",
      "/venv/lib/python3.12/site-packages/nvidia/cu13/lib VIRTUAL_ENV",  // wheels sorted by name
      "/venv/lib/python3.12/site-packages/nvidia/cudnn/lib VIRTUAL_ENV",
      "/venv/lib/python3.12/site-packages/nvidia/nccl/lib VIRTUAL_ENV",
      "/conda/lib CONDA_PREFIX",
      "/py/lib/python3.11/site-packages/nvidia/cublas/lib python3 on PATH",
      "/home/.local/lib/python3.12/site-packages/nvidia/cuda_runtime/lib ~/.local"};
  CHECK(sources_of(dirs, t.root) == want);
  // After them, the loader's default directories, then /usr/local/cuda.
  REQUIRE(dirs.size() > want.size());
  CHECK(dirs[want.size()].source == "the loader's default path");
}

TEST_CASE("cuda libraries: STRATA_CUDA_LIBS replaces the search, and an entry that is no directory is an error naming it") {
  TempTree t;
  t.dir("a");
  t.dir("b");
  t.dir("ld");
  environment({{"STRATA_CUDA_LIBS", (t.root / "a").string() + ":" + (t.root / "b").string()},
               {"LD_LIBRARY_PATH", (t.root / "ld").string()}});
  const auto dirs = cuda_search_dirs();
  REQUIRE(dirs.size() == 2);
  CHECK(dirs[0].dir == (t.root / "a").string());
  CHECK(dirs[1].dir == (t.root / "b").string());
  CHECK(dirs[1].source == "STRATA_CUDA_LIBS");
  CHECK(describe_search(dirs) ==
        "STRATA_CUDA_LIBS=" + (t.root / "a").string() + ":" + (t.root / "b").string() + " (2 dirs)");

  environment({{"STRATA_CUDA_LIBS", (t.root / "a").string() + ":" + (t.root / "nope").string()}});
  try {
    cuda_search_dirs();
    FAIL("no error for a STRATA_CUDA_LIBS entry that does not exist");
  } catch (const UserError& e) {
    CHECK(e.code == kExitBadInput);
    CHECK(std::string(e.what()).find("STRATA_CUDA_LIBS=") == 0);
    CHECK(std::string(e.what()).find("'" + (t.root / "nope").string() + "' is not a directory") !=
          std::string::npos);
  }
}

TEST_CASE("cuda libraries: each from the first directory that has it, the missing named, cuDNN sub-libraries beside it") {
  TempTree t;
  t.file("first/libcudart.so.13");
  t.file("second/libcudart.so.13");
  t.file("second/libcudnn.so.9");
  t.file("second/libcudnn_ops.so.9");
  t.file("second/libcudnn_graph.so.9");
  t.file("second/libcudnn_adv.so.8");  // another version: not this cuDNN's
  t.dir("second/libnccl.so.2");        // a directory is no library
  const std::vector<SearchDir> dirs = {{(t.root / "first").string(), "LD_LIBRARY_PATH"},
                                       {(t.root / "second").string(), "VIRTUAL_ENV"}};
  std::vector<std::string> missing;
  const auto found = locate_libraries({"libcudart.so.13", "libcudnn.so.9", "libnccl.so.2"}, dirs, &missing);
  REQUIRE(found.size() == 2);
  CHECK(found[0].path == (t.root / "first/libcudart.so.13").string());
  CHECK(found[0].source == "LD_LIBRARY_PATH");
  CHECK(found[1].path == (t.root / "second/libcudnn.so.9").string());
  CHECK(found[1].source == "VIRTUAL_ENV");
  CHECK(missing == std::vector<std::string>{"libnccl.so.2"});
  const auto subs = cudnn_sublibraries(found[1]);
  REQUIRE(subs.size() == 2);
  CHECK(subs[0].soname == "libcudnn_graph.so.9");  // dependencies first
  CHECK(subs[1].soname == "libcudnn_ops.so.9");
}

TEST_CASE("cuda libraries: DT_NEEDED read from the file, and a file that is no ELF object refused") {
  std::string why;
  const auto needed = elf_needed("/proc/self/exe", &why);
  CHECK(why.empty());
  CHECK(std::find(needed.begin(), needed.end(), "libc.so.6") != needed.end());
  TempTree t;
  std::ofstream(t.root / "text.so") << "not an ELF file at all, but long enough to hold a header "
                                       "of sixty-four bytes, which it is not";
  const auto none = elf_needed((t.root / "text.so").string(), &why);
  CHECK(none.empty());
  CHECK(why.find("text.so: not a readable ELF64 shared object") != std::string::npos);
}
