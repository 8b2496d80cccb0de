// `strata devices`: the GPUs and CUDA libraries this node offers, or why none.
#include "cli/commands.h"

#include <fmt/format.h>

#include "backends/cuda_api.h"
#include "strata/error.h"

namespace strata::cli {

// `strata devices`: whether this node can run the CUDA backend, and if so which CUDA libraries
// it loaded from where (the start-up line of a GPU run says the same); why not otherwise.
namespace {

int run_devices() {
  std::string why;
  const int gpus = cuda_devices(&why);
  if (gpus == 0)
    fmt::print("cuda: no GPU: {}\n", why);
  else
    fmt::print("cuda: {} GPU{} visible\n", gpus, gpus == 1 ? "" : "s");
  for (const auto& lib : cuda_libraries())
    fmt::print("cuda library: {} {} ({})\n", lib.soname, lib.path, lib.source);
  return kExitOk;
}

}  // namespace

Subcommand add_devices(CLI::App& app) {
  auto* devices = app.add_subcommand(
      "devices", "whether this node can run the CUDA backend, and which CUDA libraries it found "
                 "where (or why not)");
  return {devices, [](Comm& comm) { return comm.rank() == 0 ? run_devices() : int(kExitOk); }};
}

}  // namespace strata::cli
