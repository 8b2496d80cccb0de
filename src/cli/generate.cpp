// `strata generate`: text sampled from a trained GPT.
#include "cli/commands.h"

#include <memory>

#include "run/generate.h"
#include "strata/error.h"

namespace strata::cli {

Subcommand add_generate(CLI::App& app) {
  struct Opts {
    GenerateOptions gen;
    CLI::Option* threads = nullptr;
  };
  auto o = std::make_shared<Opts>();
  GenerateOptions& gen = o->gen;
  auto* generate = app.add_subcommand("generate", "sample text from a trained GPT (model.type = \"gpt\")");
  generate->add_option("--checkpoint", gen.checkpoint, "model.h5 or a checkpoint of a gpt run")->required();
  generate->add_option("--prompt", gen.prompt, "text to continue")->capture_default_str();
  generate->add_option("--vocab", gen.vocab,
                       "GPT-2's vocabulary directory, when the model records none or it moved");
  generate->add_option("--tokens", gen.tokens, "tokens to generate")
      ->check(int_in(0, INT32_MAX))->capture_default_str();
  generate->add_option("--temperature", gen.temperature, "0 = always the most likely token")
      ->check(real_in(0, 1e6))
      ->capture_default_str();
  generate->add_option("--top_k", gen.top_k, "sample among the k most likely (0 = all)")
      ->check(int_in(0, INT32_MAX))
      ->capture_default_str();
  generate->add_option("--seed", gen.seed, "the same seed gives the same text")
      ->check(int_in(0, INT64_MAX))->capture_default_str();
  o->threads = generate->add_option("--threads", gen.threads)->check(int_in(1, kMaxThreads));
  generate->add_option("--device", gen.device, "auto | cpu | cuda (auto: the CPU for an int8 file)")
      ->capture_default_str();
  return {generate, [o](Comm& comm) {
            o->gen.threads = threads_from(o->threads, o->gen.threads);
            return comm.rank() == 0 ? run_generate(o->gen) : int(kExitOk);
          }};
}

}  // namespace strata::cli
