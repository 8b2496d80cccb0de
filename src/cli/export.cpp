// `strata export`: a GPT model (parameter file or checkpoint) as the files Hugging Face
// transformers (--format hf) or llm.c (--format llmc) load. docs/checkpoints.md, "Export and
// import".
#include "cli/commands.h"

#include <memory>

#include <fmt/format.h>

#include "base/files.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/llmc_format.h"
#include "run/inference.h"
#include "strata/error.h"

namespace strata::cli {
namespace {

struct ExportOptions {
  std::string checkpoint, format, out, dtype = "fp32", max_shard_size = "5GB";
};

// "5GB", "500MB", "64KB" (powers of 1000, as transformers' max_shard_size) or plain bytes.
int64_t shard_bytes(const std::string& text) {
  static const std::pair<const char*, int64_t> units[] = {
      {"GB", 1000000000}, {"MB", 1000000}, {"KB", 1000}, {"B", 1}};
  for (const auto& [unit, scale] : units) {
    const std::string u(unit);
    if (text.size() > u.size() && text.ends_with(u)) {
      const std::string digits = text.substr(0, text.size() - u.size());
      if (digits.find_first_not_of("0123456789") == std::string::npos && digits.size() <= 9)
        return std::stoll(digits) * scale;
    }
  }
  if (!text.empty() && text.size() <= 15 && text.find_first_not_of("0123456789") == std::string::npos)
    return std::stoll(text);
  fail_input("flag --max_shard_size: '{}' is not a size (bytes, or a number with KB, MB or GB)", text);
}

int run_export(const ExportOptions& o) {
  const int64_t max_shard = shard_bytes(o.max_shard_size);
  if (max_shard < 1) fail_input("flag --max_shard_size: must be at least 1 byte");
  refuse_writing_over({"--out", o.out}, {{"--checkpoint", o.checkpoint}});
  InferenceModel im = load_for_inference(o.checkpoint, "cpu", 1);
  if (im.is_int8())
    fail_input("{}: an int8 file (strata quantize) cannot be exported; export the fp32 model it "
               "came from", o.checkpoint);
  const LoadedParams& lp = im.params;
  const GptFileAttrs attrs = read_gpt_attrs(o.checkpoint);
  const GptDims d = gpt_dims(lp.spec, lp.input_shape, lp.classes, attrs.vocab_size, o.checkpoint);
  GptWeights w;
  for (const GptTensor& t : gpt_tensors(d)) w[t.strata] = lp.tensors.at(param_path(t.strata));
  const std::string dtype = o.dtype == "bf16" ? "BF16" : "F32";
  if (o.format == "hf")
    export_hf(d, w, attrs, o.out, {.dtype = dtype, .max_shard_bytes = max_shard}, o.checkpoint);
  else
    export_llmc(d, w, o.out, dtype);
  // llm.c has no erf GELU: the file is written (strata reads it back exactly), but llm.c runs
  // it with the tanh form, up to ~5e-4 away per activation.
  if (o.format == "llmc" && !d.gelu_tanh)
    fmt::print(stderr, "strata: warning: {}: the model uses the erf GELU (model.gelu = \"erf\"); "
               "llm.c runs {} with the tanh GELU, a slightly different function\n", o.checkpoint, o.out);
  fmt::print("exported {} ({} blocks, {} heads, width {}, context {}, vocabulary {}) to {} ({}, {})\n",
             o.checkpoint, d.L, d.NH, d.C, d.T, d.V, o.out, o.format == "hf" ? "Hugging Face" : "llm.c",
             o.dtype);
  return kExitOk;
}

}  // namespace

Subcommand add_export(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  auto* e = app.add_subcommand("export", "write a GPT model as Hugging Face safetensors "
                                         "(--format hf) or an llm.c model file (--format llmc)");
  e->add_option("--checkpoint", o->checkpoint, "parameter file (model.h5) or checkpoint of a GPT run")
      ->required();
  e->add_option("--format", o->format, "hf: a directory for transformers' GPT2LMHeadModel; llmc: "
                                       "llm.c's model file")
      ->required()->check(CLI::IsMember({"hf", "llmc"}));
  e->add_option("--out", o->out, "the directory (hf) or file (llmc) to write")->required();
  e->add_option("--dtype", o->dtype, "fp32 or bf16 (rounded to nearest even)")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  e->add_option("--max_shard_size", o->max_shard_size,
                "hf: tensor bytes per safetensors file; a larger model is written as shards with "
                "model.safetensors.index.json")
      ->capture_default_str();
  return {e, [o](Comm& comm) {
            if (comm.size() > 1)
              fail_input("strata export runs on one process, not under mpirun ({} ranks)", comm.size());
            return run_export(*o);
          }};
}

}  // namespace strata::cli
