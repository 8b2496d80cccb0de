// `strata eval`: a model's accuracy and loss on a dataset's test split, and its serving throughput.
#include "cli/commands.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "base/files.h"
#include "base/hdf5_util.h"
#include "data/data.h"
#include "model/batch_on_backend.h"
#include "run/evaluate.h"
#include "run/inference.h"
#include "strata/error.h"

namespace strata::cli {

namespace {

// A JSON number; JSON has no NaN or infinity: those are null.
std::string json_value(double x) { return std::isfinite(x) ? fmt::format("{}", x) : "null"; }

struct EvalOptions {
  std::string ckpt, data, device = "auto";
  std::string logits;  // --logits FILE: the first test batch's inputs and logits (HDF5)
  bool json = false, throughput = false;
  int threads = 1;
  int64_t batch_size = 0;  // samples per batch; 0: 1000 rows of logits
  CLI::Option* threads_flag = nullptr;
};

// p-th percentile (nearest rank) of v, which it sorts.
double percentile(std::vector<double>& v, double p) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const size_t k = size_t(std::ceil(p / 100.0 * double(v.size())));
  return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
}

// Samples per second and the latencies of the full batches, leaving out the first (it creates
// oneDNN's kernels for the shape: a cost paid once per process, not per batch served) and a
// last, partial one (another shape, and its own kernels), when there are others.
struct Throughput {
  double samples_per_s = 0;
  std::vector<double> latency;  // seconds per measured batch
  int64_t per_batch = 0;        // samples in each measured batch
};
Throughput throughput_of(const std::vector<double>& seconds, int64_t samples,
                         int64_t batch_samples) {
  Throughput t{.latency = seconds};
  std::vector<double>& lat = t.latency;
  if (lat.size() > 1 && samples % batch_samples != 0) {
    lat.pop_back();
    samples -= samples % batch_samples;
  }
  if (lat.size() > 1) {
    lat.erase(lat.begin());
    samples -= batch_samples;
  }
  double total = 0;
  for (double x : lat) total += x;
  t.samples_per_s = total > 0 ? double(samples) / total : 0.0;
  t.per_batch = lat.empty() ? 0 : samples / int64_t(lat.size());
  return t;
}

// A float32 dataset `name` of `shape` in the open file f.
void write_floats(hid_t f, const char* name, const Shape& shape, const float* data) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Id space(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)), H5Sclose);
  H5Id d(H5_CHECK(H5Dcreate2(f, name, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT)), H5Dclose);
  H5_CHECK(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

// --logits: the model's output on the first batch of the test split, in order, beside its
// inputs (a language model's token ids as floats): /inputs (B, ...), /logits (B, rows, classes).
// For comparing strata's forward with another implementation's on the same weights.
void write_first_logits(Model& model, const Backend& be, const DatasetInfo& info,
                        int64_t samples, const std::string& path) {
  Loader loader(info, "test", samples, 0, 1, /*shuffle=*/false, 0);
  const Loader::Batch& hb = loader.next();
  BatchOnBackend on_be;
  const Tensor& logits = model.forward(be, on_be.put(be, hb).x, StepInfo{.training = false});
  std::vector<float> host(size_t(logits.size()));
  be.download(host.data(), logits.data(), sizeof(float) * host.size());
  std::lock_guard lock(hdf5_mutex());
  h5_quiet();
  H5Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (f.get() < 0) fail_input("--logits {}: cannot create the file", path);
  write_floats(f.get(), "inputs", hb.x.shape, hb.x.data());
  write_floats(f.get(), "logits", {hb.x.dim(0), model.rows_per_sample(), model.classes()}, host.data());
}

}  // namespace

