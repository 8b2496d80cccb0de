// The CUDA backend seam (backend.h, comm.h) in a build with STRATA_CUDA: the backend itself
// is the module libstrata_cuda.so (src/backends/cuda, kernels/cuda), loaded on first use, so that
// strata starts and runs on the CPU where the CUDA libraries or the driver are missing. First
// the CUDA libraries the module names (DT_NEEDED) are looked for (cuda_libraries.h) and the
// driver's libcuda.so.1; only when all are there are they loaded and the module with them.
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cuda_libraries.h"
#include "elf_needed.h"
#include "backends/cuda_api.h"
#include "strata/comm.h"
#include "strata/cuda_module.h"
#include "strata/device_comm.h"
#include "strata/error.h"
#include "strata/version.h"

namespace fs = std::filesystem;

namespace strata {
namespace {

struct Loaded {
  const CudaModule* module = nullptr;
  std::string why;  // why there is none, for the start-up line and --device cuda's error
  std::vector<CudaLibrary> libraries;
};

std::string dl_error() {
  const char* e = ::dlerror();
  return e ? e : "unknown error";
}

// Where the module is: $STRATA_CUDA_MODULE when set (programs that are not bin/strata: the op
// table's tests, the GPU check), else STRATA_CUDA_MODULE_REL (from CMake: lib/strata relative
// to bin in the installed and bundled layouts) from this executable's directory, else beside
// it (the build tree). Nothing compiled in points outside the executable's own tree.
std::vector<std::string> module_candidates() {
  if (const char* m = std::getenv("STRATA_CUDA_MODULE"); m && *m) return {m};
  std::error_code ec;
  const fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) return {};
  const fs::path rel = STRATA_CUDA_MODULE_REL;
  return {(dir / rel).lexically_normal().string(), (dir / rel.filename()).string()};
}

// The module's DT_NEEDED entries that this process has not loaded already (libstdc++, fmt ...
// have been, by the executable): the CUDA libraries, dependencies first.
std::vector<std::string> cuda_sonames(const std::vector<std::string>& needed) {
  std::vector<std::string> names;
  for (const auto& n : needed)
    if (!::dlopen(n.c_str(), RTLD_LAZY | RTLD_NOLOAD)) names.push_back(n);
  auto rank = [](const std::string& n) {
    int r = 0;
    for (const char* first : {"libcudart.", "libcublasLt.", "libcublas.", "libcudnn.", "libnccl."}) {
      if (n.rfind(first, 0) == 0) return r;
      ++r;
    }
    return r;
  };
  std::stable_sort(names.begin(), names.end(),
                   [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  return names;
}

// libcuda.so.1 comes with the NVIDIA driver, from the loader's default path; without it there
// is no GPU to use.
std::string load_driver(std::vector<CudaLibrary>* libs) {
  void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) return fmt::format("no NVIDIA driver ({})", dl_error());
  link_map* lm = nullptr;
  const std::string path = ::dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm ? lm->l_name : "";
  libs->push_back({"libcuda.so.1", path, "the NVIDIA driver"});
  return "";
}

Loaded load() {
  Loaded l;
  std::string module_path;
  const auto candidates = module_candidates();
  for (const auto& c : candidates)
    if (::access(c.c_str(), R_OK) == 0) {
      module_path = c;
      break;
    }
  if (candidates.empty()) {
    l.why = "cannot find the CUDA backend module: /proc/self/exe does not name this program";
    return l;
  }
  if (module_path.empty()) {
    l.why = fmt::format("this strata's CUDA backend module is missing (no {})",
                        fmt::join(candidates, " or "));
    return l;
  }
  std::string why;
  const auto needed = elf_needed(module_path, &why);
  if (!why.empty()) {
    l.why = "the CUDA backend module: " + why;
    return l;
  }
  const auto dirs = cuda_search_dirs();
  std::vector<std::string> missing;
  std::vector<CudaLibrary> libs = locate_libraries(cuda_sonames(needed), dirs, &missing);
  std::vector<CudaLibrary> driver;
  const std::string no_driver = load_driver(&driver);
  if (!missing.empty()) {
    const bool overridden = std::getenv("STRATA_CUDA_LIBS") && *std::getenv("STRATA_CUDA_LIBS");
    l.why = fmt::format("{}no CUDA libraries: {} not found in {}{}",
                        no_driver.empty() ? "" : no_driver + "; ", fmt::join(missing, ", "),
                        describe_search(dirs),
                        overridden ? "" : " (STRATA_CUDA_LIBS=DIR[:DIR...] names their directories)");
    return l;
  }
  if (!no_driver.empty()) {
    l.why = no_driver;
    return l;
  }
  for (size_t i = 0; i < libs.size(); ++i)
    if (libs[i].soname.rfind("libcudnn.", 0) == 0) {
      auto subs = cudnn_sublibraries(libs[i]);
      libs.insert(libs.begin() + long(i), subs.begin(), subs.end());
      i += subs.size();
    }
  if (const std::string e = preload_libraries(libs); !e.empty()) {
    l.why = e;
    return l;
  }
  void* h = ::dlopen(module_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    l.why = fmt::format("cannot load the CUDA backend module: {}", dl_error());
    return l;
  }
  auto entry = reinterpret_cast<const CudaModule* (*)()>(::dlsym(h, kCudaModuleEntry));
  if (!entry) {
    l.why = fmt::format("{}: no {} ({})", module_path, kCudaModuleEntry, dl_error());
    return l;
  }
  const CudaModule* m = entry();
  const std::string build = std::string(STRATA_VERSION " ") + git_commit();
  if (build != m->build || m->backend_size != sizeof(Backend)) {
    l.why = fmt::format("{} is from another build of strata ({}, this is {})", module_path,
                        m->build, build);
    return l;
  }
  l.module = m;
  l.libraries = std::move(libs);
  l.libraries.insert(l.libraries.end(), driver.begin(), driver.end());
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

int cuda_devices(std::string* why) {
  const Loaded& l = loaded();
  if (!l.module) {
    if (why) *why = l.why;
    return 0;
  }
  return l.module->devices(why);
}

const Backend& cuda_backend(int device, Precision precision) {
  const Loaded& l = loaded();
  if (!l.module) throw UserError(kExitBadInput, "--device cuda: " + l.why);
  return l.module->backend(device, precision);
}

std::string cuda_device_name() {
  const Loaded& l = loaded();
  return l.module ? l.module->device_name() : "";
}

std::vector<CudaLibrary> cuda_libraries() { return loaded().libraries; }

std::unique_ptr<DeviceTransport> cuda_transport(Comm& host) {
  return loaded().module->transport(host);  // a CUDA table exists: the module is loaded
}

}  // namespace strata
