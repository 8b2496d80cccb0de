#include "run/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "model/model.h"
#include "run/inference.h"
#include "strata/backend.h"
#include "strata/error.h"
#include "strata/rng.h"

namespace strata {

int run_generate(const GenerateOptions& o) {
  if (o.tokens < 0) fail_input("--tokens {}: must be 0 or more", o.tokens);
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    fail_input("--temperature {}: must be a finite number, 0 or more", o.temperature);
  if (o.top_k < 0) fail_input("--top_k {}: must be 0 or more", o.top_k);
  InferenceModel im = load_for_inference(o.checkpoint, o.device, o.threads);
  const LoadedParams& lp = im.params;
  if (lp.spec.empty() || lp.spec.front().kind != LayerSpec::Kind::kEmbedding || lp.input_shape.size() != 1)
    fail_input("{}: not a language model (strata generate takes a model.type = \"gpt\" run's "
               "model.h5 or checkpoint)", o.checkpoint);
  if (lp.classes != 256)
    fail_input("{}: a vocabulary of {}; strata generate knows the byte-level tokenizer (256)",
               o.checkpoint, lp.classes);
  const Backend& be = *im.be;
  Model& model = *im.model;

  const int T = int(lp.input_shape[0]), V = lp.classes;
  // The byte-level tokenizer: a token is a byte. An empty prompt starts from a newline.
  std::vector<int> seq;
  for (unsigned char c : o.prompt) seq.push_back(c);
  if (seq.empty()) seq.push_back('\n');
  fmt::print("{}", o.prompt);
  std::fflush(stdout);

  // Every step runs the model over the last T tokens, padded at the end: attention is causal,
  // so the logits at the last real position do not depend on the padding.
  Tensor x({1, T}), logits_host({T, V});
  Tensor xd = to_backend(be, x);
  Rng rng(hash_combine(o.seed, 0x6E4E));
  std::vector<double> p(static_cast<size_t>(V), 0.0);
  std::vector<int> order(static_cast<size_t>(V));
  for (int k = 0; k < o.tokens; ++k) {
    const int len = std::min<int>(int(seq.size()), T);
    const int from = int(seq.size()) - len;
    x.zero();
    for (int t = 0; t < len; ++t) x.data()[t] = float(seq[size_t(from + t)]);
    be.upload(xd.data(), x.data(), sizeof(float) * size_t(T));
    const Tensor& logits = model.forward(be, xd, StepInfo{.training = false});
    be.download(logits_host.data(), logits.data(), sizeof(float) * size_t(T) * size_t(V));
    const float* row = logits_host.data() + int64_t(len - 1) * V;
    int next = int(std::max_element(row, row + V) - row);
    if (o.temperature > 0) {
      // Softmax of logits / temperature over the top_k (or all) tokens, in double.
      std::iota(order.begin(), order.end(), 0);
      int keep = V;
      if (o.top_k > 0 && o.top_k < V) {
        keep = o.top_k;
        std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                          [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      }
      double mx = -INFINITY, sum = 0;
      for (int i = 0; i < keep; ++i) mx = std::max(mx, double(row[order[size_t(i)]]));
      for (int i = 0; i < keep; ++i)
        sum += p[size_t(i)] = std::exp((double(row[order[size_t(i)]]) - mx) / o.temperature);
      double u = double(rng.uniform(0.f, 1.f)) * sum;
      next = order[size_t(keep - 1)];
      for (int i = 0; i < keep; ++i)
        if ((u -= p[size_t(i)]) < 0) {
          next = order[size_t(i)];
          break;
        }
    }
    seq.push_back(next);
    std::fputc(next, stdout);
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
  return kExitOk;
}

}  // namespace strata