int run_eval(const EvalOptions& o, Comm& comm) {
  InferenceModel im;
  DatasetInfo info;
  collectively(comm, [&] {
    if (o.throughput && comm.size() > 1)
      fail_input("--throughput measures one process serving batches: run strata eval on one "
                 "rank (without mpirun/srun), not {}", comm.size());
    refuse_writing_over({"--logits", o.logits}, {{"--checkpoint", o.ckpt}, {"--data", o.data}});
    if (!o.logits.empty() && comm.size() > 1) fail_input("--logits: run strata eval on one rank");
    if (!o.logits.empty()) ensure_parent_dir(o.logits, "--logits");
    im = load_for_inference(o.ckpt, o.device, o.threads);
    const LoadedParams& lp = im.params;
    // Token shards: the model's vocabulary; the ranks share the token check.
    info = open_dataset(o.data, {.format = "auto", .val_path = "", .vocab = lp.classes,
                                 .check_part = comm.rank(), .check_parts = comm.size()});
    if (info.tokens && lp.input_shape.size() == 1) set_context(info, lp.input_shape[0]);
    if (!info.has_test) fail_input("{}: has no /test split to evaluate", o.data);
    if (info.test.sample_shape != lp.input_shape || info.classes != lp.classes)
      fail_input("{}: samples {} with {} classes do not fit the model in {} ({} with {} classes)",
                 o.data, shape_str(info.test.sample_shape), info.classes, o.ckpt,
                 shape_str(lp.input_shape), lp.classes);
  });
  Model* model = im.model.get();
  const Backend* be = im.be;
  if (!o.logits.empty()) {
    write_first_logits(*model, *be, info, o.batch_size > 0 ? o.batch_size : 4, o.logits);
  }
  const Int8Table& int8 = *im.int8;
  const int64_t rows = model->rows_per_sample();
  const int64_t batch_samples = o.batch_size > 0 ? o.batch_size : std::max<int64_t>(1, 1000 / rows);
  std::vector<double> seconds;
  EvalResult r = evaluate(*model, *be, info, "test", comm,
                          o.batch_size > 0 ? o.batch_size * rows : 1000,
                          o.throughput ? &seconds : nullptr);
  if (comm.rank() != 0) return kExitOk;
  const std::string precision = int8.weights.empty() ? "fp32" : fmt::format("int8 ({} products)", int8.weights.size());
  if (o.json) {
    std::string extra;
    if (o.throughput) {
      auto [sps, lat, per_batch] = throughput_of(seconds, r.samples, batch_samples);
      extra = fmt::format(", \"samples_per_s\": {}, \"tokens_per_s\": {}, \"batches\": {}, "
                          "\"latency_p50_ms\": {}, \"latency_p99_ms\": {}", json_value(sps),
                          json_value(info.tokens ? sps * double(rows) : 0), lat.size(),
                          json_value(1e3 * percentile(lat, 50)), json_value(1e3 * percentile(lat, 99)));
    }
    fmt::print("{{\"accuracy\": {}, \"loss\": {}, \"samples\": {}, \"precision\": \"{}\"{}}}\n",
               json_value(r.accuracy), json_value(r.loss), r.samples,
               int8.weights.empty() ? "fp32" : "int8", extra);
    return kExitOk;
  }
  fmt::print("test accuracy {:.4f}, test loss {:.4f} over {} samples ({})\n", r.accuracy, r.loss,
             r.samples, precision);
  if (o.throughput) {
    auto [sps, lat, per_batch] = throughput_of(seconds, r.samples, batch_samples);
    fmt::print("throughput: {:.1f} samples/s{} on {} with {} thread{} ({} batches of {} samples); "
               "latency per batch p50 {:.3f} ms, p99 {:.3f} ms\n", sps,
               info.tokens ? fmt::format(" ({:.1f} tokens/s)", sps * double(rows)) : "", be->name,
               o.threads, o.threads == 1 ? "" : "s",
               lat.size(), per_batch,
               1e3 * percentile(lat, 50), 1e3 * percentile(lat, 99));
  }
  return kExitOk;
}


Subcommand add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  auto* eval = app.add_subcommand("eval", "evaluate a parameter file (or an int8 file from "
                                          "strata quantize) on a dataset's test split");
  eval->add_option("--checkpoint", o->ckpt, "parameter file written by train, or an int8 file")
      ->required();
  eval->add_option("--data", o->data, "HDF5 dataset with a /test split")->required();
  eval->add_flag("--json", o->json, "print {\"accuracy\": ..., \"loss\": ...}");
  o->threads_flag = eval->add_option("--threads", o->threads)->check(int_in(1, kMaxThreads));
  eval->add_option("--device", o->device)->capture_default_str();
  eval->add_option("--batch_size", o->batch_size,
                   "samples per batch (default: 1000 rows of logits, i.e. 1000 / context "
                   "sequences for a language model)")
      ->check(int_in(1, INT32_MAX));
  eval->add_option("--logits", o->logits,
                   "also write the first test batch's inputs and logits (--batch_size samples, "
                   "default 4) to this HDF5 file");
  eval->add_flag("--throughput", o->throughput,
                 "also report samples/s (tokens/s) and each batch's latency, p50 and p99 (the first "
                 "batch, which builds the kernels, left out)");
  return {eval, [o](Comm& comm) {
            collectively(comm, [&] { o->threads = threads_from(o->threads_flag, o->threads); });
            return run_eval(*o, comm);
          }};
}

}  // namespace strata::cli
