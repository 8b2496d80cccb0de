// select_backend over the providers (provider.h), and what every backend shares.
#include "strata/backend.h"

#include <fmt/format.h>

#include "backends/provider.h"
#include "strata/error.h"

namespace strata {
namespace {

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  fail_input("train.precision = \"{}\": expected \"fp32\" or \"bf16\"", s);
}

const BackendProvider* find_provider(const std::string& name) {
  for (const BackendProvider* p : backend_providers())
    if (name == p->name) return p;
  return nullptr;
}

// "auto, cuda or cpu": what --device accepts (test-only providers are not advertised).
std::string device_choices() {
  std::vector<std::string> names = {"auto"};
  for (const BackendProvider* p : backend_providers())
    if (p->in_auto) names.push_back(p->name);
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

const Backend& made(const BackendProvider& p, const DeviceRequest& req, Precision precision,
                    const std::string& note, std::string* why, int* gpu) {
  BackendChoice c;
  const Backend& be = p.make(req, precision, &c);
  if (why) *why = c.why + note;
  if (gpu) *gpu = c.gpu;
  return be;
}

}  // namespace

const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

bool Backend::supports(Op op) const {
  switch (op) {
#define STRATA_OP(name, ret, params) \
  case Op::name:                     \
    return name != nullptr;
#include "strata/ops.def"
  }
  return false;
}

const char* op_name(Op op) {
  switch (op) {
#define STRATA_OP(name, ret, params) \
  case Op::name:                     \
    return #name;
#include "strata/ops.def"
  }
  return "?";
}

const Backend& select_backend(const DeviceRequest& req, std::string* why, int* gpu) {
  if (gpu) *gpu = -1;
  const BackendProvider* named = req.device == "auto" ? nullptr : find_provider(req.device);
  if (req.device != "auto" && !named)
    fail_input("--device {}: expected {}", req.device, device_choices());
  const Precision precision = parse_precision(req.precision);
  if (named) {
    std::string not_here;
    if (!named->available(&not_here)) fail_input("--device {}: {}", req.device, not_here);
    return made(*named, req, precision, "", why, gpu);
  }
  // auto: the first provider this node can run, saying why each one before it was passed over.
  std::string passed_over;
  for (const BackendProvider* p : backend_providers()) {
    if (!p->in_auto) continue;
    std::string not_here;
    if (p->available(&not_here))
      return made(*p, req, precision,
                  passed_over.empty() ? "; chosen by --device auto" : passed_over, why, gpu);
    passed_over += fmt::format("; no {}: {}", p->what, not_here);
  }
  fail_input("--device auto: no backend can run here{}", passed_over);
}

Tensor to_backend(const Backend& be, const Tensor& t) {
  if (be.host_memory()) return t;
  Tensor d(t.shape, *be.memory);
  be.upload(d.data(), t.data(), sizeof(float) * size_t(t.size()));
  return d;
}

}  // namespace strata
