#include "run/inference.h"

namespace strata {

InferenceModel load_for_inference(const std::string& path, const std::string& device, int threads) {
  InferenceModel m;
  if (device != "auto") m.be = &select_backend({.device = device, .threads = threads}, &m.device_note);
  m.params = load_parameters(path);
  const LoadedParams& lp = m.params;
  if (!m.be)
    m.be = &select_backend({.device = lp.int8.weights.empty() ? "auto" : "cpu", .threads = threads},
                           &m.device_note);
  require_model_memory(describe_layers(lp.spec, lp.input_shape, lp.classes), {}, 2, 1, 1,
                       path);
  m.model = std::make_unique<Model>(lp.spec, lp.input_shape, lp.classes);
  m.int8 = std::make_unique<Int8Table>();
  copy_parameters_into(*m.model, lp, path, m.int8.get());
  if (m.is_int8()) m.model->set_int8(m.int8.get());
  m.model->check_backend(*m.be);
  m.model->place(*m.be);
  return m;
}

}  // namespace strata
