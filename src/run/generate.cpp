#include "run/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "data/tokenizer_identity.h"
#include "model/model.h"
#include "run/inference.h"
#include "strata/backend.h"
#include "strata/error.h"
#include "strata/rng.h"

namespace strata {
namespace {

// The model's tokenizer (see generate.h); nullopt: bytes. V: the model's output width.
std::optional<Gpt2Tokenizer> model_tokenizer(const GenerateOptions& o, const LoadedParams& lp) {
  const std::string name = tokenizer_name(lp.prov.tokenizer);
  std::optional<Gpt2Tokenizer> tok;
  if (name == "gpt2" || (lp.prov.tokenizer.empty() && !o.vocab.empty())) {
    tok = load_recorded_gpt2(lp.prov.tokenizer, o.vocab, o.checkpoint);
    if (lp.classes < tok->vocab_size())
      fail_input("{}: a vocabulary of {}; GPT-2's tokenizer ({}) has {} tokens", o.checkpoint,
                 lp.classes, tok->files()[0], tok->vocab_size());
  } else if (name != "bytes") {
    fail_input("{}: tokenizer = \"{}\"; strata generate knows bytes and gpt2", o.checkpoint, name);
  } else if (!o.vocab.empty() && !lp.prov.tokenizer.empty()) {
    fail_input("--vocab {}: {} was trained on bytes (tokenizer = \"bytes\"), not GPT-2's tokens",
               o.vocab, o.checkpoint);
  } else if (lp.classes != 256) {
    fail_input("{}: a vocabulary of {} and no tokenizer recorded; the byte-level tokenizer has "
               "256 (for GPT-2's tokens, name its vocabulary with --vocab DIR)",
               o.checkpoint, lp.classes);
  }
  return tok;
}

}  // namespace

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
  const std::optional<Gpt2Tokenizer> tok = model_tokenizer(o, lp);
  const Backend& be = *im.be;
  Model& model = *im.model;

  const int T = int(lp.input_shape[0]), V = lp.classes;
  const int sampled = tok ? tok->vocab_size() : V;  // the ids a token may take
  // Bytes: a token is a byte, and an empty prompt starts from a newline. GPT-2: from
  // <|endoftext|>, as GPT-2 starts a document.
  std::vector<int> seq;
  if (tok) {
    for (int32_t id : tok->encode(o.prompt)) seq.push_back(id);
    if (seq.empty()) seq.push_back(kGpt2EndOfText);
  } else {
    for (unsigned char c : o.prompt) seq.push_back(c);
    if (seq.empty()) seq.push_back('\n');
  }
  fmt::print("{}", o.prompt);
  std::fflush(stdout);

  // Every step runs the model over the last T tokens, padded at the end: attention is causal,
  // so the logits at the last real position do not depend on the padding.
  Tensor x({1, T}), logits_host({T, V});
  Tensor xd = to_backend(be, x);
  Rng rng(hash_combine(o.seed, 0x6E4E));
  std::vector<double> p(static_cast<size_t>(sampled), 0.0);
  std::vector<int> order(static_cast<size_t>(sampled));
  for (int k = 0; k < o.tokens; ++k) {
    const int len = std::min<int>(int(seq.size()), T);
    const int from = int(seq.size()) - len;
    x.zero();
    for (int t = 0; t < len; ++t) x.data()[t] = float(seq[size_t(from + t)]);
    be.upload(xd.data(), x.data(), sizeof(float) * size_t(T));
    const Tensor& logits = model.forward(be, xd, StepInfo{.training = false});
    be.download(logits_host.data(), logits.data(), sizeof(float) * size_t(T) * size_t(V));
    const float* row = logits_host.data() + int64_t(len - 1) * V;
    int next = int(std::max_element(row, row + sampled) - row);
    if (o.temperature > 0) {
      // Softmax of logits / temperature over the top_k (or all) tokens, in double.
      std::iota(order.begin(), order.end(), 0);
      int keep = sampled;
      if (o.top_k > 0 && o.top_k < sampled) {
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
    if (tok) {
      const std::string& bytes = tok->token_bytes(next);  // part of a character, maybe
      std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    } else {
      std::fputc(next, stdout);
    }
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
  return kExitOk;
}

}  // namespace strata
