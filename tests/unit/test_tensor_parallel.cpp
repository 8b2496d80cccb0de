// Tensor-parallel parameter parts (no MPI: tests/mpi/gpt_grid_equivalence.py runs the grids).
#include <catch2/catch.hpp>

#include <cstring>

#include "strata/model.h"

using namespace strata;

namespace {
const ModelSpec kGpt = {"embedding 16", "block 4", "block 4", "layernorm", "lmhead"};
const Shape kInput = {8};  // context 8
constexpr int kVocab = 32;

Model part(int t, int parts, LayerRange r = {}) {
  return Model(kGpt, kInput, kVocab, r, TensorSplit{.rank = t, .size = parts, .comm = nullptr});
}
}  // namespace

TEST_CASE("tensor parallel: the parts of an initialised model assemble into the whole model", "[tp]") {
  for (int parts : {2, 4}) {
    Model whole(kGpt, kInput, kVocab);
    whole.init(11);
    std::vector<Model> ms;
    for (int t = 0; t < parts; ++t) ms.push_back(part(t, parts));
    std::vector<const float*> from;
    for (auto& m : ms) {
      m.init(11);
      from.push_back(m.host_values().data());
      // Split tensors are smaller; the whole block is the whole model's size.
      CHECK(m.block_params() < whole.num_params());
      CHECK(m.whole_block_params() == whole.num_params());
    }
    std::vector<float> assembled(size_t(whole.num_params()), -1.0f);
    ms[0].assemble(from, assembled.data());
    CHECK(std::memcmp(assembled.data(), whole.host_values().data(),
                      sizeof(float) * assembled.size()) == 0);
    // And each part is cut back out of the whole exactly.
    for (int t = 0; t < parts; ++t) {
      std::vector<float> mine(size_t(ms[size_t(t)].block_params()), -1.0f);
      ms[size_t(t)].extract(whole.host_values().data(), mine.data());
      CHECK(std::memcmp(mine.data(), from[size_t(t)], sizeof(float) * mine.size()) == 0);
    }
  }
}

TEST_CASE("tensor parallel: c_attn's part holds its heads' rows of q, k and v", "[tp]") {
  Model whole(kGpt, kInput, kVocab), p1 = part(1, 2);
  whole.init(3);
  p1.init(3);
  auto find = [](Model& m, const std::string& name) -> Param* {
    for (Param* p : m.params())
      if (p->name == name) return p;
    FAIL("no parameter " << name);
    return nullptr;
  };
  const Param* w = find(whole, "block1.attn.c_attn.weight");  // (48, 16): q, k, v rows
  const Param* h = find(p1, "block1.attn.c_attn.weight");     // (24, 16): rows 8-15 of each
  REQUIRE(h->shape == Shape{24, 16});
  for (int g = 0; g < 3; ++g)
    for (int r = 0; r < 8; ++r)
      CHECK(std::memcmp(h->host + (g * 8 + r) * 16, w->host + (g * 16 + 8 + r) * 16,
                        16 * sizeof(float)) == 0);
  const Param* wp = find(whole, "block1.mlp.c_proj.weight");  // (16, 64): columns 32-63
  const Param* hp = find(p1, "block1.mlp.c_proj.weight");
  REQUIRE(hp->shape == Shape{16, 32});
  for (int r = 0; r < 16; ++r)
    CHECK(std::memcmp(hp->host + r * 32, wp->host + r * 64 + 32, 32 * sizeof(float)) == 0);
}

TEST_CASE("pipeline: the LM head's stage holds a copy of the token table, outside its block", "[tp]") {
  Model whole(kGpt, kInput, kVocab), first(kGpt, kInput, kVocab, {0, 2}),
      last(kGpt, kInput, kVocab, {2, 5});
  for (Model* m : {&whole, &first, &last}) m->init(5);
  CHECK(whole.tied_table() == nullptr);  // head and embedding together: no copy
  Param* table = first.tied_table();
  Param* copy = last.tied_table();
  REQUIRE(table);
  REQUIRE(copy);
  CHECK(copy->name == "embedding1.wte");
  CHECK(copy->offset == last.block_params());  // after the stage's block
  CHECK(last.num_params() == last.block_params() + kVocab * 16);
  CHECK(std::memcmp(copy->host, table->host, sizeof(float) * kVocab * 16) == 0);  // same init
  // The gradient norm counts the table once: not the copy.
  for (auto [b, e] : last.norm_ranges()) CHECK(e <= last.block_params());
}
