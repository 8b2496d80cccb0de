// Backend providers: how select_backend (strata/backend.h) finds a backend. Each provider is
// one file beside this one (cpu_provider.cpp, cuda_provider.cpp, staged_device.cpp) and one
// line of the list in providers.cpp; nothing else names it. A new backend is its provider
// file, that line and a test.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "strata/backend.h"

namespace strata {

class Comm;
class DeviceTransport;

// What a provider answers besides the table: the log line saying what was chosen and why,
// and the GPU taken (-1: none).
struct BackendChoice {
  std::string why;
  int gpu = -1;
};

struct BackendProvider {
  const char* name;  // its --device value
  const char* what;  // what it runs on, for "no GPU: <why>" when auto passes it over
  // --device auto tries it (in the list's order) and the "expected ..." message lists it;
  // false for test-only backends, which are named explicitly.
  bool in_auto;
  // Whether this node and build can run it: true, or false with the reason in *why.
  bool (*available)(std::string* why);
  // Its table for the request in `precision`; throws UserError (exit 2) for what it cannot
  // give (a precision this processor lacks, a GPU that fails to start).
  const Backend& (*make)(const DeviceRequest& req, Precision precision, BackendChoice* out);
  // The transport of a communicator over its memory (device_comm.h); null where its memory
  // is host memory and plain MPI serves.
  std::unique_ptr<DeviceTransport> (*transport)(Comm& host);
};

// `available` of a provider that runs wherever strata does (the CPU's).
inline bool always_available(std::string*) { return true; }

// Every provider of this build, in --device auto's order of preference.
const std::vector<const BackendProvider*>& backend_providers();
// The provider of a backend select_backend returned (by its name).
const BackendProvider& provider_of(const Backend& be);

}  // namespace strata
