// train.init_from: a run's first parameters from a GPT-2 file of another tool (a Hugging Face
// safetensors directory or an llm.c model file; checkpoint/gpt2_layout.h reads them).
#pragma once
#include "strata/comm.h"
#include "config/config.h"
#include "model/model.h"
#include "run/run_plan.h"

namespace strata {

// Every rank reads the file as the whole model (for a moment) and keeps its stage's block, its
// tensor part of it, as a resume does (whole_model.h); the optimizer starts fresh. `whole` is
// rank 0's gathered whole model when the plan keeps one (else null). A file that does not fit
// the config fails on every rank alike (UserError naming the file and the first mismatch),
// before any training.
void init_from_file(const RunConfig& cfg, const RunPlan& plan, Comm& comm, Model& model,
                    Model* whole);

}  // namespace strata
