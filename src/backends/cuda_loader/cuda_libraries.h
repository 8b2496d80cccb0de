// Finding the CUDA libraries on a node (cudart, cuBLAS, cuBLASLt, cuDNN, NCCL: whatever the
// backend module was linked against) and loading them by path, so that the module's DT_NEEDED
// sonames resolve to them. Nothing is run to find them: Python environments are recognised
// from their directories. The search order (docs/gpus.md, "Where the CUDA libraries are found"):
//   1. STRATA_CUDA_LIBS=DIR[:DIR...]: these directories and no others (the override)
//   2. LD_LIBRARY_PATH
//   3. CUDA_HOME, then CUDA_PATH: lib64, lib, targets/x86_64-linux/lib
//   4. the NVIDIA wheels (site-packages/nvidia/*/lib) of VIRTUAL_ENV, of CONDA_PREFIX (and its
//      lib), of the python3 first on PATH, and of ~/.local (pip --user)
//   5. the loader's default directories (/etc/ld.so.conf, the system library directories)
//   6. /usr/local/cuda (the toolkit's default place)
// Each library is taken from the first directory that holds it.
#pragma once
#include <string>
#include <vector>

#include "backends/cuda_api.h"

namespace strata {

// A directory that may hold the libraries, and what pointed there (for messages).
struct SearchDir {
  std::string dir, source;
};

// The directories, in search order, each existing one once. Throws UserError (exit 2) naming
// STRATA_CUDA_LIBS when one of its entries is not a directory.
std::vector<SearchDir> cuda_search_dirs();

// Each soname from the first directory that holds it; those found nowhere go to *missing.
std::vector<CudaLibrary> locate_libraries(const std::vector<std::string>& sonames,
                                          const std::vector<SearchDir>& dirs,
                                          std::vector<std::string>* missing);

// The sources searched, briefly: "LD_LIBRARY_PATH (2 dirs), CUDA_HOME=/opt/cuda (3 dirs), ...".
std::string describe_search(const std::vector<SearchDir>& dirs);

// cuDNN 9's sub-libraries (libcudnn_graph.so.9, ...) that sit beside `cudnn`, in dependency
// order. libcudnn.so.9 dlopens them by soname when it needs them; loaded first, they are
// these files rather than another cuDNN's from the default path.
std::vector<CudaLibrary> cudnn_sublibraries(const CudaLibrary& cudnn);

// Loads each library by path, globally (RTLD_GLOBAL), in order. "" on success, else which one
// failed and the loader's message.
std::string preload_libraries(const std::vector<CudaLibrary>& libs);

}  // namespace strata
