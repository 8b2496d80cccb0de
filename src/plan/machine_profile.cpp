#include "plan/machine_profile.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "base/files.h"
#include "base/json.h"
#include "base/metrics.h"
#include "strata/error.h"

namespace strata {
namespace {

// The per-micro-batch seconds t(b) = b x per-sample(b), linear in b between the measured sizes.
double interpolate(const std::vector<LayerTiming>& at, double b, double LayerTiming::*field) {
  if (at.empty()) return 0;
  auto t = [&](size_t i) { return double(at[i].micro_batch) * at[i].*field; };
  if (at.size() == 1) return t(0) / double(at[0].micro_batch) * b;
  size_t hi = 1;
  while (hi + 1 < at.size() && double(at[hi].micro_batch) < b) ++hi;
  const double b0 = double(at[hi - 1].micro_batch), b1 = double(at[hi].micro_batch);
  const double v = t(hi - 1) + (b - b0) / (b1 - b0) * (t(hi) - t(hi - 1));
  // Below the smallest size a line may cross zero: never less than the smallest's per-sample
  // share of it.
  return std::max(v, b < b0 ? t(0) / b0 * b * 0.5 : 0.0);
}

std::string timings_json(const std::vector<LayerTiming>& at, bool loss) {
  std::string s = "[";
  for (size_t i = 0; i < at.size(); ++i) {
    const LayerTiming& t = at[i];
    s += fmt::format("{}{{\"micro_batch\": {}, \"forward_s\": {}", i ? ", " : "", t.micro_batch,
                     json_number(t.forward_s));
    if (!loss)
      s += fmt::format(", \"backward_s\": {}, \"backward_input_s\": {}, \"backward_weight_s\": {}",
                       json_number(t.backward_s), json_number(t.backward_input_s),
                       json_number(t.backward_weight_s));
    s += "}";
  }
  return s + "]";
}

struct Reader {
  std::string where;
  const JsonValue& need(const JsonValue& o, const std::string& k, const std::string& path) const {
    const JsonValue* v = o.is_object() ? o.find(k) : nullptr;
    if (!v) fail_input("{}: key \"{}\" missing", where, path);
    return *v;
  }
  double num(const JsonValue& o, const std::string& k, const std::string& path) const {
    const JsonValue& v = need(o, k, path);
    if (v.kind != JsonValue::Kind::kNumber || !(v.number >= 0))
      fail_input("{}: key \"{}\" must be a number >= 0", where, path);
    return v.number;
  }
  std::string str(const JsonValue& o, const std::string& k, const std::string& path) const {
    const JsonValue& v = need(o, k, path);
    if (!v.is_string()) fail_input("{}: key \"{}\" must be a string", where, path);
    return v.text;
  }
  std::string opt_str(const JsonValue& o, const std::string& k) const {
    const JsonValue* v = o.find(k);
    return v && v->is_string() ? v->text : "";
  }
  const JsonValue& array(const JsonValue& o, const std::string& k, const std::string& path) const {
    const JsonValue& v = need(o, k, path);
    if (!v.is_array()) fail_input("{}: key \"{}\" must be an array", where, path);
    return v;
  }
  std::vector<LayerTiming> timings(const JsonValue& a, const std::string& path, bool loss) const {
    std::vector<LayerTiming> out;
    for (size_t i = 0; i < a.items.size(); ++i) {
      const JsonValue& t = a.items[i];
      const std::string p = fmt::format("{}[{}]", path, i);
      LayerTiming lt;
      lt.micro_batch = int64_t(num(t, "micro_batch", p + ".micro_batch"));
      if (lt.micro_batch < 1) fail_input("{}: key \"{}.micro_batch\" must be at least 1", where, p);
      if (!out.empty() && lt.micro_batch <= out.back().micro_batch)
        fail_input("{}: key \"{}.micro_batch\": sizes must ascend", where, p);
      lt.forward_s = num(t, "forward_s", p + ".forward_s");
      if (!loss) {
        lt.backward_s = num(t, "backward_s", p + ".backward_s");
        lt.backward_input_s = num(t, "backward_input_s", p + ".backward_input_s");
        lt.backward_weight_s = num(t, "backward_weight_s", p + ".backward_weight_s");
      }
      out.push_back(lt);
    }
    if (out.empty()) fail_input("{}: key \"{}\" holds no measurement", where, path);
    return out;
  }
};

}  // namespace

const LayerProfile* MachineProfile::find(int index, const std::string& kind_given) const {
  // Profiles are measured without recomputation (a block's description then lacks it).
  std::string kind = kind_given;
  if (const size_t at = kind.find(", recompute"); at != std::string::npos) kind.erase(at, 11);
  if (index >= 0 && size_t(index) < layers.size() && layers[size_t(index)].kind == kind)
    return &layers[size_t(index)];
  for (const LayerProfile& l : layers)
    if (l.kind == kind) return &l;
  return nullptr;
}

MicroBatchCost MachineProfile::cost(const LayerProfile& l, double b) {
  return {interpolate(l.at, b, &LayerTiming::forward_s), interpolate(l.at, b, &LayerTiming::backward_s),
          interpolate(l.at, b, &LayerTiming::backward_input_s),
          interpolate(l.at, b, &LayerTiming::backward_weight_s)};
}

double MachineProfile::loss_s(double b) const { return interpolate(loss, b, &LayerTiming::forward_s); }

double MachineProfile::input_s(double b) const {
  return input.empty() ? 0 : interpolate(input, b, &LayerTiming::forward_s);
}

double MachineProfile::whole_ratio(double b) const {
  if (whole.empty() || !(b > 0)) return 1;
  double sum = loss_s(b);
  for (const LayerProfile& l : layers) {
    const MicroBatchCost c = cost(l, b);
    sum += c.forward_s + c.backward_s;
  }
  const double w = interpolate(whole, b, &LayerTiming::forward_s);
  return sum > 0 && w > 0 ? w / sum : 1;
}

double MachineProfile::busy_factor(int ranks) const {
  if (busy_ranks <= 1 || ranks <= 1) return 1;
  const double share = std::min(1.0, double(ranks - 1) / double(busy_ranks - 1));
  return 1 + (busy_slowdown - 1) * share;
}

std::string machine_profile_json(const MachineProfile& p) {
  std::string s = "{\"strata_machine_profile\": 1,\n";
  s += fmt::format(" \"device\": {}, \"precision\": {}, \"threads\": {}, \"cores\": {},\n",
                   json_string(p.device), json_string(p.precision), p.threads, p.cores);
  s += fmt::format(" \"cpu\": {{\"model\": {}, \"family\": {}, \"model_id\": {}}}, \"gpu\": {},\n",
                   json_string(p.cpu_model), json_string(p.cpu_family), json_string(p.cpu_model_id),
                   json_string(p.gpu));
  s += " \"versions\": {";
  bool first = true;
  for (const auto& [k, v] : p.versions)
    s += fmt::format("{}{}: {}", std::exchange(first, false) ? "" : ", ", json_string(k), json_string(v));
  s += fmt::format("}},\n \"date\": {}, \"config\": {}, \"model\": {{\"type\": {}, \"layers\": {}}},\n",
                   json_string(p.date), json_string(p.config), json_string(p.model_type), p.layers.size());
  s += " \"micro_batches\": [";
  for (size_t i = 0; i < p.micro_batches.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", p.micro_batches[i]);
  s += "],\n \"layers\": [\n";
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const LayerProfile& l = p.layers[i];
    s += fmt::format("  {{\"index\": {}, \"name\": {}, \"kind\": {}, \"params\": {}, \"flops\": {}, "
                     "\"splits\": {}, \"optimizer_s\": {},\n   \"at\": {}}}{}\n",
                     l.index, json_string(l.name), json_string(l.kind), l.params, json_number(l.flops),
                     l.splits ? "true" : "false", json_number(l.optimizer_s), timings_json(l.at, false),
                     i + 1 < p.layers.size() ? "," : "");
  }
  s += fmt::format(" ],\n \"loss\": {{\"at\": {}}},\n", timings_json(p.loss, true));
  if (!p.whole.empty()) s += fmt::format(" \"whole\": {{\"at\": {}}},\n", timings_json(p.whole, true));
  if (!p.input.empty()) s += fmt::format(" \"input\": {{\"at\": {}}},\n", timings_json(p.input, true));
  if (p.busy_ranks > 1)
    s += fmt::format(" \"busy\": {{\"ranks\": {}, \"slowdown\": {}}},\n", p.busy_ranks,
                     json_number(p.busy_slowdown));
  s += fmt::format(" \"checkpoint_write_Bps\": {}, \"checkpoint_bytes\": {}, \"memory_Bps\": {}, "
                   "\"cpu_share\": {}\n}}\n", json_number(p.checkpoint_write_Bps), p.checkpoint_bytes,
                   json_number(p.memory_Bps), json_number(p.cpu_share));
  return s;
}

void write_machine_profile(const std::string& path, const MachineProfile& p) {
  publish_text_file(path, machine_profile_json(p));
}

MachineProfile read_machine_profile(const std::string& path) {
  const JsonValue root = parse_json(read_whole_file(path), path);
  const Reader r{path};
  if (!root.is_object()) fail_input("{}: not a machine profile (expected a JSON object)", path);
  const JsonValue& version = r.need(root, "strata_machine_profile", "strata_machine_profile");
  if (!version.is_int() || version.int_value != 1)
    fail_input("{}: key \"strata_machine_profile\": not version 1 (the one this strata reads); "
               "measure again with strata bench layers", path);
  MachineProfile p;
  p.path = path;
  p.device = r.str(root, "device", "device");
  p.precision = r.str(root, "precision", "precision");
  if (p.device != "cpu" && p.device != "cuda" && p.device != "cpu-staged")
    fail_input("{}: key \"device\": \"{}\" is not a device strata measures (cpu, cuda, cpu-staged)",
               path, p.device);
  if (p.precision != "fp32" && p.precision != "bf16")
    fail_input("{}: key \"precision\": \"{}\" is neither \"fp32\" nor \"bf16\"", path, p.precision);
  const auto count = [&](const char* key) {  // a count a machine can have
    const double v = r.num(root, key, key);
    if (!(v >= 1 && v <= 1e6)) fail_input("{}: key \"{}\": {} is not a count from 1 to 1e6", path, key, v);
    return int(v);
  };
  p.threads = count("threads");
  p.cores = count("cores");
  if (const JsonValue* c = root.find("cpu"); c && c->is_object())
    p.cpu_model = r.opt_str(*c, "model"), p.cpu_family = r.opt_str(*c, "family"),
    p.cpu_model_id = r.opt_str(*c, "model_id");
  p.gpu = r.opt_str(root, "gpu");
  p.date = r.opt_str(root, "date");
  p.config = r.opt_str(root, "config");
  if (const JsonValue* v = root.find("versions"); v && v->is_object())
    for (const auto& [k, x] : v->members) p.versions[k] = x.is_string() ? x.text : "";
  if (const JsonValue* m = root.find("model"); m && m->is_object()) p.model_type = r.opt_str(*m, "type");
  const JsonValue& layers = r.array(root, "layers", "layers");
  for (size_t i = 0; i < layers.items.size(); ++i) {
    const JsonValue& l = layers.items[i];
    const std::string at = fmt::format("layers[{}]", i);
    LayerProfile lp;
    lp.index = int(r.num(l, "index", at + ".index"));
    lp.name = r.str(l, "name", at + ".name");
    lp.kind = r.str(l, "kind", at + ".kind");
    lp.params = int64_t(r.num(l, "params", at + ".params"));
    lp.flops = r.num(l, "flops", at + ".flops");
    lp.splits = l.find("splits") && l.find("splits")->kind == JsonValue::Kind::kBool && l.find("splits")->boolean;
    lp.optimizer_s = r.num(l, "optimizer_s", at + ".optimizer_s");
    lp.at = r.timings(r.array(l, "at", at + ".at"), at + ".at", false);
    p.layers.push_back(std::move(lp));
  }
  if (p.layers.empty()) fail_input("{}: key \"layers\" holds no layer", path);
  p.loss = r.timings(r.array(r.need(root, "loss", "loss"), "at", "loss.at"), "loss.at", true);
  if (root.find("whole"))  // optional: profiles before it lack it
    p.whole = r.timings(r.array(r.need(root, "whole", "whole"), "at", "whole.at"), "whole.at", true);
  if (root.find("input"))  // optional: a CPU's profile, and those before it, lack it
    p.input = r.timings(r.array(r.need(root, "input", "input"), "at", "input.at"), "input.at", true);
  p.checkpoint_write_Bps = r.num(root, "checkpoint_write_Bps", "checkpoint_write_Bps");
  p.checkpoint_bytes = int64_t(r.num(root, "checkpoint_bytes", "checkpoint_bytes"));
  if (const JsonValue* m = root.find("memory_Bps"); m && m->kind == JsonValue::Kind::kNumber)
    p.memory_Bps = m->number;
  if (const JsonValue* c = root.find("cpu_share"); c && c->kind == JsonValue::Kind::kNumber && c->number > 0)
    p.cpu_share = c->number;
  if (const JsonValue* b = root.find("busy")) {  // optional: a profile measured on one rank lacks it
    p.busy_ranks = int(r.num(*b, "ranks", "busy.ranks"));
    p.busy_slowdown = r.num(*b, "slowdown", "busy.slowdown");
    if (p.busy_ranks < 1 || !(p.busy_slowdown > 0))
      fail_input("{}: key \"busy\": ranks {} and slowdown {} must be positive", path, p.busy_ranks,
                 p.busy_slowdown);
  }
  return p;
}

}  // namespace strata
