#include "run/evaluate.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>

#include "model/batch_on_backend.h"
#include "model/loss.h"

namespace strata {
namespace {

// One pass over a split, this replica's share of each batch: `batch_sums` gives a batch's
// {sum of per-row losses, correct predictions} (0 on ranks that do not hold the logits);
// the sums are added over `comm`. A sample has `rows` rows of logits (a language model's T
// positions; 1 for a classifier): loss and accuracy are per row.
EvalResult evaluate_split(
    const DatasetInfo& info, const std::string& split, int64_t batch, int replica, int replicas,
    Comm& comm, int64_t rows,
    const std::function<std::pair<double, int64_t>(const Loader::Batch&, int64_t)>& batch_sums,
    std::vector<double>* batch_seconds = nullptr) {
  // `batch` counts rows of logits: a language model's T rows per sample make its batches
  // T times fewer samples (its activations per sample are T times larger).
  batch = std::max<int64_t>(1, batch / rows);
  Loader loader(info, split, std::max<int64_t>(batch, replicas), replica, replicas,
                /*shuffle=*/false, 0);
  double sums[2] = {0, 0};  // loss, correct
  for (int64_t i = 0, n = loader.batches_per_epoch(); i < n; ++i) {
    const auto& b = loader.next();
    const int64_t bs = b.x.dim(0);  // samples; the same on every stage of a replica
    if (bs == 0) continue;
    const auto t0 = std::chrono::steady_clock::now();
    auto [loss, correct] = batch_sums(b, bs);
    if (batch_seconds)
      batch_seconds->push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    sums[0] += loss;
    sums[1] += double(correct);
  }
  comm.allreduce_sum(sums, 2);
  const SplitInfo& si = split == "test" ? info.test : info.train;
  const double n = double(si.n) * double(rows);
  return {.accuracy = sums[1] / n, .loss = sums[0] / n, .samples = si.n};
}
}  // namespace

EvalResult evaluate_replica(Model& model, const Backend& be, const DatasetInfo& info,
                            const std::string& split, Comm& comm, int replica, int replicas,
                            bool counts, int64_t batch, std::vector<double>* batch_seconds) {
  BatchOnBackend on_be;
  SoftmaxXentHead head(model.classes(), model.rows_per_sample());
  return evaluate_split(info, split, batch, replica, replicas, comm, model.rows_per_sample(),
                        [&](const Loader::Batch& hb, int64_t bs) {
    const auto b = on_be.put(be, hb);
    const Tensor& logits = model.forward(be, b.x, StepInfo{.training = false});
    if (!counts) return std::pair<double, int64_t>{0, 0};
    return head.loss_and_correct(be, logits, b.y, bs);
  }, batch_seconds);
}

EvalResult evaluate(Model& model, const Backend& be, const DatasetInfo& info,
                    const std::string& split, Comm& comm, int64_t batch,
                    std::vector<double>* batch_seconds) {
  return evaluate_replica(model, be, info, split, comm, comm.rank(), comm.size(), true, batch,
                          batch_seconds);
}

EvalResult evaluate_pipelined(PipelineStage& pipe, const Backend& be, const DatasetInfo& info,
                              const std::string& split, Comm& world, const ProcessGrid& grid,
                              int64_t rows_per_sample, int64_t batch) {
  BatchOnBackend on_be;
  return evaluate_split(info, split, batch, grid.replica, grid.replicas, world,
                        rows_per_sample,
                        [&](const Loader::Batch& hb, int64_t bs) {
    const auto b = on_be.put(be, hb);
    auto sums = pipe.forward_only(be, b.x, b.y, bs);
    // Every part of a tensor group holds the logits: part 0's count.
    return grid.tensor == 0 ? sums : std::pair<double, int64_t>{0, 0};
  });
}

}  // namespace strata
