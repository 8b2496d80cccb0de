// train.init_from (init_from.h).
#include "run/init_from.h"

#include <algorithm>
#include <memory>

#include "base/memory.h"
#include "checkpoint/gpt2_layout.h"
#include "parallel/whole_model.h"
#include "strata/error.h"

namespace strata {

void init_from_file(const RunConfig& cfg, const RunPlan& plan, Comm& comm, Model& model,
                    Model* whole) {
  AllocationScope scope("reading train.init_from");
  const ModelSpec spec = cfg.model_spec(plan.info.classes);
  const Shape& shape = plan.info.train.sample_shape;
  GptWeights w;
  collectively(comm, [&] {
    if (cfg.model.type != "gpt")
      fail_input("train.init_from: needs model.type = \"gpt\" (a GPT-2 file), not \"{}\"",
                 cfg.model.type);
    w = import_gpt2(cfg.train.init_from, gpt_dims(spec, shape, plan.info.classes, 0, "train.init_from"));
  });
  std::unique_ptr<Model> temp;
  Model* target = &model;
  if (plan.gathered()) {
    if (!whole) temp = std::make_unique<Model>(spec, shape, plan.info.classes);
    target = whole ? whole : temp.get();
  }
  for (Param* q : target->params()) {
    const std::vector<float>& v = w.at(q->name);
    STRATA_CHECK(int64_t(v.size()) == numel(q->shape), "init_from: {} size", q->name);
    std::copy(v.begin(), v.end(), q->host);
  }
  if (target != &model) take_stage_params(*target, model);
}

}  // namespace strata
