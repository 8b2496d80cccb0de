#include "run/quantize.h"

#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/files.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/writer.h"
#include "data/data.h"
#include "model/int8.h"
#include "model/model.h"
#include "run/inference.h"
#include "strata/backend.h"
#include "strata/error.h"
#include "strata/kernels_cpu.h"

namespace strata {
namespace {

// Static activation scales: the largest |input| of each product over `batches` batches of the
// train split, run in fp32 (the table records them), / 127.
void calibrate(Model& model, Int8Table& table, const QuantizeOptions& o, const LoadedParams& lp,
               const Backend& be) {
  // Token shards: the model's vocabulary.
  DatasetInfo info = open_dataset(o.data, {.format = "auto", .val_path = "", .vocab = lp.classes,
                                           .check_part = 0, .check_parts = 1});
  if (info.tokens && lp.input_shape.size() == 1) set_context(info, lp.input_shape[0]);
  if (info.train.sample_shape != lp.input_shape || info.classes != lp.classes)
    fail_input("--data {}: samples {} with {} classes do not fit the model in {} ({} with {} "
               "classes)", o.data, shape_str(info.train.sample_shape), info.classes, o.checkpoint,
               shape_str(lp.input_shape), lp.classes);
  Loader loader(info, "train", o.batch_size, 0, 1, /*shuffle=*/true, /*seed=*/1);
  const int64_t batches = std::min(o.calibrate, loader.batches_per_epoch());
  table.calibrating = true;
  model.set_int8(&table);
  for (int64_t i = 0; i < batches; ++i)
    model.forward(be, loader.next().x, StepInfo{.training = false});
  table.calibrating = false;
  for (auto& [name, w] : table.weights)
    w.act_scale = w.observed_max > 0 ? w.observed_max / 127.f : 0.f;
  fmt::print("calibrated on {} batches of {} samples of {}'s train split: static activation "
             "scales\n", batches, o.batch_size, o.data);
}

}  // namespace

int run_quantize(const QuantizeOptions& o) {
  if (o.calibrate < 0) fail_input("--calibrate {}: must be 0 or more", o.calibrate);
  if (o.calibrate > 0 && o.data.empty())
    fail_input("--calibrate {} needs --data (the dataset whose train split calibrates)",
               o.calibrate);
  if (o.batch_size < 1) fail_input("--batch_size {}: must be 1 or more", o.batch_size);
  refuse_writing_over({"--out", o.out}, {{"--checkpoint", o.checkpoint}, {"--data", o.data}});
  InferenceModel im = load_for_inference(o.checkpoint, "cpu", o.threads);
  if (im.is_int8())
    fail_input("{}: already an int8 file; quantize its parameter file or checkpoint", o.checkpoint);
  const LoadedParams& lp = im.params;
  const Backend& be = *im.be;
  Model& model = *im.model;

  Int8Table table;
  std::set<std::string> quantized_layers;
  int64_t fp32_bytes = 0, int8_bytes = 0;
  for (const Int8Target& t : model.int8_targets()) {
    const Param* src = nullptr;
    for (const Param* p : model.params())
      if (p->name == t.source) src = p;
    STRATA_CHECK(src, "int8 target {} reads {}, which the model lacks", t.name, t.source);
    table.weights[t.name] = quantize_weight(t.source, src->host, t.rows, t.cols);
    fp32_bytes += int64_t(t.rows) * t.cols * 4;
    int8_bytes += int64_t(t.rows) * t.cols + int64_t(t.rows) * 4;
    quantized_layers.insert(t.name.substr(0, t.name.find('.')));
  }
  if (o.calibrate > 0) calibrate(model, table, o, lp, be);

  // Layers with weights that stay fp32: embeddings, LayerNorms (and every bias).
  std::vector<std::string> kept;
  for (const LayerInfo& l : describe_layers(lp.spec, lp.input_shape, lp.classes))
    if (l.params > 0 && !quantized_layers.count(l.name))
      kept.push_back(fmt::format("{} ({})", l.name, l.describe));
  for (const LayerSpec& l : lp.spec)
    if (l.kind == LayerSpec::Kind::kBlock) {
      kept.push_back("in every block its two LayerNorms and the attention's per-head products");
      break;
    }
  const ParamFileMeta meta{.config_toml = lp.prov.config_toml,
                           .dataset_sha256 = lp.prov.dataset_sha256, .step = lp.state.step,
                           .tokenizer = lp.prov.tokenizer};
  make_checkpoint_writer(CheckpointWriterKind::kInt8, nullptr)
      ->write(o.out, {.model = model, .int8 = &table, .meta = meta});
  fmt::print("wrote {}: {} products (linear and convolution weights) in int8 (weights {:.2f} MB -> {:.2f} MB; symmetric "
             "per output channel; activations {}; oneDNN {})\n",
             o.out, table.weights.size(), double(fp32_bytes) / 1e6, double(int8_bytes) / 1e6,
             o.calibrate > 0 ? "with calibrated static scales" : "quantized per row at run time",
             cpu::int8_matmul_kernels());
  fmt::print("stays fp32: {}\n", kept.empty() ? std::string("the biases only")
                                              : fmt::format("{}; the biases", fmt::join(kept, ", ")));
  return kExitOk;
}

}  // namespace strata
