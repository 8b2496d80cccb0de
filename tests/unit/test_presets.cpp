// GPT-2 presets (model.preset), the padded token table (model.pad_vocab) and the per-rank
// memory estimate the start-up report prints (run/memory_estimate.h).
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/loss.h"
#include "model/model.h"
#include "model/optim.h"
#include "run/memory_estimate.h"
#include "strata/backend.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using namespace strata;
using strata::test::user_error;

namespace {

RunConfig from_toml(const std::string& text) {
  RunConfig c;
  read_config_text(text, "t.toml", c);
  return c;
}

int64_t used_parameters(const RunConfig& c) {
  return count_parameters(describe_layers(c.model_spec(c.model.vocab), {c.model.context}, c.model.vocab)).used;
}

}  // namespace

TEST_CASE("presets: GPT-2's four shapes and their published parameter counts", "[presets]") {
  // The counts Hugging Face's GPT2LMHeadModel gives (tied head, biases, unpadded vocabulary).
  const std::pair<const char*, int64_t> published[] = {
      {"gpt2", 124439808}, {"gpt2-medium", 354823168}, {"gpt2-large", 774030080}, {"gpt2-xl", 1557611200}};
  for (const auto& [name, count] : published) {
    RunConfig c = from_toml(fmt::format("[model]\npreset = \"{}\"\n", name));
    CHECK(c.model.type == "gpt");
    CHECK(c.model.context == 1024);
    CHECK(c.model.vocab == 50257);
    CHECK(c.model.pad_vocab);
    const auto layers = describe_layers(c.model_spec(50257), {1024}, 50257);
    const ParameterCount n = count_parameters(layers);
    CHECK(n.used == count);
    CHECK(n.allocated == count + (50304 - 50257) * int64_t(c.model.dim));  // llm.c's padded V
    CHECK(layers.front().describe == fmt::format("Embedding(vocab 50257, dim {}, context 1024, table padded to "
                                                 "50304 rows)", c.model.dim));
  }
  CHECK(from_toml("[model]\npreset = \"gpt2-xl\"\n").model.heads == 25);
  CHECK(from_toml("[model]\npreset = \"gpt2-large\"\n").model.gpt_blocks() == 36);
}

TEST_CASE("presets: keys that agree are fine, keys that differ name both, pad_vocab may be turned off",
          "[presets]") {
  RunConfig c = from_toml("[model]\npreset = \"gpt2\"\ntype = \"gpt\"\ndim = 768\nlayers = 12\npad_vocab = false\n");
  CHECK(c.model.dim == 768);
  CHECK_FALSE(c.model.pad_vocab);
  CHECK(used_parameters(c) == 124439808);
  CHECK(count_parameters(describe_layers(c.model_spec(50257), {1024}, 50257)).allocated == 124439808);

  CHECK_THAT(user_error([] { from_toml("[model]\npreset = \"gpt2\"\ndim = 512\n"); }),
             Contains("config t.toml:3:7: model.dim = 512 conflicts with model.preset = \"gpt2\" "
                      "(config t.toml:2:10), which sets model.dim = 768"));
  CHECK_THAT(user_error([] { from_toml("[model]\nlayers = 6\npreset = \"gpt2\"\n"); }),
             Contains("model.layers = 6 conflicts with model.preset = \"gpt2\" (config t.toml:3:10), "
                      "which sets model.layers = 12"));
  CHECK_THAT(user_error([] { from_toml("[model]\npreset = \"gpt4\"\n"); }),
             Contains("key model.preset: expected one of none, gpt2, gpt2-medium, gpt2-large, gpt2-xl"));
  // A flag after the file: checked against the preset the file set.
  ConfigFlags flags;
  strata::test::TempDir dir;
  flags.config_path = dir.file("c.toml");
  std::ofstream(flags.config_path) << "[model]\npreset = \"gpt2-medium\"\n";
  flags.given["model.heads"] = {"12"};
  RunConfig f;
  CHECK_THAT(user_error([&] { apply_config(flags, f); }),
             Contains("flag --model.heads: model.heads = 12 conflicts with model.preset = \"gpt2-medium\""));
  // The effective config reads back to itself (the preset and the keys it set, together).
  const std::string once = from_toml("[model]\npreset = \"gpt2-large\"\n").to_toml();
  CHECK(from_toml(once).to_toml() == once);
  CHECK_THAT(once, Contains("preset = \"gpt2-large\"") && Contains("dim = 1280") && Contains("pad_vocab = true"));
}

