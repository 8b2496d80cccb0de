// Tensor-parallel parameter parts (no MPI: tests/mpi/gpt_grid_equivalence.py runs the grids).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "model/model.h"

using namespace strata;

namespace {
const ModelSpec kGpt = {"embedding 16", "block 4", "block 4", "layernorm", "lmhead"};
const Shape kInput = {8};  // context 8
constexpr int kVocab = 32;

Model part(int t, int parts, LayerRange r = {}) {
  return Model(kGpt, kInput, kVocab, r, TensorSplit{.rank = t, .size = parts, .comm = nullptr});
}
// A model's flat buffer before assembly: -1 where a tensor lies (each must be written), 0 in
// the padding after each tensor (the buffers' padding is zero and stays zero).
std::vector<float> unwritten(const Model& m, int64_t size) {
  std::vector<float> v(size_t(size), 0.0f);
  for (const Param* p : m.params()) std::fill_n(v.begin() + p->offset, numel(p->shape), -1.0f);
  return v;
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
      CHECK(m.layout().block_params() < whole.num_params());
      CHECK(m.layout().whole_block_params() == whole.num_params());
    }
    std::vector<float> assembled = unwritten(whole, whole.num_params());
    ms[0].layout().assemble(from, assembled.data());
    CHECK(std::memcmp(assembled.data(), whole.host_values().data(),
                      sizeof(float) * assembled.size()) == 0);
    // And each part is cut back out of the whole exactly.
    for (int t = 0; t < parts; ++t) {
      std::vector<float> mine = unwritten(ms[size_t(t)], ms[size_t(t)].layout().block_params());
      ms[size_t(t)].layout().extract(whole.host_values().data(), mine.data());
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
  CHECK(whole.tied().shared() == nullptr);  // head and embedding together: no copy
  Param* table = first.tied().shared();
  Param* copy = last.tied().shared();
  REQUIRE(table);
  REQUIRE(copy);
  CHECK(copy->name == "embedding1.wte");
  CHECK(copy->offset == last.layout().block_params());  // after the stage's block
  CHECK(last.num_params() == last.layout().block_params() + flat_span(kVocab * 16));
  CHECK(std::memcmp(copy->host, table->host, sizeof(float) * kVocab * 16) == 0);  // same init
  // The gradient norm counts the table once: not the copy.
  for (const FlatPieces& r : last.layout().norm_ranges())
    for (auto [b, n] : r) CHECK(b + n <= last.layout().block_params());
}

// The flat buffers: every tensor at a 256-byte boundary (the GPU's GEMM and convolution
// operands), the padding after it zero, and the packed layout (the gradient norm's order,
// ZeRO's split) the tensors back to back.
TEST_CASE("flat buffers: every tensor starts on a 256-byte boundary, padding zero", "[tp]") {
  const ModelSpec cnn = {"conv 5 3", "relu", "maxpool 2", "flatten", "linear 7", "linear 10"};
  std::vector<Model> models;
  models.emplace_back(cnn, Shape{1, 9, 9}, 10);
  models.emplace_back(kGpt, kInput, kVocab);
  models.push_back(part(1, 2));                    // a tensor part
  models.push_back(part(0, 1, LayerRange{3, -1}));  // the head's stage: the table's copy
  for (Model& m : models) {
    m.init(3);
    INFO(m.summary());
    CHECK(reinterpret_cast<uintptr_t>(m.values().data()) % 256 == 0);
    CHECK(reinterpret_cast<uintptr_t>(m.grads().data()) % 256 == 0);
    std::vector<bool> data(size_t(m.num_params()), false);
    int64_t packed = 0;
    std::vector<const Param*> by_offset(m.params().begin(), m.params().end());
    std::sort(by_offset.begin(), by_offset.end(),
              [](const Param* a, const Param* b) { return a->offset < b->offset; });
    for (const Param* p : by_offset) {
      INFO(p->name);
      CHECK(p->offset % kFlatAlign == 0);
      CHECK(p->packed == packed);
      CHECK(m.layout().flat_index(p->packed) == p->offset);
      packed += numel(p->shape);
      std::fill_n(data.begin() + p->offset, numel(p->shape), true);
    }
    CHECK(m.layout().packed_params() == packed);
    CHECK(m.layout().flat_index(packed) == m.num_params());
    for (int64_t i = 0; i < m.num_params(); ++i)
      if (!data[size_t(i)]) REQUIRE(m.host_values()[i] == 0.0f);
    // Packed shards mapped to flat ones tile the buffer.
    int64_t sum = 0;
    for (int64_t c : m.layout().flat_counts({packed / 3, packed / 3, packed - 2 * (packed / 3)})) sum += c;
    CHECK(sum == m.num_params());
  }
}
