#include "cuda_libraries.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "strata/error.h"

namespace fs = std::filesystem;

namespace strata {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<std::string> split_path(const std::string& s) {
  std::vector<std::string> parts;
  for (size_t a = 0, b; a <= s.size(); a = b + 1) {
    b = s.find(':', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) parts.push_back(s.substr(a, b - a));
  }
  return parts;
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// Entries of `dir` (names only), sorted, so that the search order never depends on the
// file system's.
std::vector<std::string> list_dir(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct Dirs {
  std::vector<SearchDir> list;
  void add(const fs::path& dir, const std::string& source) {
    if (dir.empty() || !is_dir(dir)) return;
    const std::string d = dir.lexically_normal().string();
    for (const auto& s : list)
      if (s.dir == d) return;
    list.push_back({d, source});
  }
  // A CUDA installation's library directories.
  void add_toolkit(const fs::path& root, const std::string& source) {
    for (const char* sub : {"lib64", "lib", "targets/x86_64-linux/lib"}) add(root / sub, source);
  }
  // The lib directory of every NVIDIA wheel (nvidia-cublas, nvidia-cudnn-cu13, nvidia-nccl,
  // ...) installed in the Python environment at `prefix`.
  void add_wheels(const fs::path& prefix, const std::string& source) {
    for (const char* lib : {"lib", "lib64", "local/lib"})
      for (const auto& py : list_dir(prefix / lib)) {
        if (py.rfind("python3", 0) != 0) continue;
        for (const char* packages : {"site-packages", "dist-packages"}) {
          const fs::path nvidia = prefix / lib / py / packages / "nvidia";
          for (const auto& wheel : list_dir(nvidia)) add(nvidia / wheel / "lib", source);
        }
      }
  }
};

// The directories of /etc/ld.so.conf: plain lines, and `include` lines of the usual
// DIR/*.conf form (the files of DIR ending in what follows the '*').
void add_ld_so_conf(Dirs& d, const fs::path& conf, int depth) {
  std::ifstream in(conf);
  std::string line;
  while (depth < 4 && std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t a = line.find_first_not_of(" \t");
    if (a == std::string::npos) continue;
    line = line.substr(a);
    if (line.rfind("include", 0) == 0 && line.size() > 8) {
      const fs::path pattern = line.substr(line.find_first_not_of(" \t", 7));
      const std::string name = pattern.filename().string();
      const size_t star = name.find('*');
      const std::string head = name.substr(0, star),
                        tail = star == std::string::npos ? "" : name.substr(star + 1);
      const fs::path dir = pattern.is_absolute() ? pattern.parent_path()
                                                 : conf.parent_path() / pattern.parent_path();
      for (const auto& f : list_dir(dir)) {
        const bool match = star == std::string::npos
                               ? f == name
                               : f.size() >= head.size() + tail.size() && f.rfind(head, 0) == 0 &&
                                     f.compare(f.size() - tail.size(), tail.size(), tail) == 0;
        if (match) add_ld_so_conf(d, dir / f, depth + 1);
      }
    } else if (line[0] == '/') {
      d.add(line, "the loader's default path");
    }
  }
}

}  // namespace

std::vector<SearchDir> cuda_search_dirs() {
  Dirs d;
  const std::string override_dirs = env("STRATA_CUDA_LIBS");
  if (!override_dirs.empty()) {
    for (const auto& dir : split_path(override_dirs)) {
      if (!is_dir(dir))
        throw UserError(kExitBadInput,
                        fmt::format("STRATA_CUDA_LIBS={}: '{}' is not a directory (expected "
                                    "DIR[:DIR...], the directories of the CUDA libraries)",
                                    override_dirs, dir));
      d.add(dir, "STRATA_CUDA_LIBS");
    }
    return d.list;
  }
  for (const auto& dir : split_path(env("LD_LIBRARY_PATH"))) d.add(dir, "LD_LIBRARY_PATH");
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const std::string root = env(var); !root.empty()) d.add_toolkit(root, var);
  if (const std::string venv = env("VIRTUAL_ENV"); !venv.empty()) d.add_wheels(venv, "VIRTUAL_ENV");
  if (const std::string conda = env("CONDA_PREFIX"); !conda.empty()) {
    d.add(fs::path(conda) / "lib", "CONDA_PREFIX");  // conda's cuda-* packages
    d.add_wheels(conda, "CONDA_PREFIX");
  }
  // The python3 a user would run: its environment is the directory above its bin (a venv's
  // bin/python3 is a link to the system's; the link's place is what counts).
  for (const auto& dir : split_path(env("PATH")))
    if (::access((fs::path(dir) / "python3").c_str(), X_OK) == 0) {
      d.add_wheels(fs::path(dir).parent_path(), "python3 on PATH");
      break;
    }
  if (const std::string home = env("HOME"); !home.empty())
    d.add_wheels(fs::path(home) / ".local", "~/.local");
  add_ld_so_conf(d, "/etc/ld.so.conf", 0);
  for (const char* dir : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64",
                          "/usr/lib64", "/lib", "/usr/lib"})
    d.add(dir, "the loader's default path");
  d.add_toolkit("/usr/local/cuda", "/usr/local/cuda");
  return d.list;
}