TEST_CASE("padded token table: the same losses and gradients as unpadded, padding rows zero and unused",
          "[presets]") {
  std::string why;
  const Backend& be = select_backend({.device = "cpu", .threads = 1}, &why);
  const int V = 300, T = 8, B = 2;  // 300 rows padded to 384
  struct Outcome {
    double loss;
    Shape logits, table;
    std::string table_name, spec;
    std::vector<float> value, grad;  // the token table's, after one AdamW step
  };
  auto run = [&](bool pad) {
    RunConfig c = from_toml(fmt::format("[model]\ntype = \"gpt\"\nlayers = 1\nheads = 2\ndim = 16\n"
                                        "context = {}\npad_vocab = {}\n", T, pad));
    Model m(c.model_spec(V), {T}, V);
    m.init(7);
    Tensor x({B, T});
    std::vector<int32_t> labels(size_t(B * T));
    for (int i = 0; i < B * T; ++i) x.data()[i] = float((i * 37) % V), labels[size_t(i)] = (i * 91 + 5) % V;
    const Tensor& logits = m.forward(be, x, {});
    SoftmaxXentHead head(V, T);
    Tensor dlogits;
    Outcome o;
    o.loss = head.loss_and_gradient(be, logits, labels.data(), B, B, dlogits);
    o.logits = logits.shape;
    m.backward(be, dlogits, 0);
    Optimizer opt({.kind = "adamw", .lr = 0.01, .weight_decay = 0.1}, m.num_params());
    opt.step(be, m.values(), m.grads(), 0);
    for (const Param* p : m.params())
      if (p->name == "embedding1.wte") {
        o.table_name = p->name, o.table = p->shape;
        o.value.assign(p->value, p->value + numel(p->shape));
        o.grad.assign(p->grad, p->grad + numel(p->shape));
      }
    o.spec = m.spec().front().text();
    return o;
  };
  const Outcome plain = run(false), padded = run(true);
  CHECK(plain.loss == padded.loss);        // bitwise: the padding rows never reach the softmax
  CHECK(padded.logits == Shape{B, T, V});  // logits over the real vocabulary only
  REQUIRE(plain.table == Shape{V, 16});
  REQUIRE(padded.table == Shape{384, 16});
  const size_t real = size_t(V) * 16;
  CHECK(std::memcmp(plain.value.data(), padded.value.data(), sizeof(float) * real) == 0);
  CHECK(std::memcmp(plain.grad.data(), padded.grad.data(), sizeof(float) * real) == 0);
  for (size_t i = real; i < padded.value.size(); ++i) {
    REQUIRE(padded.value[i] == 0.0f);  // zero from init, and AdamW's decay keeps zero at zero
    REQUIRE(padded.grad[i] == 0.0f);
  }
  // The model files' description keeps the padding; an unpadded one reads as before.
  CHECK(padded.spec == "embedding 16 128");
  CHECK(plain.spec == "embedding 16");
}

