// Backward split into B (input gradients) and W (parameter gradients), as the zero-bubble
// schedules run it: for every layer kind, B then W must write exactly what the whole
// backward writes, bitwise: the input gradient and every parameter gradient, over two
// micro-batches in two activation slots (the second accumulating), in the order a schedule
// uses (B 0, B 1, W 0, W 1).
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "model/model.h"
#include "strata/backend.h"
#include "strata/rng.h"

using namespace strata;

namespace {

struct Case {
  const char* name;
  ModelSpec spec;
  Shape input;
  int classes;
  LayerRange range;  // a later stage's range computes the input gradient of every layer
  bool tokens;       // input is token ids
};

const Case kCases[] = {
    {"linear, linear+relu (first stage: no input gradient)", {"flatten", "linear 12", "relu", "linear 8"}, {2, 3, 4}, 8, {}, false},
    {"linear, linear+relu (later stage)", {"flatten", "linear 12", "relu", "linear 8"}, {2, 3, 4}, 8, {1, -1}, false},
    {"conv+pool, conv (first stage)", {"conv 4 3 1 1", "maxpool 2 2", "relu", "conv 6 3 1 1", "relu", "flatten", "linear 5"}, {2, 8, 8}, 5, {}, false},
    {"conv, conv+pool (later stage)", {"conv 4 3 1 1", "relu", "conv 6 3 1 1", "maxpool 2 2", "relu", "flatten", "linear 5"}, {2, 8, 8}, 5, {1, -1}, false},
    {"embedding, blocks with dropout, layernorm, tied LM head", {"embedding 16", "block 4 0.1", "block 4 0.1", "layernorm", "lmhead"}, {8}, 32, {}, true},
    {"blocks, layernorm, LM head (later stage)", {"embedding 16", "block 4 0.1", "block 4", "layernorm", "lmhead"}, {8}, 32, {1, -1}, true},
    {"blocks that recompute (run whole in B)", {"embedding 16", "block 4 0.1 recompute", "block 4 0 recompute", "layernorm", "lmhead"}, {8}, 32, {1, -1}, true},
};

constexpr int64_t kBatch = 3;

struct Outcome {
  std::vector<float> grads;
  std::vector<std::vector<float>> dx;  // per micro-batch; empty on a first stage
};

std::vector<float> copy(const float* p, int64_t n) { return std::vector<float>(p, p + n); }

Outcome run(const Case& c, bool split) {
  const Backend& be = cpu_backend();
  Model m(c.spec, c.input, c.classes, c.range);
  m.init(5);
  m.place(be);
  std::vector<Tensor> xs, dys;
  for (int k = 0; k < 2; ++k) {
    Rng rng(40 + uint64_t(k));
    Tensor x(batched(kBatch, m.stage_input_shape()));
    for (int64_t i = 0; i < x.size(); ++i)
      x[i] = c.tokens && c.range.first == 0 ? float(int(rng.uniform(0.f, 1.f) * float(c.classes)) % c.classes)
                                            : rng.uniform(-1.f, 1.f);
    Tensor dy(batched(kBatch, m.stage_output_shape()));
    for (int64_t i = 0; i < dy.size(); ++i) dy[i] = rng.uniform(-0.1f, 0.1f);
    xs.push_back(std::move(x));
    dys.push_back(std::move(dy));
  }
  for (int k = 0; k < 2; ++k)
    m.forward(be, xs[size_t(k)], StepInfo{.training = true, .seed = 3, .step = 1,
                                          .first_sample = k * kBatch, .slot = k});
  Outcome o;
  auto keep = [&](const Tensor* dx) {
    if (dx) o.dx.push_back(copy(dx->data(), dx->size()));
  };
  if (!split) {
    for (int k = 0; k < 2; ++k) keep(m.backward(be, dys[size_t(k)], k, {}, k > 0));
  } else {
    for (int k = 0; k < 2; ++k) keep(m.backward_input(be, dys[size_t(k)], k, k > 0));
    for (int k = 0; k < 2; ++k) m.backward_weight(be, k, {}, k > 0);
  }
  o.grads = copy(m.grads().data(), m.grads().size());
  return o;
}

bool bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

}  // namespace

TEST_CASE("backward split: B then W write the whole backward's gradients bitwise", "[pipeline][split]") {
  for (const Case& c : kCases) {
    INFO(c.name);
    const Outcome whole = run(c, false), split = run(c, true);
    REQUIRE(!whole.grads.empty());
    CHECK(bitwise(whole.grads, split.grads));
    REQUIRE(whole.dx.size() == split.dx.size());
    CHECK(whole.dx.size() == (c.range.first > 0 ? 2u : 0u));
    for (size_t k = 0; k < whole.dx.size(); ++k) CHECK(bitwise(whole.dx[k], split.dx[k]));
    // The check can fail: every gradient is non-zero somewhere.
    bool any = false;
    for (float v : whole.grads) any = any || v != 0.f;
    CHECK(any);
  }
}

TEST_CASE("backward split: which layers split", "[pipeline][split]") {
  Model mlp({"flatten", "linear 12", "relu", "linear 8"}, {2, 3, 4}, 8);
  Model gpt({"embedding 16", "block 4", "block 4 0 recompute", "layernorm", "lmhead"}, {8}, 32);
  std::vector<std::string> split, whole;
  for (Model* m : {&mlp, &gpt})
    for (auto& l : m->layers()) (l->splits_backward() ? split : whole).push_back(l->name);
  CHECK(split == std::vector<std::string>{"fc1", "fc2", "embedding1", "block1", "layernorm1", "lmhead1"});
  CHECK(whole == std::vector<std::string>{"flatten1", "block2"});
}