std::vector<CudaLibrary> locate_libraries(const std::vector<std::string>& sonames,
                                          const std::vector<SearchDir>& dirs,
                                          std::vector<std::string>* missing) {
  std::vector<CudaLibrary> found;
  for (const auto& so : sonames) {
    bool hit = false;
    for (const auto& d : dirs) {
      const fs::path p = fs::path(d.dir) / so;
      std::error_code ec;
      if (fs::is_regular_file(p, ec) && ::access(p.c_str(), R_OK) == 0) {
        found.push_back({so, p.string(), d.source});
        hit = true;
        break;
      }
    }
    if (!hit) missing->push_back(so);
  }
  return found;
}

std::string describe_search(const std::vector<SearchDir>& dirs) {
  std::vector<std::pair<std::string, int>> sources;  // in order of first appearance
  for (const auto& d : dirs) {
    auto it = std::find_if(sources.begin(), sources.end(),
                           [&](const auto& s) { return s.first == d.source; });
    if (it == sources.end())
      sources.push_back({d.source, 1});
    else
      ++it->second;
  }
  if (sources.empty()) return "no directory: none of the places exists";
  std::string out;
  for (const auto& [source, n] : sources) {
    std::string what = source == "STRATA_CUDA_LIBS" || source == "CUDA_HOME" ||
                               source == "CUDA_PATH" || source == "VIRTUAL_ENV" ||
                               source == "CONDA_PREFIX"
                           ? fmt::format("{}={}", source, env(source.c_str()))
                           : source;
    out += fmt::format("{}{} ({} dir{})", out.empty() ? "" : ", ", what, n, n == 1 ? "" : "s");
  }
  return out;
}

std::vector<CudaLibrary> cudnn_sublibraries(const CudaLibrary& cudnn) {
  // libcudnn.so.9 -> ".so.9"; the sub-libraries carry the same version.
  const size_t so = cudnn.soname.find(".so");
  if (so == std::string::npos) return {};
  const std::string version = cudnn.soname.substr(so);
  const fs::path dir = fs::path(cudnn.path).parent_path();
  std::vector<CudaLibrary> subs;
  for (const char* name : {"libcudnn_graph", "libcudnn_engines_precompiled",
                           "libcudnn_engines_runtime_compiled", "libcudnn_heuristic",
                           "libcudnn_ops", "libcudnn_cnn", "libcudnn_adv"}) {
    const fs::path p = dir / (name + version);
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) subs.push_back({p.filename().string(), p.string(), cudnn.source});
  }
  return subs;
}

std::string preload_libraries(const std::vector<CudaLibrary>& libs) {
  for (const auto& lib : libs)
    if (!::dlopen(lib.path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      const char* e = ::dlerror();
      return fmt::format("cannot load {} ({}): {}", lib.path, lib.source, e ? e : "unknown error");
    }
  return "";
}

}  // namespace strata