TEST_CASE("memory estimate: each part from the layers, the grid and the schedule", "[presets]") {
  // A tiny MLP whose figures are counted by hand: flatten (8x8 -> 64), fc1 64 -> 8, fc2 8 -> 4.
  const auto layers = describe_layers({"flatten", "linear 8", "linear 4"}, {1, 8, 8}, 4);
  RankShape r{.chunks = {{0, -1}}, .optimizer_states = 2, .micro_batch = 10, .classes = 4};
  MemoryEstimate e = estimate_rank_memory(layers, r);
  CHECK(e.parameters == 4 * (512 + 64 + 64 + 64));  // fc1 512 + 8, fc2 32 + 4: each padded to 64
  CHECK(e.gradients == e.parameters);
  CHECK(e.optimizer == 2 * e.parameters);
  // Outputs 8 + 4 per sample (flatten's is a view), fc2's input gradient 8 (nothing below
  // fc1, the first layer with parameters), and the loss's softmax and gradient 2 x 4.
  CHECK(e.activations == 4.0 * 28 * 10);
  CHECK(e.workspace == kRuntimeBytes);
  CHECK(e.whole_model == 0);
  CHECK(e.total() == e.parameters * 4 + e.activations + e.workspace);

  r.zero = 1, r.replicas = 4;  // ZeRO shards the optimizer state only
  CHECK(estimate_rank_memory(layers, r).optimizer == e.optimizer / 4);
  CHECK(estimate_rank_memory(layers, r).gradients == e.gradients);
  r = {.chunks = {{0, -1}}, .optimizer_states = 2, .micro_batch = 10, .live_microbatches = 3,
       .whole_model = true, .classes = 4};
  CHECK(estimate_rank_memory(layers, r).activations == 4.0 * (20 * 10 * 3 + 8 * 10));
  CHECK(estimate_rank_memory(layers, r).whole_model == 4 * e.parameters);
  // A later pipeline stage (fc2 alone) sends its input gradient back: its input counts.
  r = {.chunks = {{2, 3}}, .micro_batch = 10, .classes = 4};
  CHECK(estimate_rank_memory(layers, r).activations == 4.0 * ((4 + 8) * 10 + 8 * 10));
  CHECK(estimate_rank_memory(layers, r).parameters == 4 * 128);

  // A GPT block: its internal activations unless recomputed, and the scratch blocks share.
  const auto gpt = describe_layers({"embedding 16", "block 2", "layernorm", "lmhead"}, {8}, 50);
  RankShape g{.chunks = {{0, -1}}, .micro_batch = 3, .classes = 50, .rows_per_sample = 8};
  const MemoryEstimate kept = estimate_rank_memory(gpt, g);
  g.recompute = true;
  const MemoryEstimate recomputed = estimate_rank_memory(gpt, g);
  REQUIRE(gpt[1].internal_bytes > 0);
  CHECK(kept.activations - recomputed.activations == 3.0 * double(gpt[1].internal_bytes));
  CHECK(recomputed.workspace - kept.workspace == 3.0 * double(gpt[1].internal_bytes) + 4.0 * 3 * 8 * 16);
  CHECK(kept.workspace - kRuntimeBytes == 4.0 * 3 * 8 * 16 * 15);  // 15 (T, C) floats per sample
}

TEST_CASE("thousands separators", "[presets]") {
  CHECK(thousands(124439808) == "124,439,808");
  CHECK(thousands(999) == "999");
  CHECK(thousands(1000) == "1,000");
  CHECK(thousands(0) == "0");
}

TEST_CASE("model.gelu: presets set tanh unless given, the block's text records it", "[presets]") {
  CHECK(from_toml("[model]\npreset = \"gpt2\"\n").model.gelu == "tanh");
  CHECK(from_toml("[model]\npreset = \"gpt2\"\ngelu = \"erf\"\n").model.gelu == "erf");
  CHECK(from_toml("[model]\ntype = \"gpt\"\n").model.gelu == "erf");
  CHECK_THAT(user_error([] { from_toml("[model]\ngelu = \"fast\"\n"); }),
             Contains("model.gelu") && Contains("erf, tanh"));
  // The layer text: a trailing "tanh" (after "recompute" when both), none for erf (as every
  // file written before model.gelu), read back to the same spec.
  RunConfig c = from_toml("[model]\ntype = \"gpt\"\nlayers = 1\nheads = 2\ndim = 8\ngelu = \"tanh\"\n");
  CHECK(c.model_spec(16)[1].text() == "block 2 0 tanh");
  c.train.recompute = "block";
  CHECK(c.model_spec(16)[1].text() == "block 2 0 recompute tanh");
  c.model.gelu = "erf";
  CHECK(c.model_spec(16)[1].text() == "block 2 0 recompute");
  for (const char* text : {"block 2 0 tanh", "block 2 0.1 recompute tanh", "block 2 0 tanh recompute"}) {
    const LayerSpec s(text);
    CHECK(s.gelu_tanh);
    CHECK(LayerSpec(s.text()) == s);
    CHECK_FALSE(s == LayerSpec("block 2 0.1 recompute"));
  }
  CHECK_FALSE(LayerSpec("block 2").gelu_tanh);
  CHECK_THAT(user_error([] { LayerSpec("block 2 0 tanh tanh"); }),
             Contains("'block 2 0 tanh tanh': after the dropout come 'recompute' and 'tanh', each at most once"));
  CHECK_THAT(user_error([] { LayerSpec("block 2 0 erf"); }), Contains("after the dropout come"));
  // The built block says which GELU it runs.
  const auto layers = describe_layers({"embedding 8", "block 2 0 tanh", "layernorm", "lmhead"}, {4}, 16);
  CHECK(layers[1].describe == "Block(dim 8, heads 2, tanh GELU)");
}
